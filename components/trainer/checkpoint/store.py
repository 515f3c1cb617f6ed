"""Saves, publishes, prunes, verifies and restores one training's checkpoints.

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
"""

import dataclasses
import hashlib
import re
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

from absl import logging
import tensorflow as tf

from components import storage
from components.trainer.checkpoint.lease import CheckpointLease
from components.trainer.checkpoint import location
from components.trainer.checkpoint import records
from components.trainer.common import failures

MANIFEST_NAME = 'MANIFEST.json'
CHECKPOINT_PREFIX = 'ckpt'
INDEX_NAME = CHECKPOINT_PREFIX + '.index'
# A checkpoint folder is this and the step; the step is zero-padded to 12
# digits so that the names sort by step.
CHECKPOINT_DIR_PREFIX = CHECKPOINT_PREFIX + '-'
_CHECKPOINT_DIR = re.compile(
    '^' + re.escape(CHECKPOINT_DIR_PREFIX) + r'(\d{12})$')
# What tf.train.Checkpoint.write publishes (not the leftovers of a retried
# write).
_CHECKPOINT_FILE = re.compile(
    '^' + re.escape(CHECKPOINT_PREFIX) + r'\.(index|data-\d{5}-of-\d{5})$')
# 1: every file's sha256; 2: sizes, and the sha256 of the index only.
_MANIFEST_VERSION = 2
_HASH_CHUNK_BYTES = 4 * 1024 * 1024


class CorruptCheckpointError(Exception):
  """Proof that a checkpoint is damaged: it does not match its manifest (or
  has none), or TF found its data's checksums wrong."""


class CheckpointStorageError(OSError):
  """Checkpoints could not be read or written; nothing was deleted."""


class CheckpointMismatchError(ValueError):
  """A good checkpoint does not fit the model: its structure changed."""


class CheckpointLocationError(storage.ExplainedOSError):
  """The checkpoint location cannot take a save (full, read-only,
  forbidden); the message says where, what the save needs, and which
  checkpoint is the last good one (kept)."""


@dataclasses.dataclass
class RestoreResult:
  """What `CheckpointStore.restore_latest` restored, and what it skipped."""
  step: int
  path: str
  # [{'path', 'reason', 'deleted'}] for newer checkpoints proven damaged.
  skipped: List[Dict[str, Any]]
  # What the training saved with it (`save`'s `extra`).
  extra: Dict[str, Any] = dataclasses.field(default_factory=dict)


def checkpoint_name(step: int) -> str:
  """The folder name of the checkpoint after `step` optimizer steps."""
  return f'{CHECKPOINT_DIR_PREFIX}{step:012d}'


def step_of(path: str) -> Optional[int]:
  """The step of the checkpoint folder `path` (a name or a path ending in
  one); None for anything else beside them (lease, events, progress)."""
  match = _CHECKPOINT_DIR.match(path.rstrip('/').rsplit('/', 1)[-1])
  return int(match.group(1)) if match else None


def is_checkpoint_name(path: str) -> bool:
  return step_of(path) is not None


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
               lease_heartbeat_s: float = 10.0,
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
    self.lease = (CheckpointLease(self.directory, run_id,
                                  lease_heartbeat_s, self._io)
                  if run_id and is_chief else None)
    self.records = records.RunRecords(self.directory, is_chief, self._io)

  def _record_retry(self, what: str, error: BaseException) -> None:
    self.retries.append({'operation': what,
                         'error': f'{type(error).__name__}: {error}',
                         'time': time.time()})

  def _io(self, what: str, fn: Callable[..., Any], *args) -> Any:
    return storage.retrying(lambda: fn(*args), what, self._retry,
                            self._record_retry)

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
    steps = sorted((step for step in map(step_of, self._io(
        'list checkpoints', tf.io.gfile.listdir, self.directory))
                    if step is not None), reverse=True)
    return [location.join(self.directory, checkpoint_name(s))
            for s in steps]

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
        file_path = location.join(path, name)
        files[name] = {'size': tf.io.gfile.stat(file_path).length}
        if name == INDEX_NAME:
          files[name]['sha256'] = _sha256(file_path)
    return files

  def save(self, step: int, extra: Optional[Dict[str, Any]] = None) -> str:
    """Writes the checkpoint for `step` and publishes it; returns its path."""
    if not self._is_chief:
      scratch = tempfile.mkdtemp(prefix='hpm-nonchief-ckpt-')
      try:
        self._checkpoint.write(location.join(scratch, CHECKPOINT_PREFIX))
      finally:
        shutil.rmtree(scratch, ignore_errors=True)
      return ''
    self._ensure_lease()
    final_dir = location.join(self.directory, checkpoint_name(step))
    prefix = location.join(final_dir, CHECKPOINT_PREFIX)

    def write():
      # Left unpublished by an attempt that crashed while writing this step,
      # or by a failed try of this write.
      self._remove_if_exists(final_dir)
      self._checkpoint.write(prefix)

    try:
      if self._collective_saves:
        self._io('clear checkpoint', self._remove_if_exists, final_dir)
        self._checkpoint.write(prefix)
      else:
        self._io('write checkpoint', write)
      manifest = {'version': _MANIFEST_VERSION, 'step': int(step),
                  'created': time.time(),
                  'files': self._io('describe checkpoint',
                                    self._describe_files, final_dir),
                  'extra': extra or {}}
      # Publishing: without its manifest a checkpoint is never restored.
      self._io('publish checkpoint', storage.write_json,
               location.join(final_dir, MANIFEST_NAME), manifest, True)
    except (OSError, tf.errors.OpError) as e:
      problem = failures.LOCATION_PROBLEMS.get(failures.classify(e))
      if problem is None:
        raise
      raise self._location_error(step, final_dir, e, *problem) from e
    self._prune()
    return final_dir

  def _newest_published(self) -> Optional[Dict[str, Any]]:
    """Step, path and bytes of the newest checkpoint with a manifest."""
    for path in self.checkpoint_dirs():
      manifest = storage.read_json(location.join(path, MANIFEST_NAME))
      if manifest:
        return {'step': manifest['step'], 'path': path, 'bytes': sum(
            f['size'] for f in manifest['files'].values())}
    return None

  def _location_error(self, step: int, partial_dir: str, error: BaseException,
                      number: int, problem: str) -> CheckpointLocationError:
    """The error that says where, what the save needs and what is kept;
    the unpublished files of this save are removed (they only take space:
    without a manifest they are never restored)."""
    try:
      self._remove_if_exists(partial_dir)
    except (OSError, tf.errors.OpError):
      pass
    last = self._newest_published()
    needs = (f'; a checkpoint takes about {last["bytes"]:,} bytes (step '
             f'{last["step"]}\'s)' if last else '')
    free = ''
    if storage.is_local(self.directory):
      free = f', {storage.free_bytes(self.directory):,} bytes are free there'
    kept = (f'The last good checkpoint is step {last["step"]} ({last["path"]}),'
            ' kept: a rerun resumes from it.' if last else
            'No checkpoint was saved yet: a rerun starts from step 0.')
    return CheckpointLocationError(number, (
        f'The checkpoint location {self.directory} {problem}: saving step '
        f'{step} failed ({type(error).__name__}: '
        f'{failures.short_text(error)}){needs}{free}. {kept}'))

  def _has_manifest(self, path: str) -> bool:
    return self._io('check manifest', tf.io.gfile.exists,
                    location.join(path, MANIFEST_NAME))

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
    manifest_path = location.join(path, MANIFEST_NAME)
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
      file_path = location.join(path, name)
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
    prefix = location.join(path, CHECKPOINT_PREFIX)
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

  def restore_latest(self, skipped: Optional[List[Dict[str, Any]]] = None
                    ) -> Optional[RestoreResult]:
    """Restores the newest checkpoint that verifies, else returns None.

    Newer checkpoints proven damaged are skipped with a warning, reported in
    `RestoreResult.skipped` (and added to `skipped`, which also gets them
    where nothing restores) and, by the chief, deleted,
    so that pruning never keeps them in place of good ones. Raises
    CheckpointStorageError where storage keeps failing (after retries) and
    CheckpointMismatchError where a good checkpoint does not fit the model;
    neither deletes anything.
    """
    skipped = [] if skipped is None else skipped
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
                           skipped=skipped, extra=manifest.get('extra') or {})
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
      sibling = location.join(parent, name)
      if name != own and CheckpointStore(
          sibling, self._checkpoint, retry=self._retry).checkpoint_dirs():
        others.append(name)
    return others

  def delete_all(self) -> None:
    """Removes the whole checkpoint directory (after a successful export)."""
    if not self._is_chief:
      return
    if self.lease:
      self.lease.ensure_held()
      self.lease.stop()  # Its heartbeat would write the folder again.
    if self._io('delete checkpoints', tf.io.gfile.exists, self.directory):
      self._io('delete checkpoints', tf.io.gfile.rmtree, self.directory)
