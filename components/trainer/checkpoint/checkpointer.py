"""Checkpoint cadence, restore with its story, and progress of one training.

`Checkpointer` wraps the training's `CheckpointStore`: it takes the folder's
lease (the chief), restores the newest valid checkpoint and records why
training starts where it does (resumed, restarted without a usable
checkpoint, or a fresh start because the inputs or config changed), saves
with timing statistics, decides when a save is due (every N steps, every T
seconds), hands the step reached to the background progress marker, and
records what storage made it do (a lease taken over or waited for, transient
errors retried) as events for `model_run`.
"""

import collections
import time
from typing import Any, Dict, List, Optional

from absl import logging
import tensorflow as tf

from components.trainer.checkpoint.config import CheckpointConfig
from components.trainer.checkpoint import records
from components.trainer.checkpoint.store import CheckpointStore

# The chief records the last step reached (to count the steps a crash lost)
# in the background, at most this often: object stores throttle repeated
# writes to one object (about one per second on GCS).
PROGRESS_EVERY_SECONDS = 1.0


class Checkpointer:
  """Saves and restores one training's checkpoint, model and step counter."""

  def __init__(self, directory: str, checkpoint: tf.train.Checkpoint,
               config: CheckpointConfig, is_chief: bool,
               manifest_extra: Dict[str, Any], run_id: Optional[str] = None,
               collective_saves: bool = False):
    """`run_id` names this run for the lease: the same for every attempt of
    one execution (the model_run URI), another for another execution."""
    self.config = config
    self.store = CheckpointStore(
        directory, checkpoint, keep_last=config.keep_last, is_chief=is_chief,
        run_id=run_id,
        lease_heartbeat_s=config.lease_heartbeat_s,
        collective_saves=collective_saves)
    self.records = self.store.records
    self.progress = records.ProgressMarker(self.records,
                                           PROGRESS_EVERY_SECONDS)
    self._manifest_extra = manifest_extra
    # The restored checkpoint's `manifest_extra`, as it was saved.
    self.restored_extra: Dict[str, Any] = {}
    self.events: List[Dict[str, Any]] = []
    self.saves = 0
    self.save_seconds = 0.0
    self.last_save_step = -1
    self.last_save_path: Optional[str] = None
    self.last_save_time = time.monotonic()

  def acquire_lease(self) -> None:
    """Takes the folder's lease (chief), per `config.lease`; records how."""
    event = self.store.acquire_lease(self.config.lease,
                                     self.config.lease_timeout_s)
    if event:
      logging.warning('Checkpoint lease: %s', event)
      self.events = self.records.append_event(event)

  def restore(self) -> int:
    """Restores the newest valid checkpoint; records why we start where."""
    progress = self.records.read_progress()
    skipped = []
    restored = self.store.restore_latest(skipped)
    reached = progress['step'] if progress else None
    if restored:
      self.restored_extra = restored.extra
      event = {'event': 'resumed', 'from_step': restored.step,
               'checkpoint': restored.path,
               'skipped_checkpoints': restored.skipped}
      if reached is not None:
        event['steps_lost'] = max(0, reached - restored.step)
      logging.warning('Resuming from step %d (%s); %s step(s) lost.',
                      restored.step, restored.path,
                      event.get('steps_lost', 'unknown'))
    elif progress is not None:
      # A previous attempt ran (its marker may still say step 0: the marker
      # is throttled) but was stopped before its first checkpoint.
      event = {'event': 'restarted', 'from_step': 0, 'steps_lost': reached,
               'skipped_checkpoints': skipped,
               'reason': 'no usable checkpoint from the previous attempt'}
      logging.warning('Restarting from step 0: the previous attempt reached '
                      'step %d but left no usable checkpoint.', reached)
    else:
      others = self.store.other_fingerprints()
      if not others:
        self.events = self.records.read_events()
        return 0
      event = {'event': 'fresh_start', 'from_step': 0,
               'reason': ('the inputs or the training config changed: no '
                          'checkpoint for this fingerprint, but for '
                          f'{others}')}
      logging.warning('Starting fresh in %s: %s', self.store.directory,
                      event['reason'])
    event['time'] = time.time()
    self.events = self.records.append_event(event)
    return restored.step if restored else 0

  def save_with_checkpoints(self, key: str, value: Any) -> None:
    """`value` is saved in every later checkpoint's manifest under `key`."""
    self._manifest_extra[key] = value

  def save(self, step: int) -> str:
    began = time.monotonic()
    self.progress.pausing(step, 'saving')
    path = self.store.save(step, extra=self._manifest_extra)
    self.progress.update(step)
    self.saves += 1
    self.save_seconds += time.monotonic() - began
    self.last_save_step = step
    self.last_save_path = path
    self.last_save_time = time.monotonic()
    logging.info('Checkpoint at step %d: %s', step, path)
    return path

  def next_save_step(self, step: int) -> Optional[int]:
    """The next step after `step` where a save is due by steps, or None."""
    every = self.config.save_every_steps
    return (step // every + 1) * every if every else None

  def due_by_time(self) -> bool:
    every = self.config.save_every_s
    return bool(every) and time.monotonic() - self.last_save_time >= every

  def record_preempted(self, step: int) -> None:
    self.events = self.records.append_event({
        'event': 'preempted', 'at_step': step,
        'checkpoint': self.last_save_path, 'time': time.time()})

  def record_storage_retries(self) -> None:
    """One event summing up the transient storage errors retried."""
    retries = self.store.retries
    if retries:
      self.events = self.records.append_event({
          'event': 'storage_retried', 'retries': len(retries),
          'operations': dict(collections.Counter(
              r['operation'] for r in retries)),
          'last_error': retries[-1]['error'], 'time': time.time()})

  def close(self) -> None:
    self.progress.close()

  def release(self) -> None:
    """Gives up the lease (after training, export and deletion)."""
    self.store.release_lease()

  def delete_all(self) -> None:
    self.store.delete_all()
