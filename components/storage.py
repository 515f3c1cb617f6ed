"""Artifact I/O on any `tf.io.gfile` filesystem: local, gs://, s3://, ram://.

Kubeflow runs put every artifact on an object store, where a folder cannot be
renamed, an object is published only when its upload completes, and nothing
on it can be handed to a child process as an open file. The components
therefore read and write artifacts only through these helpers, keep what must
be local (a log being written, a task file) in a local folder, and upload it
when complete. No TFX import: training processes use it too.
"""

import dataclasses
import json
import os
import shutil
import threading
import uuid
from typing import Any, Callable, List, Optional, Tuple, TypeVar

from absl import logging
import tenacity
import tensorflow as tf

_LOCAL_SCHEMES = ('', 'file')
# TF's in-memory filesystem (the tests' stand-in for an object store) appends
# to an existing file opened for writing instead of replacing it.
_APPENDING_SCHEME = 'ram://'
# What read_text asks for at once: TF's GFile read buffer.
_READ_CHUNK = 512 * 1024


# Errors that say "try again", not "this is wrong": what TF's filesystems
# raise for an unreachable or throttled store (its GCS client maps a reset
# connection or a 5xx answer to UnavailableError) and what Python raises for
# a reset socket or a timeout.
TRANSIENT_ERRORS = (tf.errors.UnavailableError,
                    tf.errors.DeadlineExceededError, tf.errors.AbortedError,
                    ConnectionError, TimeoutError)

_T = TypeVar('_T')


class StorageNotWritableError(OSError):
  """A path the component must write to cannot be written."""


class ExplainedOSError(OSError):
  """An OS error (its errno classifies it) whose message says what broke,
  where, and what is kept, without an `[Errno N]` prefix."""

  def __init__(self, number: int, message: str):
    super().__init__(number, message)
    self.message = message

  def __str__(self) -> str:
    return self.message


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
  """Exponential backoff for transient storage errors.

  The defaults wait 0.5, 1, 2, 4 and 8 s (plus up to 0.5 s of jitter, so
  that workers do not retry in lockstep): about 16 s, longer than a typical
  object-store hiccup, short enough that a dead store fails the attempt.
  """
  attempts: int = 6
  first_delay_s: float = 0.5
  max_delay_s: float = 8.0


def retrying(fn: Callable[[], _T], what: str,
             policy: RetryPolicy = RetryPolicy(),
             on_retry: Optional[Callable[[str, BaseException], None]] = None
            ) -> _T:
  """`fn()`, retried on TRANSIENT_ERRORS; the last error propagates.

  `on_retry(what, error)` is called before each wait (to count and report
  retries); any other error propagates at once.
  """

  def before_sleep(state: tenacity.RetryCallState) -> None:
    error = state.outcome.exception()
    logging.warning('Transient storage error in %s (attempt %d of %d), '
                    'retrying: %s: %s', what, state.attempt_number,
                    policy.attempts, type(error).__name__, error)
    if on_retry:
      on_retry(what, error)

  return tenacity.Retrying(
      retry=tenacity.retry_if_exception_type(TRANSIENT_ERRORS),
      stop=tenacity.stop_after_attempt(policy.attempts),
      wait=tenacity.wait_exponential_jitter(
          initial=policy.first_delay_s, max=policy.max_delay_s,
          jitter=policy.first_delay_s),
      before_sleep=before_sleep, reraise=True)(fn)


def is_local(path: str) -> bool:
  """True for a plain path or file:// URI, False for gs://, s3://, ram://."""
  scheme, sep, _ = path.partition('://')
  return not sep or scheme in _LOCAL_SCHEMES


def free_bytes(path: str) -> int:
  """Free bytes of the local file system holding `path` (or its nearest
  existing parent)."""
  path = path.partition('://')[2] if '://' in path else path
  while path and not os.path.exists(path):
    parent = os.path.dirname(path.rstrip('/'))
    if parent == path:
      break
    path = parent
  return shutil.disk_usage(path or '/').free


def is_process_local(path: str) -> bool:
  """True where other processes cannot see the files (TF's ram://)."""
  return path.startswith(_APPENDING_SCHEME)


def write_text(path: str, text: str, atomic: bool = False) -> None:
  """Writes `text`; `atomic`: readers see old or new, never half.

  An object store publishes an object only once its upload completes, so a
  plain write is already atomic there (and a rename would be a copy plus a
  delete); a local file is written next to the target and renamed over it,
  and so is every ram:// file (that filesystem appends on rewrite, and
  removing the old file first left a moment where readers found none).
  """
  tf.io.gfile.makedirs(os.path.dirname(path))
  if (atomic and is_local(path)) or path.startswith(_APPENDING_SCHEME):
    temp = f'{path}.tmp-{uuid.uuid4().hex}'
    with tf.io.gfile.GFile(temp, 'w') as f:
      f.write(text)
    tf.io.gfile.rename(temp, path, overwrite=True)
    return
  with tf.io.gfile.GFile(path, 'w') as f:
    f.write(text)


def read_text(path: str) -> str:
  """The file's text, read to its end.

  Not `GFile.read()`: that asks the size first and then reads that many
  bytes, two requests to an object store; an object rewritten longer in
  between (the chief appending to events.json while a worker reads it) came
  back cut to the old length. A read to the end is one request per
  _READ_CHUNK, so a record smaller than that is one version, whole.
  """
  chunks = []
  with tf.io.gfile.GFile(path, 'r') as f:
    while True:
      chunk = f.read(_READ_CHUNK)
      if not chunk:
        return ''.join(chunks)
      chunks.append(chunk)


def write_json(path: str, value: Any, atomic: bool = False) -> None:
  """Writes `value` as JSON (`atomic` as in `write_text`)."""
  write_text(path, json.dumps(value, sort_keys=True, indent=1, default=str),
             atomic)


def read_json(path: str) -> Optional[Any]:
  """The JSON at `path`, or None where there is no such file."""
  if not tf.io.gfile.exists(path):
    return None
  return json.loads(read_text(path))


def upload_tree(local_dir: str, destination: str) -> None:
  """Copies a local folder's files to `destination` (any filesystem)."""
  for root, _, files in os.walk(local_dir):
    relative = os.path.relpath(root, local_dir)
    target_dir = (destination if relative == '.' else
                  os.path.join(destination, relative))
    tf.io.gfile.makedirs(target_dir)
    for name in files:
      tf.io.gfile.copy(os.path.join(root, name),
                       os.path.join(target_dir, name), overwrite=True)


def check_writable(path: str, what: str,
                   timeout_s: Optional[float] = None) -> None:
  """Writes and removes a probe object under `path`; fails naming both.

  Called before the expensive part of a component, so that a pipeline root
  or checkpoint root that cannot be written fails at once, not after
  training. With `timeout_s`, a storage that does not answer in time fails
  too: TF's GCS client retries some errors without end (a bucket that does
  not exist answers 404 to every directory creation).
  """
  failure = []

  def probe():
    target = os.path.join(path, f'.hpm-write-probe-{uuid.uuid4().hex}')
    try:
      tf.io.gfile.makedirs(path)
      with tf.io.gfile.GFile(target, 'w') as f:
        f.write('probe')
      tf.io.gfile.remove(target)
    except (tf.errors.OpError, OSError) as e:
      failure.append(f'{type(e).__name__}: {e}')

  if timeout_s is None:
    probe()
  else:
    worker = threading.Thread(target=probe, name='hpm-write-probe',
                              daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
      failure.append(f'no answer in {timeout_s:g} s (does the bucket exist?)')
  if failure:
    raise StorageNotWritableError(
        f'Cannot write the {what} at {path!r}: {failure[0]}')


def newest_first(paths: List[str]) -> List[str]:
  """`paths` in TFX's `<...>/<execution id>/<file>` layout by modification
  time, newest first (unreadable ones last).

  tf.io.gfile reports local mtimes in whole seconds, so files written within
  one second tie; the larger TFX execution id (MLMD gives out increasing ids)
  is the newer one.
  """
  def age_key(path: str) -> Tuple[int, int]:
    try:
      mtime = tf.io.gfile.stat(path).mtime_nsec
    except tf.errors.OpError:
      mtime = -1
    execution = os.path.basename(os.path.dirname(path.rstrip('/')))
    return mtime, int(execution) if execution.isdigit() else -1
  return sorted(paths, key=age_key, reverse=True)
