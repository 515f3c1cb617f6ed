"""The end of a training process's log, as a failure shows it: without the
start-up messages every TensorFlow process prints, whatever went wrong later.
No TensorFlow import.
"""

import collections
import os
import re
from typing import Iterable, Iterator

TAIL_LINES = 40
# What every TensorFlow process prints as it starts, whatever went wrong
# later: kept out of the log tail of a failure.
_TF_STARTUP = re.compile('|'.join([
    r'Unable to register cu(FFT|DNN|BLAS) factory',
    r'oneDNN custom operations are on',
    r'This TensorFlow binary is optimized to use available CPU instructions',
    r'rebuild TensorFlow with the appropriate compiler flags',
    r'TF-TRT Warning: Could not find TensorRT',
    r'Could not find cuda drivers on your machine',
    r'All log messages before absl::InitializeLog\(\) is called',
]))
_PYTHON_WARNING = re.compile(r':\d+: (FutureWarning|DeprecationWarning): ')


def without_startup_noise(lines: Iterable[str]) -> Iterator[str]:
  """`lines` less TensorFlow's start-up messages and Python's Future- and
  DeprecationWarnings (each with the source line printed under it)."""
  warning_source = False
  for line in lines:
    if warning_source and line.startswith((' ', '\t')):
      warning_source = False
      continue
    warning_source = bool(_PYTHON_WARNING.search(line))
    if not warning_source and not _TF_STARTUP.search(line):
      yield line


def read_tail(path: str, lines: int = TAIL_LINES) -> str:
  """The last `lines` lines of a (possibly large) log file, without the
  start-up noise that would fill them (the file keeps everything)."""
  try:
    with open(path, 'rb') as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - 256 * 1024))
      text = f.read().decode('utf-8', errors='replace')
  except FileNotFoundError:
    return ''
  return '\n'.join(collections.deque(
      without_startup_noise(text.splitlines()), maxlen=lines))
