"""The console of a pipeline run reads as a progress report, not a log dump.

Every log record goes to a log file: TFX's node protos and artifact dicts,
Beam, TensorFlow, Python's warnings. The console shows when each component
started and how long it took (from TFX's own start and end records), the
`tfx_hpm` loggers' INFO lines (the trainer's progress), warnings from our
own code and every error; TFX's, Beam's and TensorFlow's warnings are
counted, and kept in the file. `verbose` puts everything on the console as
well. Plain `logging` handlers: absl logs through the standard `absl` logger.

What bypasses logging, written straight to the process's file descriptors
(TensorFlow's C++ start-up lines, the module wheel that TFX builds with
setup.py, pip installing it), goes to the file too (`redirect_output`).
"""

import logging
import os
import sys
import time
from typing import Dict, Optional, TextIO, Tuple

from absl import logging as absl_logging

import components

# Our components' loggers (components/trainer/common/progress.py's is one).
HPM_LOGGER = 'tfx_hpm'
# Records logged from these folders are ours (absl logs every module's
# records through one logger, so its name does not tell).
_OUR_CODE = tuple(os.path.join(os.path.dirname(path), '')
                  for path in (components.__file__, __file__))
FILE_FORMAT = ('%(asctime)s %(levelname).1s %(name)s %(filename)s:%(lineno)d] '
               '%(message)s')
# TFX's records of a component starting and ending, by their format string:
# LocalDagRunner says 'Component', BeamDagRunner 'node'.
_STARTED = ('Component %s is running.', 'node %s is running.')
_FINISHED = ('Component %s is finished.', 'node %s is finished.')


def _is_hpm_logger(record: logging.LogRecord) -> bool:
  return record.name == HPM_LOGGER or record.name.startswith(HPM_LOGGER + '.')


def _shown(record: logging.LogRecord) -> bool:
  """Whether the report shows `record` (see the module docstring)."""
  if record.msg in _STARTED + _FINISHED or _is_hpm_logger(record):
    return True
  if record.levelno >= logging.ERROR:
    return True
  return (record.levelno >= logging.WARNING and
          record.pathname.startswith(_OUR_CODE))


class ConsoleHandler(logging.StreamHandler):
  """Per component: started, its progress lines, done in N s."""

  def __init__(self, stream: Optional[TextIO] = None, verbose: bool = False):
    super().__init__(stream or sys.stderr)
    self.verbose = verbose
    self.setFormatter(logging.Formatter(FILE_FORMAT))
    self._node = None
    self._started: Dict[str, float] = {}
    # Warnings of other libraries, only in the log file.
    self.warnings_in_file = 0

  def filter(self, record: logging.LogRecord) -> bool:
    if self.verbose or _shown(record):
      return super().filter(record)
    if record.levelno >= logging.WARNING:
      self.warnings_in_file += 1
    return False

  def format(self, record: logging.LogRecord) -> str:
    if self.verbose:
      return super().format(record)
    node = self._node
    if record.msg in _STARTED:
      node = self._node = str(record.args[0])
      self._started[node] = record.created
      text = 'started'
    elif record.msg in _FINISHED:
      node, self._node = str(record.args[0]), None
      took = record.created - self._started.get(node, record.created)
      text = f'done in {took:.1f} s'
    elif record.levelno >= logging.WARNING:
      text = f'{record.levelname}: {record.getMessage()}'
    else:
      text = record.getMessage()
    stamp = time.strftime('%H:%M:%S', time.localtime(record.created))
    line = f'{stamp} [{node}] {text}' if node else f'{stamp} {text}'
    if record.exc_info:
      line += '\n' + self.formatter.formatException(record.exc_info)
    return line


def configure(log_file: str, verbose: bool = False,
              stream: Optional[TextIO] = None
             ) -> Tuple[ConsoleHandler, logging.FileHandler]:
  """Sends every INFO record to `log_file` and the report to the console.

  Call it before TFX is imported: TFX configures a plain stderr handler on
  first use where the root logger has none. Returns the two handlers (on
  the root logger).
  """
  root = logging.getLogger()
  root.setLevel(logging.INFO)
  absl_logging.set_verbosity(absl_logging.INFO)
  logging.captureWarnings(True)
  file_handler = logging.FileHandler(log_file, encoding='utf-8')
  file_handler.setFormatter(logging.Formatter(FILE_FORMAT))
  console = ConsoleHandler(stream, verbose=verbose)
  root.addHandler(file_handler)
  root.addHandler(console)
  return console, file_handler


def redirect_output(log_file: str) -> None:
  """Sends what is written to file descriptors 1 and 2 to `log_file`.

  TensorFlow's C++ logs and the children TFX starts without capturing
  their output (setup.py building the module wheel, pip installing it)
  write there directly. Python's `sys.stdout` and `sys.stderr` move to
  copies of the original descriptors, so the report, the summary and any
  traceback still reach the console.
  """
  for stream in (sys.stdout, sys.stderr):
    stream.flush()
  console_out, console_err = os.dup(1), os.dup(2)
  log_fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
  os.dup2(log_fd, 1)
  os.dup2(log_fd, 2)
  os.close(log_fd)
  sys.stdout = os.fdopen(console_out, 'w', buffering=1)
  sys.stderr = os.fdopen(console_err, 'w', buffering=1)
