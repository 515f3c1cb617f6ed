"""Crash-safe, verifiable training checkpoints in a location that survives TFX.

TFX gives every execution fresh output URIs and deletes its stateful working
dir, so a restarted Trainer cannot find the previous attempt's checkpoints
there. `stable_checkpoint_dir` derives the location from the pipeline, the
node and a fingerprint of the inputs and training config instead: re-running
the same training finds its checkpoints, a changed input or config gets a new,
empty directory (and `CheckpointStore.other_fingerprints` says what was there).

Layout of one checkpoint directory (any `tf.io.gfile` filesystem):

  ckpt-000000000120/          the checkpoint after 120 optimizer steps
    ckpt.index, ckpt.data-*   tf.train.Checkpoint.write output
    MANIFEST.json             step, every file's size, the index's sha256
  LEASE.json                  which run may write, prune and delete here
  events.json                 resume events of every attempt (chief only)
  progress.json               last step reached, so a restart knows what it lost,
                              with the progress the launcher logs (progress.py)

The manifest is the commit point: it is written last, atomically
(`storage.write_json`: an object store publishes an object only when its
upload completes; a local file is renamed over the target), so a crash
mid-write leaves a directory without a manifest, which is never restored.
Directory renames are avoided on purpose: object stores cannot rename a
folder atomically (TF's GCS plugin cannot rename one at all).

Saving does not read back what it wrote: the manifest records every file's
size and the sha256 of the small index file, whose entries carry each
tensor's crc32c, which TF checks on every restore. Restore checks sizes and
the index hash, then reads; a checkpoint is deleted only on proof of damage
(a size or hash that does not match, or a checksum TF finds wrong twice).
A transient storage error is retried with backoff and deletes nothing; a
checkpoint that does not fit the model (its structure changed) is an error
that keeps every checkpoint.

Only the holder of the folder's lease saves, prunes or deletes there, so two
runs of the same training (same pipeline, node and fingerprint) cannot delete
each other's checkpoints; see `CheckpointLease` for what that guarantees on
stores without an atomic create-if-absent.
"""

import dataclasses
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional
import uuid

from absl import logging
import tensorflow as tf

from components import storage
from components.json_config import JsonConfig, is_int

MANIFEST_NAME = 'MANIFEST.json'
LEASE_NAME = 'LEASE.json'
EVENTS_NAME = 'events.json'
PROGRESS_NAME = 'progress.json'
CHECKPOINT_PREFIX = 'ckpt'
INDEX_NAME = CHECKPOINT_PREFIX + '.index'
_CHECKPOINT_DIR = re.compile(r'^ckpt-(\d{12})$')
# What tf.train.Checkpoint.write publishes (not the leftovers of a retried
# write).
_CHECKPOINT_FILE = re.compile(r'^ckpt\.(index|data-\d{5}-of-\d{5})$')
# 1: every file's sha256; 2: sizes, and the sha256 of the index only.
_MANIFEST_VERSION = 2
LEASE_MODES = ('fail', 'wait')
# A lease whose heartbeat is older than this many intervals is taken over.
LEASE_STALE_HEARTBEATS = 3
_HASH_CHUNK_BYTES = 4 * 1024 * 1024
_SAFE_NAME = re.compile(r'[^A-Za-z0-9._-]+')


@dataclasses.dataclass
class CheckpointConfig(JsonConfig):
  """When and how HighPerfTrainer checkpoints (one JSON exec property).

  Attributes:
    backup_root: Root of the stable checkpoint location (local path, gs://,
      hdfs://, ...). None lets the executor pick a default under the pipeline
      root.
    save_every_steps: Checkpoint every this many optimizer steps (None: not by
      steps).
    save_every_seconds: Checkpoint when this much time passed since the last
      one (None: not by time). Both may be set; whichever comes first. For
      fast steps prefer time: saving every 100 steps of 1.1 ms added 40% to
      the taxi model's training time here.
    keep_last: Published checkpoints kept; older ones are deleted.
    delete_after_export: Remove the checkpoints once the model is exported.
    max_restarts: Times the local launcher restarts a failed cluster.
    lease: What a run does when another live run holds the checkpoint
      folder's lease: 'fail' at once, or 'wait' for it (up to
      lease_timeout_seconds).
    lease_timeout_seconds: How long lease='wait' waits.
    lease_heartbeat_seconds: How often the holder refreshes the lease; a
      lease not refreshed for LEASE_STALE_HEARTBEATS intervals is stale and
      taken over.
  """
  OPTIONS_NAME = 'fault_tolerance'
  backup_root: Optional[str] = None
  save_every_steps: Optional[int] = 100
  save_every_seconds: Optional[float] = None
  keep_last: int = 3
  delete_after_export: bool = True
  max_restarts: int = 2
  lease: str = 'fail'
  lease_timeout_seconds: float = 600.0
  lease_heartbeat_seconds: float = 10.0

  def validate(self) -> 'CheckpointConfig':
    """Raises ValueError naming the bad value and what is allowed."""
    if self.backup_root is not None and (
        not isinstance(self.backup_root, str) or not self.backup_root.strip()):
      raise ValueError(f'backup_root={self.backup_root!r} must be a non-empty '
                       'path or URI (local, gs://, hdfs://, ...) or None.')
    if self.save_every_steps is not None and not is_int(
        self.save_every_steps, minimum=1):
      raise ValueError(f'save_every_steps={self.save_every_steps!r} must be an '
                       'integer >= 1 or None.')
    if self.save_every_seconds is not None and (
        isinstance(self.save_every_seconds, bool) or
        not isinstance(self.save_every_seconds, (int, float)) or
        not self.save_every_seconds > 0):
      raise ValueError(f'save_every_seconds={self.save_every_seconds!r} must '
                       'be a number > 0 or None.')
    if not is_int(self.keep_last, minimum=1):
      raise ValueError(f'keep_last={self.keep_last!r} must be an integer >= 1 '
                       '(the newest checkpoint is always kept).')
    if not is_int(self.max_restarts, minimum=0):
      raise ValueError(f'max_restarts={self.max_restarts!r} must be an integer '
                       '>= 0.')
    if not isinstance(self.delete_after_export, bool):
      raise ValueError(f'delete_after_export={self.delete_after_export!r} must '
                       'be True or False.')
    if self.lease not in LEASE_MODES:
      raise ValueError(f'lease={self.lease!r} must be one of {LEASE_MODES}.')
    for name in ('lease_timeout_seconds', 'lease_heartbeat_seconds'):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(
          value, (int, float)) or not value > 0:
        raise ValueError(f'{name}={value!r} must be a number > 0.')
    return self



def training_fingerprint(input_uris: Dict[str, Any],
                         training_config: Dict[str, Any]) -> str:
  """A short hash naming one training: same inputs and config, same name.

  Args:
    input_uris: Input artifact URIs by name (e.g. examples, transform graph).
      TFX reuses a cached artifact's URI, so an unchanged upstream keeps it.
    training_config: Everything that changes the training trajectory: module
      file contents (or hash), hparams, train steps, distribution and input
      pipeline configs. Leave out checkpoint cadence, which does not.
  """
  canonical = json.dumps({'inputs': input_uris, 'config': training_config},
                         sort_keys=True, default=str, separators=(',', ':'))
  return hashlib.sha256(canonical.encode('utf-8')).hexdigest()[:16]


def stable_checkpoint_dir(backup_root: str, pipeline_name: str, node_id: str,
                          fingerprint: str) -> str:
  """`<backup_root>/<pipeline>/<node>/<fingerprint>` on any gfile filesystem."""
  parts = {'backup_root': backup_root, 'pipeline_name': pipeline_name,
           'node_id': node_id, 'fingerprint': fingerprint}
  for name, value in parts.items():
    if not isinstance(value, str) or not value.strip():
      raise ValueError(f'{name}={value!r} must be a non-empty string.')
  names = [_SAFE_NAME.sub('_', v) for v in (pipeline_name, node_id,
                                             fingerprint)]
  return '/'.join([backup_root.rstrip('/')] + names)


class CorruptCheckpointError(Exception):
  """Proof that a checkpoint is damaged: it does not match its manifest (or
  has none), or TF found its data's checksums wrong."""


class CheckpointStorageError(OSError):
  """Checkpoints could not be read or written; nothing was deleted."""


class CheckpointMismatchError(ValueError):
  """A good checkpoint does not fit the model: its structure changed."""


class LeaseHeldError(RuntimeError):
  """Another live run holds the checkpoint folder's lease."""


class LeaseLostError(RuntimeError):
  """This run's lease was taken over: it must not prune or delete."""


@dataclasses.dataclass
class RestoreResult:
  """What `CheckpointStore.restore_latest` restored, and what it skipped."""
  step: int
  path: str
  # [{'path', 'reason', 'deleted'}] for newer checkpoints proven damaged.
  skipped: List[Dict[str, Any]]


def _join(*parts: str) -> str:
  return '/'.join([parts[0].rstrip('/')] + [p.strip('/') for p in parts[1:]])


def _sha256(path: str) -> str:
  digest = hashlib.sha256()
  with tf.io.gfile.GFile(path, 'rb') as f:
    while True:
      chunk = f.read(_HASH_CHUNK_BYTES)
      if not chunk:
        return digest.hexdigest()
      digest.update(chunk)


# How TF reports data that does not match its index: a DataLossError naming
# the tensor whose crc32c differs, the same text on a plain OpError (the
# object graph is read by another path), and OutOfRange (an IndexError from
# that path) for a data file shorter than the index says.
_CHECKSUM_MESSAGE = 'Checksum does not match'


def _is_tf_damage(error: BaseException) -> bool:
  return isinstance(error, (tf.errors.DataLossError, tf.errors.OutOfRangeError,
                            IndexError)) or _CHECKSUM_MESSAGE in str(error)


def _pid_alive(pid: Any) -> bool:
  if not isinstance(pid, int) or pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # Another user's process: alive.
  return True


_SAME_RUN = 'held by an earlier attempt of this run'


def _describe(holder: Dict[str, Any]) -> str:
  return (f"run {holder.get('run_id')!r} (pid {holder.get('pid')} on "
          f"{holder.get('host')})")


class CheckpointLease:
  """The right to save, prune and delete in one checkpoint folder.

  The lease is a JSON object in the folder naming its holder (host, pid, run
  id, a token per acquisition) with a heartbeat time that a background thread
  refreshes. A lease is free when absent, unreadable, stale (heartbeat older
  than LEASE_STALE_HEARTBEATS intervals, by this host's clock: hosts'
  clocks must agree to well within that), held by a dead process on this
  host, or held by an earlier attempt of the same run: a launcher restart or
  executor retry gets the same run id (the model_run URI), while another
  execution of the same training gets another one and must wait or fail.

  Not every store can create an object only if it is absent (tf.io.gfile
  cannot ask GCS for it), so acquiring writes the lease and reads it back.
  The race accepted: two runs that find the lease free at the same moment
  may both read back their own write before the other's lands. The object
  then names one of them; the other finds the other token at its next check,
  which comes before every prune or delete and at every heartbeat, and stops
  there. The same holds for a holder that stalled past the stale time and
  comes back (its heartbeat reads before it writes). So a deletion can only
  slip through in the moment between one such check and the deletion it
  guards.
  """

  def __init__(self, directory: str, run_id: str, heartbeat_seconds: float,
               io: Callable[..., Any]):
    self.path = _join(directory, LEASE_NAME)
    self.holder = {'run_id': run_id, 'host': socket.gethostname(),
                   'pid': os.getpid(), 'token': uuid.uuid4().hex}
    self._heartbeat_seconds = float(heartbeat_seconds)
    self._io = io
    # The heartbeat and the checks run in two threads; on a store that
    # replaces an object by delete + write (ram://) a check between the two
    # would find no lease.
    self._lock = threading.Lock()
    self._acquired = None
    self._stop = threading.Event()
    self._thread = None
    self.lost: Optional[str] = None

  @property
  def stale_after_seconds(self) -> float:
    return LEASE_STALE_HEARTBEATS * self._heartbeat_seconds

  def read(self) -> Optional[Dict[str, Any]]:
    """The lease object; {} where it cannot be parsed; None where absent."""
    try:
      lease = self._io('read lease', storage.read_json, self.path)
    except ValueError:
      return {}
    return lease if lease is None or isinstance(lease, dict) else {}

  def _write(self) -> None:
    with self._lock:
      self._io('write lease', storage.write_json, self.path, {
          **self.holder, 'acquired': self._acquired,
          'heartbeat': time.time(),
          'heartbeat_seconds': self._heartbeat_seconds}, True)

  def _free_because(self, lease: Optional[Dict[str, Any]]) -> Optional[str]:
    """Why `lease` may be taken, or None where a live run holds it."""
    if lease is None:
      return 'free'
    if not lease.get('token'):
      return 'unreadable lease'
    if lease.get('run_id') == self.holder['run_id']:
      return _SAME_RUN
    if lease.get('host') == self.holder['host'] and not _pid_alive(
        lease.get('pid')):
      return f"its holder (pid {lease.get('pid')}) is gone"
    age = time.time() - float(lease.get('heartbeat') or 0)
    stale = LEASE_STALE_HEARTBEATS * float(
        lease.get('heartbeat_seconds') or self._heartbeat_seconds)
    if age > stale:
      return f'its heartbeat is {age:.0f} s old (stale after {stale:.0f} s)'
    return None

  def _held_message(self, lease: Dict[str, Any], mode: str,
                    waited: float) -> str:
    age = time.time() - float(lease.get('heartbeat') or 0)
    what = (f'still holds it after {waited:.0f} s of waiting '
            '(lease_timeout_seconds)' if mode == 'wait' else 'holds it')
    return (f'Another run is training into the checkpoint folder '
            f'{self.path.rsplit("/", 1)[0]}: {_describe(lease)} {what}, '
            f'heartbeat {age:.0f} s ago. Two runs of the same training (same '
            'pipeline, node and fingerprint) would prune each other\'s '
            'checkpoints. Let it finish or stop it, or set '
            "fault_tolerance.lease='wait'; a lease whose heartbeat is older "
            f'than {self.stale_after_seconds:.0f} s, or whose holder died on '
            'this host, is taken over.')

  def acquire(self, mode: str, timeout_seconds: float
             ) -> Optional[Dict[str, Any]]:
    """Takes the lease (waiting per `mode`); returns the event to record.

    Raises LeaseHeldError where a live run holds it (at once for 'fail',
    after `timeout_seconds` for 'wait').
    """
    if mode not in LEASE_MODES:
      raise ValueError(f'lease={mode!r} must be one of {LEASE_MODES}.')
    began = time.monotonic()
    first_holder = None
    while True:
      current = self.read()
      reason = self._free_because(current)
      waited = time.monotonic() - began
      if reason is None:
        if mode == 'fail' or waited >= timeout_seconds:
          raise LeaseHeldError(self._held_message(current, mode, waited))
        if not first_holder:
          logging.warning('Waiting for the checkpoint lease held by %s (up '
                          'to %.0f s).', _describe(current), timeout_seconds)
        first_holder = first_holder or current
        time.sleep(min(self._heartbeat_seconds, timeout_seconds - waited))
        continue
      self._acquired = time.time()
      self._write()
      if (self.read() or {}).get('token') != self.holder['token']:
        continue  # Another run's write landed after ours: look again.
      self._thread = threading.Thread(target=self._beat, name='hpm-lease',
                                      daemon=True)
      self._thread.start()
      logging.info('Holding the checkpoint lease %s (%s).', self.path, reason)
      if reason == _SAME_RUN:
        return None  # A restart of this run: its 'resumed' event says so.
      if reason != 'free':
        return {'event': 'lease_taken_over', 'reason': reason,
                'previous_holder': current, 'waited_seconds': round(waited, 3),
                'time': time.time()}
      if first_holder:
        return {'event': 'lease_waited', 'previous_holder': first_holder,
                'waited_seconds': round(waited, 3), 'time': time.time()}
      return None

  def _beat(self) -> None:
    while not self._stop.wait(self._heartbeat_seconds):
      try:
        if not self._check():
          return
        self._write()
      except (tf.errors.OpError, OSError) as e:
        logging.warning('Could not refresh the checkpoint lease %s: %s',
                        self.path, e)

  def _check(self) -> bool:
    """Whether the lease still names us (else records who has it)."""
    with self._lock:
      current = self.read()
    if current and current.get('token') == self.holder['token']:
      return True
    self.lost = ('the lease was taken over by ' + _describe(current)
                 if current else 'the lease object disappeared')
    logging.error('Lost the checkpoint lease %s: %s.', self.path, self.lost)
    return False

  def ensure_held(self) -> None:
    """Raises LeaseLostError unless the lease still names this run."""
    if self._acquired is None:
      raise RuntimeError(f'The checkpoint lease {self.path} was never '
                         'acquired (call acquire_lease first).')
    if self.lost or not self._check():
      raise LeaseLostError(
          f'This run no longer holds the checkpoint lease {self.path}: '
          f'{self.lost}. It stops rather than prune or delete checkpoints '
          'another run now owns (its heartbeats failed for longer than '
          f'{self.stale_after_seconds:.0f} s?).')

  def stop(self) -> None:
    self._stop.set()
    if self._thread:
      self._thread.join()

  def release(self) -> None:
    """Stops the heartbeat and removes the lease where it still names us."""
    self.stop()
    if self._acquired is None:
      return
    try:
      if (self.read() or {}).get('token') == self.holder['token']:
        self._io('remove lease', tf.io.gfile.remove, self.path)
    except (tf.errors.OpError, OSError) as e:
      logging.warning('Could not remove the checkpoint lease %s (it goes '
                      'stale in %.0f s): %s', self.path,
                      self.stale_after_seconds, e)


class CheckpointStore:
  """Saves, verifies, restores and prunes checkpoints of one training.

  With MultiWorkerMirroredStrategy every worker must call `save` (saving may
  run collectives); only the chief's copy is kept: the others write to a local
  temporary directory and delete it. With `run_id` the chief takes the
  folder's lease (`acquire_lease`) and checks it before anything it deletes.
  Every storage call is retried on transient errors (`storage.retrying`);
  `retries` lists them.
  """

  def __init__(self, directory: str, checkpoint: tf.train.Checkpoint,
               keep_last: int = 3, is_chief: bool = True,
               run_id: Optional[str] = None,
               lease_heartbeat_seconds: float = 10.0,
               retry: storage.RetryPolicy = storage.RetryPolicy(),
               collective_saves: bool = False):
    """`collective_saves`: saving runs collectives (MultiWorkerMirrored), so
    the chief cannot retry a failed TF write alone (the other workers would
    not join): the error propagates and the launcher relaunches."""
    self.directory = directory.rstrip('/')
    self._checkpoint = checkpoint
    self._keep_last = keep_last
    self._is_chief = is_chief
    self._retry = retry
    self._collective_saves = collective_saves
    self.retries: List[Dict[str, Any]] = []
    self.last_skipped: List[Dict[str, Any]] = []
    self.lease = (CheckpointLease(self.directory, run_id,
                                  lease_heartbeat_seconds, self._io)
                  if run_id and is_chief else None)

  def _record_retry(self, what: str, error: BaseException) -> None:
    self.retries.append({'operation': what,
                         'error': f'{type(error).__name__}: {error}',
                         'time': time.time()})

  def _io(self, what: str, fn: Callable[..., Any], *args) -> Any:
    return storage.retrying(lambda: fn(*args), what, self._retry,
                            self._record_retry)

  @staticmethod
  def checkpoint_name(step: int) -> str:
    return f'{CHECKPOINT_PREFIX}-{step:012d}'

  def acquire_lease(self, mode: str = 'fail', timeout_seconds: float = 0.0
                   ) -> Optional[Dict[str, Any]]:
    """Takes the folder's lease (chief with a run id); the event, if any."""
    return self.lease.acquire(mode, timeout_seconds) if self.lease else None

  def release_lease(self) -> None:
    if self.lease:
      self.lease.release()

  def _ensure_lease(self) -> None:
    if self.lease:
      self.lease.ensure_held()

  def checkpoint_dirs(self) -> List[str]:
    """Checkpoint dirs (published or partial), newest (highest step) first."""
    if not self._io('list checkpoints', tf.io.gfile.isdir, self.directory):
      return []
    names = [n.rstrip('/') for n in self._io(
        'list checkpoints', tf.io.gfile.listdir, self.directory)]
    steps = sorted((int(m.group(1))
                    for m in map(_CHECKPOINT_DIR.match, names) if m),
                   reverse=True)
    return [_join(self.directory, self.checkpoint_name(s)) for s in steps]

  @staticmethod
  def _remove_if_exists(path: str) -> None:
    if tf.io.gfile.exists(path):
      tf.io.gfile.rmtree(path)

  @staticmethod
  def _describe_files(path: str) -> Dict[str, Dict[str, Any]]:
    """Sizes of the checkpoint's files, and the sha256 of its index."""
    files = {}
    for name in sorted(n.rstrip('/') for n in tf.io.gfile.listdir(path)):
      if _CHECKPOINT_FILE.match(name):
        file_path = _join(path, name)
        files[name] = {'size': tf.io.gfile.stat(file_path).length}
        if name == INDEX_NAME:
          files[name]['sha256'] = _sha256(file_path)
    return files

  def save(self, step: int, extra: Optional[Dict[str, Any]] = None) -> str:
    """Writes the checkpoint for `step` and publishes it; returns its path."""
    if not self._is_chief:
      scratch = tempfile.mkdtemp(prefix='hpm-nonchief-ckpt-')
      try:
        self._checkpoint.write(_join(scratch, CHECKPOINT_PREFIX))
      finally:
        shutil.rmtree(scratch, ignore_errors=True)
      return ''
    self._ensure_lease()
    final_dir = _join(self.directory, self.checkpoint_name(step))
    prefix = _join(final_dir, CHECKPOINT_PREFIX)

    def write():
      # Left unpublished by an attempt that crashed while writing this step,
      # or by a failed try of this write.
      self._remove_if_exists(final_dir)
      self._checkpoint.write(prefix)

    if self._collective_saves:
      self._io('clear checkpoint', self._remove_if_exists, final_dir)
      self._checkpoint.write(prefix)
    else:
      self._io('write checkpoint', write)
    manifest = {'version': _MANIFEST_VERSION, 'step': int(step),
                'created': time.time(),
                'files': self._io('describe checkpoint', self._describe_files,
                                  final_dir),
                'extra': extra or {}}
    # Publishing: without its manifest a checkpoint is never restored.
    self._io('publish checkpoint', storage.write_json,
             _join(final_dir, MANIFEST_NAME), manifest, True)
    self._prune()
    return final_dir

  def _has_manifest(self, path: str) -> bool:
    return self._io('check manifest', tf.io.gfile.exists,
                    _join(path, MANIFEST_NAME))

  def _prune(self) -> None:
    """Keeps the newest `keep_last` published checkpoints, drops the rest.

    Runs right after a save, by the lease holder, when no other write is in
    flight, so a directory without a manifest is an abandoned partial write.
    A prune that storage does not let finish is tried again after the next
    save.
    """
    self._ensure_lease()
    kept = 0
    try:
      for path in self.checkpoint_dirs():
        if kept < self._keep_last and self._has_manifest(path):
          kept += 1
        else:
          self._io('prune checkpoint', tf.io.gfile.rmtree, path)
    except storage.TRANSIENT_ERRORS as e:
      logging.warning('Could not prune %s now (%s); the next save tries '
                      'again.', self.directory, e)

  def verify(self, path: str) -> Dict[str, Any]:
    """Returns the manifest of `path`; raises CorruptCheckpointError.

    Checks that every listed file is there with its size, and each listed
    sha256 (the index's; version 1 manifests list every file's). The data's
    own crc32c checksums are checked by TF when the checkpoint is read.
    Storage errors propagate (after retries): they prove nothing.
    """
    manifest_path = _join(path, MANIFEST_NAME)
    try:
      manifest = self._io('read manifest', storage.read_json, manifest_path)
    except ValueError as e:
      raise CorruptCheckpointError(f'unreadable manifest: {e}') from e
    if manifest is None:
      raise CorruptCheckpointError('no manifest (write did not finish)')
    if not isinstance(manifest, dict) or not isinstance(
        manifest.get('files'), dict) or INDEX_NAME not in manifest[
            'files'] or not all(
                isinstance(v, dict) and 'size' in v and (
                    'sha256' in v or k != INDEX_NAME)
                for k, v in manifest['files'].items()):
      raise CorruptCheckpointError('malformed manifest')
    for name, expected in sorted(manifest['files'].items()):
      file_path = _join(path, name)
      if not self._io('verify checkpoint', tf.io.gfile.exists, file_path):
        raise CorruptCheckpointError(f'{name} is missing')
      size = self._io('verify checkpoint', tf.io.gfile.stat,
                      file_path).length
      if size != expected['size']:
        raise CorruptCheckpointError(
            f'{name} has {size} bytes, manifest says {expected["size"]} '
            '(truncated?)')
      if 'sha256' in expected and self._io(
          'verify checkpoint', _sha256, file_path) != expected['sha256']:
        raise CorruptCheckpointError(f'{name} does not match its sha256')
    return manifest

  def _read(self, path: str) -> None:
    """Reads `path` into the model; raises on proven damage or mismatch."""
    prefix = _join(path, CHECKPOINT_PREFIX)
    for attempt in (1, 2):
      try:
        self._io('read checkpoint', lambda: self._checkpoint.read(
            prefix).assert_existing_objects_matched())
        return
      except (ValueError, AssertionError, tf.errors.InvalidArgumentError) as e:
        raise CheckpointMismatchError(
            f'The checkpoint {path} is intact but does not fit the model: '
            f'{e} The model\'s structure changed while the training '
            'fingerprint did not (the module imports code outside its file?). '
            f'The checkpoints in {self.directory} are kept: train with the '
            'code that wrote them, or delete that folder to start fresh.'
        ) from e
      except (tf.errors.OpError, IndexError) as e:
        if not _is_tf_damage(e):
          raise
        if attempt == 2:
          raise CorruptCheckpointError(
              'TF found its data damaged on two reads (the crc32c checksums '
              'or lengths in its index do not match): '
              f'{type(e).__name__}: {e}') from e
        logging.warning('Checkpoint %s read back damaged (%s); reading it '
                        'again to tell damage from a bad read.', path, e)

  def restore_latest(self) -> Optional[RestoreResult]:
    """Restores the newest checkpoint that verifies, else returns None.

    Newer checkpoints proven damaged are skipped with a warning, reported in
    `RestoreResult.skipped` (and `last_skipped`) and, by the chief, deleted,
    so that pruning never keeps them in place of good ones. Raises
    CheckpointStorageError where storage keeps failing (after retries) and
    CheckpointMismatchError where a good checkpoint does not fit the model;
    neither deletes anything.
    """
    skipped = []
    self.last_skipped = skipped
    for path in self.checkpoint_dirs():
      try:
        manifest = self.verify(path)
        self._read(path)
      except CorruptCheckpointError as e:
        logging.warning('Checkpoint %s is unusable (%s); falling back to the '
                        'previous one.', path, e)
        skipped.append({'path': path, 'reason': str(e)})
        continue
      except (tf.errors.OpError, OSError) as e:
        raise CheckpointStorageError(
            f'Cannot read the checkpoint {path}: {type(e).__name__}: {e} '
            '(after retries). Nothing was deleted; the next attempt tries '
            'again.') from e
      self._delete_unusable(skipped)
      return RestoreResult(step=int(manifest['step']), path=path,
                           skipped=skipped)
    if skipped:
      logging.warning('No usable checkpoint in %s; starting from step 0.',
                      self.directory)
    self._delete_unusable(skipped)
    return None

  def _delete_unusable(self, skipped: List[Dict[str, Any]]) -> None:
    """Deletes checkpoints proven damaged (chief, holding the lease)."""
    for bad in skipped:
      bad['deleted'] = False
    if not self._is_chief or not skipped:
      return
    self._ensure_lease()
    for bad in skipped:
      try:
        self._io('delete damaged checkpoint', tf.io.gfile.rmtree, bad['path'])
        bad['deleted'] = True
      except (tf.errors.OpError, OSError) as e:
        logging.warning('Could not delete the damaged checkpoint %s (%s); '
                        'restore skips it again.', bad['path'], e)

  def other_fingerprints(self) -> List[str]:
    """Sibling fingerprint dirs that hold checkpoints (a changed training)."""
    parent = self.directory.rsplit('/', 1)[0]
    own = self.directory.rsplit('/', 1)[-1]
    if parent == self.directory or not self._io(
        'list fingerprints', tf.io.gfile.isdir, parent):
      return []
    others = []
    for name in sorted(n.rstrip('/') for n in self._io(
        'list fingerprints', tf.io.gfile.listdir, parent)):
      sibling = _join(parent, name)
      if name != own and CheckpointStore(
          sibling, self._checkpoint, retry=self._retry).checkpoint_dirs():
        others.append(name)
    return others

  def read_events(self) -> List[Dict[str, Any]]:
    return self._io('read events', storage.read_json,
                    _join(self.directory, EVENTS_NAME)) or []

  def append_event(self, event: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Adds `event` to the events of this training (chief only); returns all."""
    events = self.read_events() + [event]
    if self._is_chief:
      self._io('write events', storage.write_json,
               _join(self.directory, EVENTS_NAME), events, True)
    return events

  def read_progress(self) -> Optional[Dict[str, Any]]:
    try:
      return self._io('read progress', storage.read_json,
                      _join(self.directory, PROGRESS_NAME))
    except (ValueError, tf.errors.OpError):
      return None

  def write_progress(self, step: int,
                     details: Optional[Dict[str, Any]] = None) -> None:
    """Records the last step reached, to count lost steps after a crash,
    with `details` for people watching (components/trainer/progress.py)."""
    if self._is_chief:
      self._io('write progress', tf.io.gfile.makedirs, self.directory)
      self._io('write progress', storage.write_json,
               _join(self.directory, PROGRESS_NAME),
               {**(details or {}), 'step': int(step), 'time': time.time()},
               True)

  def delete_all(self) -> None:
    """Removes the whole checkpoint directory (after a successful export)."""
    if not self._is_chief:
      return
    if self.lease:
      self.lease.ensure_held()
      self.lease.stop()  # Its heartbeat would write the folder again.
    if self._io('delete checkpoints', tf.io.gfile.exists, self.directory):
      self._io('delete checkpoints', tf.io.gfile.rmtree, self.directory)


def read_progress(directory: str) -> Optional[Dict[str, Any]]:
  """The progress marker of a checkpoint folder; None if absent or unreadable
  (the launcher reads it while the chief may be writing it)."""
  try:
    return storage.read_json(_join(directory, PROGRESS_NAME))
  except (ValueError, tf.errors.OpError):
    return None


class ProgressMarker:
  """Records the last step reached, in the background.

  The loop only hands over a number and a small dict, so it never
  waits for storage (a write to an object store takes tens of milliseconds);
  a crash can leave the marker up to `min_interval_seconds` plus one write
  behind, so the lost steps computed from it are a lower bound.
  """

  def __init__(self, store: CheckpointStore,
               min_interval_seconds: float = 1.0):
    self._store = store
    self._min_interval_seconds = min_interval_seconds
    self._latest = None  # (step, details), replaced as one.
    self._written = None
    self._wake = threading.Event()
    self._closing = False
    self._thread = threading.Thread(target=self._run, name='hpm-progress',
                                    daemon=True)
    self._thread.start()

  def update(self, step: int,
             details: Optional[Dict[str, Any]] = None) -> None:
    """The step reached, with what `details` say about it (none: a save
    records only the step; older details would not match it)."""
    self._latest = (step, details)
    self._wake.set()

  def _run(self) -> None:
    while True:
      self._wake.wait()
      self._wake.clear()
      latest = self._latest
      if latest is not None and latest != self._written:
        step, details = latest
        try:
          self._store.write_progress(step, details)
          self._written = latest
        except (OSError, tf.errors.OpError) as e:
          logging.warning('Could not record progress at step %d: %s', step, e)
      if self._closing:
        return
      time.sleep(self._min_interval_seconds)

  def close(self) -> None:
    """Writes the latest step and stops."""
    self._closing = True
    self._wake.set()
    self._thread.join()
