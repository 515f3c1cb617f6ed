"""The console of a pipeline run reads as a progress report, not a log dump.

Every log record goes to a log file: TFX's node protos and artifact dicts,
Beam, TensorFlow, Python's warnings. The console shows when each component
started and how long it took (from TFX's own start and end records), the
`tfx_hpm` loggers' INFO lines (the trainer's progress) and every other
warning or error, except Python's warnings (library deprecation notices).
`verbose` puts everything on the console as well. Plain `logging` handlers:
absl logs through the standard `absl` logger.
"""

import logging
import sys
import time
from typing import Dict, Optional, TextIO, Tuple

from absl import logging as absl_logging

# Our components' loggers (components/trainer/progress.py's is one).
HPM_LOGGER = 'tfx_hpm'
FILE_FORMAT = ('%(asctime)s %(levelname).1s %(name)s %(filename)s:%(lineno)d] '
               '%(message)s')
# TFX's records of a component starting and ending, by their format string:
# LocalDagRunner says 'Component', BeamDagRunner 'node'.
_STARTED = ('Component %s is running.', 'node %s is running.')
_FINISHED = ('Component %s is finished.', 'node %s is finished.')


def _is_ours(record: logging.LogRecord) -> bool:
  return record.name == HPM_LOGGER or record.name.startswith(HPM_LOGGER + '.')


class ConsoleHandler(logging.StreamHandler):
  """Per component: started, its progress lines, done in N s."""

  def __init__(self, stream: Optional[TextIO] = None, verbose: bool = False):
    super().__init__(stream or sys.stderr)
    self.verbose = verbose
    self.setFormatter(logging.Formatter(FILE_FORMAT))
    self._node = None
    self._started: Dict[str, float] = {}

  def filter(self, record: logging.LogRecord) -> bool:
    if self.verbose or record.msg in _STARTED + _FINISHED or _is_ours(record):
      return super().filter(record)
    return (record.levelno >= logging.WARNING and
            record.name != 'py.warnings' and super().filter(record))

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
