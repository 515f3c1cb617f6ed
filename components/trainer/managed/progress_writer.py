"""What the managed loop records of its progress after each call.

The chief hands its numbers to the checkpoint folder's `progress.json` (at
most once a second, through the checkpointer) and the loss to TensorBoard
(~100 points, written at most once a second: a flush to an object store
uploads the file again); every process logs a progress line every few
seconds. The numbers and the line are `common.progress`'s, which the
supervisor shares and which therefore has no TensorFlow.
"""

import contextlib
import functools
import math
import os
from typing import Callable, Iterator, Optional

import tensorflow as tf

from components.trainer.checkpoint.checkpointer import Checkpointer
from components.trainer.common import progress
from components.trainer.managed import driver

# The TensorBoard event file is flushed at most this often.
EVENTS_FLUSH_SECONDS = 1.0
# The loss goes to TensorBoard about this many times in a training.
LOSS_POINTS = 100
# So that the writer never flushes by itself: the loss adds at most
# ~LOSS_POINTS events in all, and training flushes within 10 minutes (TF
# keeps flush_millis in a 32-bit int).
_EVENTS_MAX_QUEUE = 1000
_EVENTS_FLUSH_MILLIS = 600_000

RecordProgress = Callable[[int, int, float, driver.StepStats], None]


class ProgressWriter:
  """The progress of one training, after each call of the loop."""

  def __init__(self, model_run_dir: Optional[str], train_steps: int,
               examples_per_step: int):
    """`model_run_dir`: where the chief's TensorBoard run goes (None: a
    process that is not the chief writes none)."""
    self.writer = (tf.summary.create_file_writer(
        os.path.join(model_run_dir, 'train'),
        max_queue=_EVENTS_MAX_QUEUE, flush_millis=_EVENTS_FLUSH_MILLIS)
                   if model_run_dir else None)
    self._train_steps = train_steps
    self._examples_per_step = examples_per_step
    self._events_due = progress.Every(EVENTS_FLUSH_SECONDS)
    self._line_due = progress.Every(progress.LINE_EVERY_SECONDS)

  @contextlib.contextmanager
  def recording(self, checkpointer: Checkpointer) -> Iterator[RecordProgress]:
    """`driver.drive`'s `record_progress`, with the writer the default all
    the while: leaving flushes it, once."""
    with (self.writer.as_default() if self.writer else
          contextlib.nullcontext()):
      yield functools.partial(self._record, checkpointer)

  def _record(self, checkpointer: Checkpointer, previous: int, current: int,
              loss: float, stats: driver.StepStats) -> None:
    steps_per_sec, whole_attempt = stats.rate()
    details = progress.details(
        step=current, train_steps=self._train_steps, loss=loss,
        steps_per_sec=steps_per_sec, steady=not whole_attempt,
        examples_per_step=self._examples_per_step, elapsed_s=stats.elapsed(),
        checkpoints=checkpointer.saves,
        last_checkpoint_step=checkpointer.last_save_step)
    checkpointer.progress.update(current, details)
    log_every = max(1, self._train_steps // LOSS_POINTS)
    if self.writer and current // log_every > previous // log_every and (
        not math.isnan(loss)):
      tf.summary.scalar('loss', loss, step=current)  # The default writer.
    if self.writer and self._events_due():
      self.writer.flush()
    if self._line_due() or current == self._train_steps:
      progress.LOGGER.info('%s', progress.format_line(
          {**details, 'step': current}))
