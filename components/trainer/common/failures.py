"""Which failures a relaunch can cure, and what to tell the user otherwise.

`CLASSES` is the one table: a training process classifies the exception that
ended it (`classify`); for a failure no relaunch can cure (corrupt or missing
data, a full, read-only or forbidden location, a base model that does not
fit, a setting the model cannot train with, another run's lease) it writes one
`FAILURE_MARK` line naming the class and what to fix, and exits
NOT_RETRYABLE_EXIT_CODE; the supervisor then fails at once with that line's
message first (`read_record`). Anything else (a lost worker, a preemption, a
throttled or unreachable store, a timeout) is transient: the cluster is
relaunched from its last checkpoint while `max_restarts` lasts. No TensorFlow
import: TF's errors are told apart by class name, OS errors by errno.
"""

import dataclasses
import errno
import json
import re
from typing import Callable, Optional, Tuple

from components import write_errors

# The line a process writes before exiting NOT_RETRYABLE_EXIT_CODE.
FAILURE_MARK = 'tfx-hpm failure: '


@dataclasses.dataclass(frozen=True)
class FailureClass:
  """A kind of failure: its name, whether a relaunch can help, and what the
  user should do."""
  name: str
  retry: bool
  advice: str


CORRUPT_DATA = FailureClass(
    'corrupt_data', False,
    'Replace the damaged file (e.g. copy it again, or rerun the component '
    'that wrote it); a relaunch would read the same bytes.')
MISSING_FILE = FailureClass(
    'missing_file', False,
    'Restore the file, or rerun the component that writes it.')
STORAGE_FULL = FailureClass(
    'storage_full', False,
    'Free space there, or point the output elsewhere (checkpoints: '
    'fault_tolerance.backup_root); a rerun resumes from the last good '
    'checkpoint.')
STORAGE_READ_ONLY = FailureClass(
    'storage_read_only', False,
    'Make the location writable, or point the output elsewhere; a rerun '
    'resumes from the last good checkpoint.')
PERMISSION_DENIED = FailureClass(
    'permission_denied', False,
    "Grant this job's account access to the location.")
BAD_BASE_MODEL = FailureClass(
    'bad_base_model', False,
    'Warm-start from a model of the same architecture, or drop base_model.')
LEASE_HELD = FailureClass(
    'lease_held', False,
    'Another run trains into this checkpoint folder: wait for it, stop it, '
    "or use fault_tolerance lease='wait'.")
BAD_CONFIG = FailureClass(
    'bad_config', False,
    'Change the setting or the module as the message says; a relaunch '
    'would fail the same way.')
TRANSIENT = FailureClass(
    'transient', True,
    'The cluster is relaunched from its last checkpoint while max_restarts '
    'lasts.')

class TrainingConfigError(ValueError):
  """A setting or module that this training cannot run as it is (found
  only in the training process, e.g. once the model is built)."""


_FILE_NOT_FOUND_TEXT = ('No such file or directory', 'gs://', 's3://')
_TF_FUNCTION_PREFIX = re.compile(r'\{\{function_node [^}]*\}\}\s*')
_TF_HEADERS = ('Graph execution error', 'Detected at node')


def _names(error: BaseException) -> Tuple[str, ...]:
  return tuple(cls.__name__ for cls in type(error).__mro__)


def _has_errno(error: BaseException, numbers) -> bool:
  return isinstance(error, OSError) and error.errno in numbers


# In order: the first rule that matches an error (or its cause) decides.
CLASSES: Tuple[Tuple[FailureClass, Callable[[BaseException], bool]], ...] = (
    (LEASE_HELD, lambda e: 'LeaseHeldError' in _names(e)),
    (BAD_BASE_MODEL, lambda e: 'WarmStartError' in _names(e)),
    (BAD_CONFIG, lambda e: isinstance(e, TrainingConfigError)),
    (CORRUPT_DATA, lambda e: 'DataLossError' in _names(e) or (
        'ShardChangedError' in _names(e))),
    (STORAGE_FULL, write_errors.is_full),
    (STORAGE_READ_ONLY, write_errors.is_read_only),
    (PERMISSION_DENIED, lambda e: _has_errno(e, (errno.EACCES, errno.EPERM))
     or 'PermissionDeniedError' in _names(e)),
    # A file, not another kind of resource (a restarted parameter server
    # reports its lost variables as NotFound too, and a relaunch cures it).
    (MISSING_FILE, lambda e: _has_errno(e, (errno.ENOENT,)) or (
        'NotFoundError' in _names(e) and any(
            text in str(e) for text in _FILE_NOT_FOUND_TEXT))),
)
BY_NAME = {c.name: c for c, _ in CLASSES + ((TRANSIENT, None),)}
# How a location that cannot take a write says so: its errno and words.
LOCATION_PROBLEMS = {
    STORAGE_FULL: (errno.ENOSPC, 'is full'),
    STORAGE_READ_ONLY: (errno.EROFS, 'is read-only'),
    PERMISSION_DENIED: (errno.EACCES, 'cannot be written by this job'),
}


def classify(error: BaseException) -> FailureClass:
  """The class of `error`, looking through its causes; TRANSIENT if none."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    for failure_class, matches in CLASSES:
      if matches(error):
        return failure_class
    error = error.__cause__ or error.__context__
  return TRANSIENT


def record_line(failure_class: FailureClass, message: str) -> str:
  """The FAILURE_MARK line a process writes before it exits."""
  return FAILURE_MARK + json.dumps({'class': failure_class.name,
                                    'message': message})


def read_record(log_tail: str) -> Optional[Tuple[FailureClass, str]]:
  """The class and message of the last FAILURE_MARK line in a log, if any."""
  for line in reversed(log_tail.splitlines()):
    _, mark, record = line.partition(FAILURE_MARK)
    if not mark:
      continue
    try:
      values = json.loads(record)
      return BY_NAME[values['class']], values['message']
    except (ValueError, KeyError, TypeError):
      return None
  return None


def short_text(error: BaseException) -> str:
  """The error's own first line: without TF's `{{function_node ...}}`
  prefix, and past a graph execution error's header and stack."""
  text = _TF_FUNCTION_PREFIX.sub('', str(error)).strip()
  lines = [line for line in text.splitlines()
           if line.strip() and not line.startswith((' ', '\t'))
           and not line.startswith(_TF_HEADERS)]
  return lines[0] if lines else type(error).__name__


def describe(failure_class: FailureClass, where: str) -> str:
  """What broke, where, and what to do, in one message."""
  return f'{where} ({failure_class.name}: not retried). {failure_class.advice}'
