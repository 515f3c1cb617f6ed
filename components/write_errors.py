"""How a location says it cannot take a write: full, or read-only.

By errno, or in words: TF and Beam pass the OS's text on inside errors of
their own. Shared by the trainer's failure classes and the transform's
output errors. No TensorFlow import.
"""

import errno
from typing import Optional, Tuple

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXT = ('No space left on device', 'Disk quota exceeded')
_READ_ONLY_TEXT = 'Read-only file system'


def is_full(error: BaseException) -> bool:
  return (isinstance(error, OSError) and error.errno in _FULL_ERRNOS) or any(
      text in str(error) for text in _FULL_TEXT)


def is_read_only(error: BaseException) -> bool:
  return (isinstance(error, OSError) and error.errno == errno.EROFS) or (
      _READ_ONLY_TEXT in str(error))


def location_problem(error: BaseException) -> Optional[Tuple[int, str]]:
  """(errno, 'is full' or 'is read-only') where `error` or one of its causes
  says its location cannot take a write; None otherwise."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if is_full(error):
      return errno.ENOSPC, 'is full'
    if is_read_only(error):
      return errno.EROFS, 'is read-only'
    error = error.__cause__ or error.__context__
  return None
