"""Storage that fails on purpose: a tf.io.gfile wrapper for checkpoint tests.

`FaultyStorage` wraps the tf.io.gfile functions that CheckpointStore and the
`components.storage` helpers call, and `tf.train.Checkpoint.write` / `read`
(TF's own checkpoint I/O runs in C++, out of Python's reach: the wrapper
raises what TF's filesystems raise, or damages what TF wrote). Each `Fault`
hits the Nth call of one kind of operation on a path under `under`, with a
transient error (`unavailable`, `deadline`, `reset`), a cut write
(`truncate`: half the bytes reach storage) or a slow one (`slow`). It records
every fault it injected and every path deleted.

`rewrite` damages a file already written (`halve`, `flip`), as storage or a
crash can after the fact.

Installed in this process (`with FaultyStorage(...)`) or, for a training
child process, through the HPM_TEST_STORAGE_FAULTS environment variable
(`to_json`), which `components.testing.trainer_testing` reads.
"""

import dataclasses
import json
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional

import tensorflow as tf

ENV = 'HPM_TEST_STORAGE_FAULTS'
# Operation kinds, and the gfile functions that count as each.
_KINDS = {'exists': 'stat', 'stat': 'stat', 'isdir': 'list',
          'listdir': 'list', 'rmtree': 'delete', 'remove': 'delete',
          'rename': 'rename', 'makedirs': 'makedirs'}
KINDS = ('read', 'write', 'stat', 'list', 'delete', 'rename', 'makedirs',
         'checkpoint_write', 'checkpoint_read')
ERRORS = ('unavailable', 'deadline', 'reset', 'truncate', 'slow')


@dataclasses.dataclass
class Fault:
  """`error` on calls number `nth` .. `nth + count - 1` of `kind`."""
  kind: str
  nth: int
  error: str = 'unavailable'
  count: int = 1
  slow_seconds: float = 0.2

  def __post_init__(self):
    if self.kind not in KINDS or self.error not in ERRORS:
      raise ValueError(f'Fault({self.kind!r}, error={self.error!r}): kind '
                       f'must be one of {KINDS}, error one of {ERRORS}.')


def _raise(error: str, what: str) -> None:
  message = f'injected {error} fault in {what}'
  if error == 'unavailable':
    raise tf.errors.UnavailableError(None, None, message)
  if error == 'deadline':
    raise tf.errors.DeadlineExceededError(None, None, message)
  raise ConnectionResetError(message)


def halve(content: bytes) -> bytes:
  """The first half of `content`: a cut write."""
  return content[:len(content) // 2]


def flip(position: float) -> Callable[[bytes], bytes]:
  """Damage that flips one byte at `position` (a fraction of the file)."""
  def flipped(content: bytes) -> bytes:
    at = min(len(content) - 1, int(len(content) * position))
    return content[:at] + bytes([content[at] ^ 0xFF]) + content[at + 1:]
  return flipped


def rewrite(path: str, damage: Callable[[bytes], bytes],
            open_file: Optional[Callable[..., Any]] = None,
            remove: Optional[Callable[[str], None]] = None) -> None:
  """Replaces the file at `path` with `damage(its content)`, through
  tf.io.gfile or the given `open_file` (GFile) and `remove`."""
  open_file = open_file or tf.io.gfile.GFile
  remove = remove or tf.io.gfile.remove
  with open_file(path, 'rb') as f:
    content = f.read()
  remove(path)  # TF's ram:// filesystem appends instead of replacing.
  with open_file(path, 'wb') as f:
    f.write(damage(content))


class _CutFile:
  """A writable GFile that lets half of what is written through."""

  def __init__(self, inner):
    self._inner = inner

  def write(self, data):
    return self._inner.write(data[:len(data) // 2])

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self._inner.close()
    return False

  def __getattr__(self, name):
    return getattr(self._inner, name)


class FaultyStorage:
  """Injects `faults` into storage calls on paths under `under`."""

  def __init__(self, under: str, faults: List[Fault]):
    self.under = under.rstrip('/')
    self.faults = list(faults)
    self.calls: Dict[str, int] = {kind: 0 for kind in KINDS}
    self.injected: List[Dict[str, Any]] = []
    self.deleted: List[str] = []
    self.opened_for_read: List[str] = []
    self._lock = threading.Lock()
    self._saved = {}

  # --- configuration through the environment (for child processes)

  def to_json(self) -> str:
    return json.dumps({'under': self.under,
                       'faults': [dataclasses.asdict(f) for f in self.faults]})

  @classmethod
  def from_json(cls, text: str) -> 'FaultyStorage':
    spec = json.loads(text)
    return cls(spec['under'], [Fault(**f) for f in spec['faults']])

  # --- the decision

  def _fault_for(self, kind: str, path: str) -> Optional[str]:
    """Counts this call; the error to inject, if any."""
    if not str(path).startswith(self.under):
      return None
    with self._lock:
      self.calls[kind] += 1
      number = self.calls[kind]
      for fault in self.faults:
        if fault.kind == kind and fault.nth <= number < fault.nth + fault.count:
          self.injected.append({'kind': kind, 'call': number,
                                'error': fault.error, 'path': str(path)})
          if fault.error == 'slow':
            time.sleep(fault.slow_seconds)
            return None
          return fault.error
    return None

  # --- the wrappers

  def _wrap_plain(self, name: str):
    inner = self._saved[name]
    kind = _KINDS[name]

    def wrapped(path, *args, **kwargs):
      error = self._fault_for(kind, path)
      if error and error != 'truncate':
        _raise(error, f'{name}({path})')
      result = inner(path, *args, **kwargs)
      if kind == 'delete':
        self.deleted.append(str(path))
      return result
    return wrapped

  def _wrap_gfile(self):
    inner = self._saved['GFile']

    def opened(path, mode='r'):
      kind = 'write' if ('w' in mode or 'a' in mode) else 'read'
      error = self._fault_for(kind, path)
      if kind == 'read' and str(path).startswith(self.under):
        self.opened_for_read.append(str(path))
      if error == 'truncate' and kind == 'write':
        return _CutFile(inner(path, mode))
      if error and error != 'truncate':
        _raise(error, f'GFile({path}, {mode!r})')
      return inner(path, mode)
    return opened

  def _wrap_checkpoint(self, name: str):
    inner = self._saved[name]
    kind = f'checkpoint_{name}'

    def wrapped(checkpoint, file_prefix, *args, **kwargs):
      error = self._fault_for(kind, file_prefix)
      if error and error != 'truncate':
        _raise(error, f'Checkpoint.{name}({file_prefix})')
      result = inner(checkpoint, file_prefix, *args, **kwargs)
      if error == 'truncate' and kind == 'checkpoint_write':
        # The store kept only part of the data file TF wrote.
        folder = os.path.dirname(file_prefix)
        data = sorted(n for n in self._saved['listdir'](folder)
                      if '.data-' in n)
        self._truncate(f'{folder}/{data[0]}')
      return result
    return wrapped

  def _truncate(self, path: str) -> None:
    """Halves a file, with the unwrapped functions (counts no calls)."""
    rewrite(path, halve, self._saved['GFile'], self._saved['remove'])

  def install(self) -> 'FaultyStorage':
    for name in _KINDS:
      self._saved[name] = getattr(tf.io.gfile, name)
    self._saved['GFile'] = tf.io.gfile.GFile
    self._saved['write'] = tf.train.Checkpoint.write
    self._saved['read'] = tf.train.Checkpoint.read
    for name in _KINDS:
      setattr(tf.io.gfile, name, self._wrap_plain(name))
    tf.io.gfile.GFile = self._wrap_gfile()
    tf.train.Checkpoint.write = self._wrap_checkpoint('write')
    tf.train.Checkpoint.read = self._wrap_checkpoint('read')
    return self

  def uninstall(self) -> None:
    for name in _KINDS:
      setattr(tf.io.gfile, name, self._saved[name])
    tf.io.gfile.GFile = self._saved['GFile']
    tf.train.Checkpoint.write = self._saved['write']
    tf.train.Checkpoint.read = self._saved['read']

  def __enter__(self) -> 'FaultyStorage':
    return self.install()

  def __exit__(self, *exc) -> bool:
    self.uninstall()
    return False
