"""The one step loop: calls a step runner, saves, stops on preemption.

Every kind of training (synchronous replicas, parameter servers, GPipe)
plugs a step runner (`step_runners`) into `drive`, which owns what they
share: how many steps each call runs (`CallSizer`), checkpoints at call
boundaries (a call never crosses a `save_every_steps` boundary, so the
checkpoint interval is exact), time-based saves that all workers agree on,
preemption notices, progress, step statistics and the final save.
"""

import math
import time
from typing import Any, Callable, Dict, Optional, Tuple

from components.trainer.checkpoint.checkpointer import Checkpointer
from components.trainer.managed import call_size
from components.trainer.managed import preemption


class StepStats:
  """Steps of this attempt and their steady rate (after the first call,
  which includes tracing; the periodic checkpoint waits are included).

  Where all steps ended at once (one call), there is no steady part: the
  rate then spans the whole attempt, tracing included, and
  `rate_includes_first_step` says so.
  """

  def __init__(self, start_step: int):
    self.start_step = start_step
    self.steps = 0
    self.began = time.monotonic()
    self.first_step_s = None
    self.first_step_time = None
    self.first = None  # (monotonic time, steps) when the first call ended.
    self.last = None
    # What ran, for the record: a call is cut at save boundaries and the
    # end, and 'auto' measures lengths before it chooses one.
    self.steps_by_call_length: Dict[int, int] = {}

  def steps_done(self, count: int) -> None:
    if not count:
      return
    self.steps += count
    self.steps_by_call_length[count] = (
        self.steps_by_call_length.get(count, 0) + count)
    now = time.monotonic()
    if self.first is None:
      self.first_step_s = now - self.began
      self.first_step_time = time.time()
      self.first = (now, self.steps)
    self.last = (now, self.steps)

  def rate(self) -> Tuple[float, bool]:
    """(steps per second, whether it spans the whole attempt)."""
    if self.first and self.last[1] > self.first[1]:
      return (self.last[1] - self.first[1]) / max(
          self.last[0] - self.first[0], 1e-9), False
    if self.first:
      return self.steps / max(self.first[0] - self.began, 1e-9), True
    return 0.0, False

  def elapsed(self) -> float:
    return time.monotonic() - self.began

  def summary(self, step: int, loss: float, preempted: bool) -> Dict[str, Any]:
    steps_per_sec, whole_attempt = self.rate()
    return {'steps': step, 'start_step': self.start_step,
            'steps_this_attempt': self.steps, 'train_loss': loss,
            'first_step_s': self.first_step_s,
            'first_step_time': self.first_step_time,
            'steps_per_sec': steps_per_sec,
            'rate_includes_first_step': whole_attempt,
            'steps_by_call_length': {
                str(k): n
                for k, n in sorted(self.steps_by_call_length.items())},
            'preempted': preempted}


def drive(runner: Callable, checkpointer: Checkpointer, watcher, *,
          start: int, train_steps: int, sizer: call_size.CallSizer,
          record_progress: Callable[[int, int, float, StepStats], None],
          any_worker: Callable[[bool], bool] = lambda flag: flag,
          read_step: Optional[Callable[[], int]] = None) -> Dict[str, Any]:
  """Trains from `start` to `train_steps`; returns the StepStats summary.

  Args:
    runner: `runner(current, k) -> (step reached, loss)` (step_runners).
    checkpointer: Saves and decides when a save is due.
    watcher: The preemption watcher (`watcher.run(fn, *args)` saves and
      raises Preempted at a call boundary once a notice came).
    start: The step training resumes at.
    train_steps: Optimizer updates in all.
    sizer: Steps per call.
    record_progress: Called with (previous step, step, loss, step stats)
      after a call.
    any_worker: Whether any worker of the cluster says yes (time-based saves
      must be agreed, saving runs collectives).
    read_step: The step counter's value, for the preempted summary.
  """
  stats = StepStats(start)
  checkpointer.last_save_time = time.monotonic()
  current, pending, loss = start, None, math.nan
  # The previous call, timed from its start to this one's less its save:
  # (steps, start, whether it measures its length: run at the asked length
  # and not its function's tracing call, seconds saving).
  timed = None
  traced = set()
  try:
    while current < train_steps:
      began, previous = time.monotonic(), current
      if timed:
        sizer.observe(timed[0], began - timed[1] - timed[3], previous,
                      measured=timed[2])
      next_save = checkpointer.next_save_step(current)
      asked = sizer.size()
      k = min(asked, train_steps - current,
              (next_save or train_steps) - current)
      # The first call of each traced function records no step for a while,
      # and its time is the trace's, not the calls'.
      function = runner.traced_function(k)
      first_of_function = function not in traced
      if first_of_function:
        traced.add(function)
        checkpointer.progress.pausing(current, 'tracing')
      current, call_loss = watcher.run(runner, current, k)
      stats.steps_done(current - previous)
      last = current >= train_steps
      if pending is not None:  # The previous call's, read after this one.
        loss = float(pending)
      pending = None if last else call_loss
      if last:
        loss = float(call_loss)
      # The last call always saves (a crash during eval or export then costs
      # nothing), before its progress is recorded.
      by_steps = next_save is not None and current >= next_save
      by_time = not by_steps and not last and bool(
          checkpointer.config.save_every_s and
          any_worker(checkpointer.due_by_time()))
      saved_s = 0.0
      if by_steps or by_time or last:
        saving = time.monotonic()
        checkpointer.save(current)
        saved_s = time.monotonic() - saving
      record_progress(previous, current, loss, stats)
      timed = (current - previous, began,
               k == asked and not first_of_function, saved_s)
  except preemption.Preempted:
    step = read_step() if read_step else current
    return stats.summary(step, loss, preempted=True)
  finally:
    watcher.close()
  return stats.summary(current, loss, preempted=False)
