"""The schedules' timing, simulated from per-stage task times.

Pure Python: the partitioner's planner and report predict a plan's step and
idle fraction with it, over the same task orders (`schedules`) the runtime
chains, so what is predicted is what runs.
"""

import dataclasses
import math
from typing import Sequence, Tuple

from components.pipeline_parallel import schedules


def bubble_fraction(num_stages: int, num_microbatches: int) -> float:
  """Idle fraction (K-1)/(M+K-1) of GPipe and 1F1B for balanced stages."""
  return (num_stages - 1) / (num_microbatches + num_stages - 1)


@dataclasses.dataclass(frozen=True)
class ScheduledTask:
  stage: int
  microbatch: int
  phase: str  # 'forward' or 'backward'
  start: float
  end: float


@dataclasses.dataclass(frozen=True)
class Schedule:
  tasks: Tuple[ScheduledTask, ...]
  makespan: float
  idle_fraction: float  # Of all stage-time in [0, makespan].


def simulate_schedule(forward_times: Sequence[float],
                      backward_times: Sequence[float],
                      num_microbatches: int,
                      schedule: str = schedules.GPIPE) -> Schedule:
  """Simulates `schedule` ('gpipe' or '1f1b', see `schedules`).

  Each stage runs its tasks one at a time in the schedule's order; forward
  (m, s) also waits for forward (m, s-1), backward (m, s) for backward
  (m, s+1). Times are per micro-batch (backward includes any
  recomputation).
  """
  num_stages = len(forward_times)
  if len(backward_times) != num_stages or num_stages == 0:
    raise ValueError('need one forward and one backward time per stage.')
  if num_microbatches < 1:
    raise ValueError('num_microbatches must be at least 1.')
  orders = schedules.stage_orders(schedule, num_stages, num_microbatches)
  free_at = [0.0] * num_stages
  end_of = {}
  tasks = []
  for s, phase, m in schedules.execution_order(orders):
    forward = phase == schedules.FORWARD
    start = max(free_at[s],
                end_of.get((s - 1 if forward else s + 1, phase, m), 0.0))
    end = start + (forward_times[s] if forward else backward_times[s])
    end_of[(s, phase, m)] = free_at[s] = end
    tasks.append(ScheduledTask(s, m, phase, start, end))
  makespan = max(free_at)
  busy = num_microbatches * (math.fsum(forward_times) +
                             math.fsum(backward_times))
  idle = 1.0 - busy / (num_stages * makespan) if makespan > 0 else 0.0
  return Schedule(tuple(tasks), makespan, idle)
