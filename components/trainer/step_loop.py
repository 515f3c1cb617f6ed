"""The one step loop: calls a step runner, saves, stops on preemption.

Every kind of training (synchronous replicas, parameter servers, GPipe)
plugs a step runner (`step_runners`) into `drive`, which owns what they
share: how many steps each call runs (`CallSizer`), checkpoints at call
boundaries (a call never crosses a `save_every_steps` boundary, so the
checkpoint interval is exact), time-based saves that all workers agree on,
preemption notices, progress, step statistics and the final save.
"""

import math
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from absl import logging

from components.trainer import preemption
from components.trainer.checkpoint.checkpointer import Checkpointer
from components.trainer.config import AUTO

# 'auto' tries these steps per call, in order, while the time per step keeps
# improving by at least AUTO_GAIN.
AUTO_CANDIDATES = (1, 4, 16, 64, 256, 1024)
AUTO_GAIN = 1.05
# Calls measured per candidate; a fixed count keeps the workers of a
# multi-worker cluster in lockstep (they agree on each decision).
AUTO_CALLS_PER_CANDIDATE = 3
# 'auto' keeps a call this short, so that a preemption notice, a time-based
# save or a progress line waits at most about this long.
AUTO_MAX_CALL_SECONDS = 0.5


class CallSizer:
  """Steps per call: a fixed number, or 'auto', which measures and picks.

  'auto' starts at one step per call and moves to the next candidate while
  the measured time per step improves by AUTO_GAIN and a call stays under
  AUTO_MAX_CALL_SECONDS; the measurement calls are real training steps.
  The first call (tracing) is not measured.
  """

  def __init__(self, setting: Union[int, str],
               agree: Callable[[bool], bool] = lambda flag: flag):
    self._agree = agree
    self.searching = setting == AUTO
    self._index = 0
    self.chosen = AUTO_CANDIDATES[0] if self.searching else int(setting)
    self._calls: List[float] = []  # Seconds per step of this candidate.
    self._traced = not self.searching
    self.measured: Dict[int, float] = {}

  def size(self) -> int:
    return AUTO_CANDIDATES[self._index] if self.searching else self.chosen

  def observe(self, steps: int, seconds: float) -> None:
    """One measured call of `steps` steps (only while searching)."""
    if not self._traced:
      self._traced = True
      return
    self._calls.append(seconds / max(steps, 1))
    if len(self._calls) < AUTO_CALLS_PER_CANDIDATE:
      return
    candidate = AUTO_CANDIDATES[self._index]
    self.measured[candidate] = statistics.median(self._calls)
    self._calls = []
    best = min(self.measured, key=self.measured.get)
    before = [v for k, v in self.measured.items() if k != candidate]
    improved = not before or self.measured[candidate] * AUTO_GAIN <= min(
        before)
    nxt = self._index + 1
    go_on = (improved and nxt < len(AUTO_CANDIDATES) and
             AUTO_CANDIDATES[nxt] * self.measured[candidate] <=
             AUTO_MAX_CALL_SECONDS)
    if self._agree(go_on):
      self._index = nxt
      return
    self.searching = False
    self.chosen = best
    logging.info('steps_per_execution=auto chose %d steps per call '
                 '(seconds per step by steps per call: %s).', best,
                 {k: round(v, 7) for k, v in self.measured.items()})

  def describe(self) -> Dict[str, Any]:
    return {'steps_per_execution': self.chosen,
            'seconds_per_step_by_steps_per_execution': {
                str(k): v for k, v in self.measured.items()}}


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
    self.first_step_seconds = None
    self.first_step_time = None
    self.first = None  # (monotonic time, steps) when the first call ended.
    self.last = None

  def steps_done(self, count: int) -> None:
    if not count:
      return
    self.steps += count
    now = time.monotonic()
    if self.first is None:
      self.first_step_seconds = now - self.began
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
            'first_step_seconds': self.first_step_seconds,
            'first_step_time': self.first_step_time,
            'steps_per_sec': steps_per_sec,
            'rate_includes_first_step': whole_attempt,
            'preempted': preempted}


def drive(runner: Callable, checkpointer: Checkpointer, watcher, *,
          start: int, train_steps: int, sizer: CallSizer,
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
  try:
    while current < train_steps:
      next_save = checkpointer.next_save_step(current)
      k = min(sizer.size(), train_steps - current,
              (next_save or train_steps) - current)
      began, previous = time.monotonic(), current
      current, call_loss = watcher.run(runner, current, k)
      if sizer.searching:
        float(call_loss)  # Wait for the call, to time it.
        sizer.observe(current - previous, time.monotonic() - began)
      stats.steps_done(current - previous)
      last = current >= train_steps
      if pending is not None:  # The previous call's, read after this one.
        loss = float(pending)
      pending = None if last else call_loss
      if last:
        loss = float(call_loss)
      # The last call always saves (a crash during eval or export then costs
      # nothing), before its progress is recorded.
      if (next_save is not None and current >= next_save) or (
          checkpointer.config.save_every_seconds and
          any_worker(checkpointer.due_by_time())) or last:
        checkpointer.save(current)
      record_progress(previous, current, loss, stats)
  except preemption.Preempted:
    step = read_step() if read_step else current
    return stats.summary(step, loss, preempted=True)
  finally:
    watcher.close()
  return stats.summary(current, loss, preempted=False)
