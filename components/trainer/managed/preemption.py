"""Preemption notices (SIGTERM): checkpoint at the next step boundary, stop.

MultiWorkerMirroredStrategy uses TF's own `PreemptionCheckpointHandler`: the
workers agree through the coordination service on the step after which all of
them checkpoint (a collective), whichever worker got the signal. Every other
strategy runs in one process (or, for parameter servers, only the coordinator
checkpoints), where a flag set by our SIGTERM handler and checked between
steps is enough.

A preempted training returns normally with `preempted: true` in its result;
the process should then exit with `PREEMPTED_EXIT_CODE` so that a launcher
knows a restart will resume (and counts it against no restart budget).
"""

import shutil
import signal
import tempfile
import threading
from typing import Any, Callable

from absl import logging
import tensorflow as tf

from components.trainer.common.exit_codes import PREEMPTED_EXIT_CODE


class Preempted(Exception):
  """Raised at a step boundary after the preemption checkpoint was saved."""


def exit_code(preempted: bool) -> int:
  """Process exit status of a training that was `preempted` or not."""
  return PREEMPTED_EXIT_CODE if preempted else 0


class SigtermWatcher:
  """Our own handler: SIGTERM sets a flag; the loop saves at the boundary.

  Signal handlers can only be installed from the main thread; elsewhere the
  watcher logs that preemption notices are not handled and never fires.
  """

  def __init__(self, save_fn: Callable[[], None]):
    self._save_fn = save_fn
    self._requested = threading.Event()
    self._previous = None
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._on_sigterm)
    else:
      logging.warning('Training runs outside the main thread: SIGTERM '
                      '(preemption notice) is not handled.')

  def _on_sigterm(self, signum, frame):
    del signum, frame
    logging.warning('SIGTERM received: checkpointing at the next step '
                    'boundary, then stopping.')
    self._requested.set()

  @property
  def requested(self) -> bool:
    return self._requested.is_set()

  def save_if_requested(self) -> None:
    """Saves and raises Preempted if a notice came; call between steps."""
    if self._requested.is_set():
      self._save_fn()
      raise Preempted()

  def run(self, step_fn: Callable[..., Any], *args) -> Any:
    self.save_if_requested()
    return step_fn(*args)

  def close(self) -> None:
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None


class MultiWorkerPreemptionWatcher:
  """TF's PreemptionCheckpointHandler, saving through our CheckpointStore.

  The handler insists on a CheckpointManager, which it restores from when it
  is created; we hand it one over an empty scratch dir (our store restores
  and saves, via `save_fn`) and turn its exit into a `Preempted` exception.
  """

  def __init__(self, strategy: tf.distribute.Strategy,
               checkpoint: tf.train.Checkpoint, save_fn: Callable[[], None]):
    self._scratch_dir = tempfile.mkdtemp(prefix='hpm-preemption-')
    manager = tf.train.CheckpointManager(checkpoint, self._scratch_dir,
                                         max_to_keep=1)
    config = tf.distribute.experimental.TerminationConfig(
        exit_fn=self._exit, save_fn=save_fn)
    self._handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        strategy.cluster_resolver, manager, termination_config=config)

  @staticmethod
  def _exit():
    raise Preempted()

  def run(self, step_fn: Callable[..., Any], *args) -> Any:
    """Runs one step; first saves and raises Preempted if the cluster agreed."""
    return self._handler.run(step_fn, *args)

  def close(self) -> None:
    # The handler stops its watcher threads in __del__.
    self._handler = None
    shutil.rmtree(self._scratch_dir, ignore_errors=True)

