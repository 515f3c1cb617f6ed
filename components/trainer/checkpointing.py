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
    MANIFEST.json             step, every file's size and sha256
  events.json                 resume events of every attempt (chief only)
  progress.json               last step reached, so a restart knows what it lost,
                              with the progress the launcher logs (progress.py)

The manifest is the commit point: it is written last, atomically
(`storage.write_json`: an object store publishes an object only when its
upload completes; a local file is renamed over the target), so a crash
mid-write leaves a directory without a manifest, which is never restored.
Directory renames are avoided on purpose: object stores cannot rename a
folder atomically (TF's GCS plugin cannot rename one at all). Restore re-checks every listed file's size
and hash and falls back to the previous checkpoint when one does not match.
"""

import dataclasses
import hashlib
import json
import re
import shutil
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

from absl import logging
import tensorflow as tf

from components import storage
from components.json_config import JsonConfig, is_int

MANIFEST_NAME = 'MANIFEST.json'
EVENTS_NAME = 'events.json'
PROGRESS_NAME = 'progress.json'
CHECKPOINT_PREFIX = 'ckpt'
_CHECKPOINT_DIR = re.compile(r'^ckpt-(\d{12})$')
_MANIFEST_VERSION = 1
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
  """
  OPTIONS_NAME = 'fault_tolerance'
  backup_root: Optional[str] = None
  save_every_steps: Optional[int] = 100
  save_every_seconds: Optional[float] = None
  keep_last: int = 3
  delete_after_export: bool = True
  max_restarts: int = 2

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
  """A checkpoint does not match its manifest (or has none)."""


@dataclasses.dataclass
class RestoreResult:
  """What `CheckpointStore.restore_latest` restored, and what it skipped."""
  step: int
  path: str
  # [{'path': ..., 'reason': ...}] for newer checkpoints that failed checks.
  skipped: List[Dict[str, str]]


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


class CheckpointStore:
  """Saves, verifies, restores and prunes checkpoints of one training.

  With MultiWorkerMirroredStrategy every worker must call `save` (saving may
  run collectives); only the chief's copy is kept: the others write to a local
  temporary directory and delete it.
  """

  def __init__(self, directory: str, checkpoint: tf.train.Checkpoint,
               keep_last: int = 3, is_chief: bool = True):
    self.directory = directory.rstrip('/')
    self._checkpoint = checkpoint
    self._keep_last = keep_last
    self._is_chief = is_chief

  @staticmethod
  def checkpoint_name(step: int) -> str:
    return f'{CHECKPOINT_PREFIX}-{step:012d}'

  def checkpoint_dirs(self) -> List[str]:
    """Checkpoint dirs (published or partial), newest (highest step) first."""
    if not tf.io.gfile.isdir(self.directory):
      return []
    names = [n.rstrip('/') for n in tf.io.gfile.listdir(self.directory)]
    steps = sorted((int(m.group(1))
                    for m in map(_CHECKPOINT_DIR.match, names) if m),
                   reverse=True)
    return [_join(self.directory, self.checkpoint_name(s)) for s in steps]

  def save(self, step: int, extra: Optional[Dict[str, Any]] = None) -> str:
    """Writes the checkpoint for `step` and publishes it; returns its path."""
    if not self._is_chief:
      scratch = tempfile.mkdtemp(prefix='hpm-nonchief-ckpt-')
      try:
        self._checkpoint.write(_join(scratch, CHECKPOINT_PREFIX))
      finally:
        shutil.rmtree(scratch, ignore_errors=True)
      return ''
    final_dir = _join(self.directory, self.checkpoint_name(step))
    if tf.io.gfile.exists(final_dir):
      # Left unpublished by an attempt that crashed while writing this step.
      tf.io.gfile.rmtree(final_dir)
    self._checkpoint.write(_join(final_dir, CHECKPOINT_PREFIX))
    files = {}
    for name in sorted(tf.io.gfile.listdir(final_dir)):
      path = _join(final_dir, name)
      files[name] = {'size': tf.io.gfile.stat(path).length,
                     'sha256': _sha256(path)}
    manifest = {'version': _MANIFEST_VERSION, 'step': int(step),
                'created': time.time(), 'files': files, 'extra': extra or {}}
    # Publishing: without its manifest a checkpoint is never restored.
    storage.write_json(_join(final_dir, MANIFEST_NAME), manifest, atomic=True)
    self._prune()
    return final_dir

  def _has_manifest(self, path: str) -> bool:
    return tf.io.gfile.exists(_join(path, MANIFEST_NAME))

  def _prune(self) -> None:
    """Keeps the newest `keep_last` published checkpoints, drops the rest.

    Runs right after a save, when no other write is in flight, so a directory
    without a manifest is an abandoned partial write.
    """
    kept = 0
    for path in self.checkpoint_dirs():
      if kept < self._keep_last and self._has_manifest(path):
        kept += 1
      else:
        tf.io.gfile.rmtree(path)

  def verify(self, path: str) -> Dict[str, Any]:
    """Returns the manifest of `path`; raises CorruptCheckpointError."""
    manifest_path = _join(path, MANIFEST_NAME)
    try:
      manifest = storage.read_json(manifest_path)
    except (ValueError, tf.errors.OpError) as e:
      raise CorruptCheckpointError(f'unreadable manifest: {e}') from e
    if manifest is None:
      raise CorruptCheckpointError('no manifest (write did not finish)')
    if not isinstance(manifest, dict) or not isinstance(
        manifest.get('files'), dict) or not manifest['files'] or not all(
            isinstance(v, dict) and {'size', 'sha256'} <= set(v)
            for v in manifest['files'].values()):
      raise CorruptCheckpointError('malformed manifest')
    for name, expected in sorted(manifest['files'].items()):
      file_path = _join(path, name)
      if not tf.io.gfile.exists(file_path):
        raise CorruptCheckpointError(f'{name} is missing')
      size = tf.io.gfile.stat(file_path).length
      if size != expected['size']:
        raise CorruptCheckpointError(
            f'{name} has {size} bytes, manifest says {expected["size"]} '
            '(truncated?)')
      if _sha256(file_path) != expected['sha256']:
        raise CorruptCheckpointError(f'{name} does not match its sha256')
    return manifest

  def restore_latest(self) -> Optional[RestoreResult]:
    """Restores the newest checkpoint that verifies, else returns None.

    Newer checkpoints that fail verification or reading are skipped with a
    warning, reported in `RestoreResult.skipped` and (by the chief) deleted,
    so that pruning never keeps them in place of good ones.
    """
    skipped = []
    for path in self.checkpoint_dirs():
      try:
        manifest = self.verify(path)
        self._checkpoint.read(_join(path, CHECKPOINT_PREFIX)
                             ).assert_existing_objects_matched()
      except (CorruptCheckpointError, tf.errors.OpError, AssertionError,
              ValueError) as e:
        logging.warning('Checkpoint %s is unusable (%s); falling back to the '
                        'previous one.', path, e)
        skipped.append({'path': path, 'reason': str(e)})
        continue
      self._delete_unusable(skipped)
      return RestoreResult(step=int(manifest['step']), path=path,
                           skipped=skipped)
    if skipped:
      logging.warning('No usable checkpoint in %s; starting from step 0.',
                      self.directory)
    self._delete_unusable(skipped)
    return None

  def _delete_unusable(self, skipped: List[Dict[str, str]]) -> None:
    if self._is_chief:
      for bad in skipped:
        tf.io.gfile.rmtree(bad['path'])

  def other_fingerprints(self) -> List[str]:
    """Sibling fingerprint dirs that hold checkpoints (a changed training)."""
    parent = self.directory.rsplit('/', 1)[0]
    own = self.directory.rsplit('/', 1)[-1]
    if parent == self.directory or not tf.io.gfile.isdir(parent):
      return []
    others = []
    for name in sorted(n.rstrip('/') for n in tf.io.gfile.listdir(parent)):
      sibling = _join(parent, name)
      if name != own and CheckpointStore(sibling,
                                          self._checkpoint).checkpoint_dirs():
        others.append(name)
    return others

  def read_events(self) -> List[Dict[str, Any]]:
    return storage.read_json(_join(self.directory, EVENTS_NAME)) or []

  def append_event(self, event: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Adds `event` to the events of this training (chief only); returns all."""
    events = self.read_events() + [event]
    if self._is_chief:
      tf.io.gfile.makedirs(self.directory)
      storage.write_json(_join(self.directory, EVENTS_NAME), events,
                         atomic=True)
    return events

  def read_progress(self) -> Optional[Dict[str, Any]]:
    return read_progress(self.directory)

  def write_progress(self, step: int,
                     details: Optional[Dict[str, Any]] = None) -> None:
    """Records the last step reached, to count lost steps after a crash,
    with `details` for people watching (components/trainer/progress.py)."""
    if self._is_chief:
      tf.io.gfile.makedirs(self.directory)
      storage.write_json(_join(self.directory, PROGRESS_NAME),
                         {**(details or {}), 'step': int(step),
                          'time': time.time()}, atomic=True)

  def delete_all(self) -> None:
    """Removes the whole checkpoint directory (after a successful export)."""
    if self._is_chief and tf.io.gfile.exists(self.directory):
      tf.io.gfile.rmtree(self.directory)


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
