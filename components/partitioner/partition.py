"""Contiguous min-max partitioning of a layer sequence into pipeline stages.

Pure numpy; no TensorFlow, no TFX.

Model: layer i costs `costs[i]` (seconds per micro-batch) and holds
`layer_memory[i]` bytes; a stage that starts at cut a (the boundary before
layer a) additionally holds `cut_memory[a]` bytes (the tensors it receives).
A partition into K stages is given by its boundaries
0 = b_0 < b_1 < ... < b_K = n, stage s holding layers [b_s, b_{s+1}).

`optimal_partition` returns a partition minimizing the slowest stage among
all partitions into exactly K non-empty stages whose every stage fits the
memory budget. It is an exact dynamic program over all segments,

  best[k][c] = min over a < c of max(best[k-1][a], cost(a, c))
               restricted to segments with memory(a, c) <= budget,

vectorized over (a, c), so it takes O(K n^2) time and O(n^2) memory (about
0.1 s for 1,000 layers x 64 stages). An exact DP rather than the classic
binary search with a greedy feasibility test because `cut_memory` makes a
segment's memory non-monotone in its start: splitting a feasible stage can
produce an infeasible one, so "greedy fits in at most K stages" does not
imply "fits in exactly K non-empty stages".
"""

import dataclasses
import math
from typing import List, Optional, Sequence, Tuple

import numpy as np

from components.pipeline_parallel import schedules


class InfeasibleBudgetError(ValueError):
  """No partition fits the memory budget; carries the smallest that works."""

  def __init__(self, budget: float, min_budget: float, num_stages: int):
    self.budget = budget
    self.min_budget = min_budget
    super().__init__(
        f'no partition into {num_stages} stages fits the memory budget of '
        f'{budget:,.0f} bytes per device; the smallest budget that works is '
        f'{math.ceil(min_budget):,d} bytes. Raise memory_budget_bytes, add '
        'stages, or use re-materialization.')


@dataclasses.dataclass(frozen=True)
class Partition:
  """Stage boundaries with each stage's cost and memory."""
  boundaries: Tuple[int, ...]
  stage_costs: Tuple[float, ...]
  stage_memory: Tuple[float, ...]

  @property
  def num_stages(self) -> int:
    return len(self.boundaries) - 1

  @property
  def bottleneck(self) -> float:
    """Cost of the slowest stage: what bounds the pipeline's throughput."""
    return max(self.stage_costs)

  @property
  def peak_memory(self) -> float:
    return max(self.stage_memory)


def _as_arrays(costs, layer_memory, cut_memory):
  costs = np.asarray(costs, dtype=np.float64)
  n = costs.shape[0]
  if costs.ndim != 1 or n == 0:
    raise ValueError('costs must be a non-empty 1-D sequence.')
  if not np.all(np.isfinite(costs)) or np.any(costs < 0):
    raise ValueError('costs must be finite and non-negative.')
  layer_memory = (np.zeros(n) if layer_memory is None else
                  np.asarray(layer_memory, dtype=np.float64))
  cut_memory = (np.zeros(n + 1) if cut_memory is None else
                np.asarray(cut_memory, dtype=np.float64))
  if layer_memory.shape != (n,):
    raise ValueError(f'layer_memory needs {n} entries, one per layer.')
  if cut_memory.shape != (n + 1,):
    raise ValueError(f'cut_memory needs {n + 1} entries, one per cut.')
  if np.any(layer_memory < 0) or np.any(cut_memory < 0):
    raise ValueError('memory must be non-negative.')
  return costs, layer_memory, cut_memory


def _check_num_stages(num_stages: int, num_layers: int) -> None:
  if not isinstance(num_stages, int) or num_stages < 1:
    raise ValueError(f'num_stages must be a positive int, got {num_stages!r}.')
  if num_stages > num_layers:
    raise ValueError(
        f'num_stages {num_stages} exceeds the number of layers {num_layers}; '
        'every stage needs at least one layer.')


def evaluate(boundaries: Sequence[int],
             costs: Sequence[float],
             layer_memory: Optional[Sequence[float]] = None,
             cut_memory: Optional[Sequence[float]] = None) -> Partition:
  """Costs and memory of the stages given by `boundaries`."""
  costs, layer_memory, cut_memory = _as_arrays(costs, layer_memory,
                                               cut_memory)
  boundaries = tuple(int(b) for b in boundaries)
  n = costs.shape[0]
  if (len(boundaries) < 2 or boundaries[0] != 0 or boundaries[-1] != n or
      any(a >= b for a, b in zip(boundaries, boundaries[1:]))):
    raise ValueError(
        f'boundaries must rise strictly from 0 to {n}, got {boundaries}.')
  spans = list(zip(boundaries, boundaries[1:]))
  return Partition(
      boundaries=boundaries,
      stage_costs=tuple(math.fsum(costs[a:c]) for a, c in spans),
      stage_memory=tuple(
          math.fsum(layer_memory[a:c]) + cut_memory[a] for a, c in spans))


_COLUMN_BLOCK = 128  # Keeps each block's working set in cache.


def _min_max_dp(segment_value: np.ndarray, allowed: np.ndarray,
                num_stages: int) -> Tuple[float, List[int]]:
  """Minimizes the largest segment value over exactly K-segment paths.

  `segment_value[a, c]` is the value of the segment [a, c); `allowed` masks
  the segments that may be used (only a < c ever is). Returns (optimum,
  boundaries); the optimum is inf when no path exists.
  """
  n = segment_value.shape[0] - 1
  value = np.where(allowed, segment_value, np.inf)
  best = [value[0].copy()]  # best[k][c]: k+1 stages covering [0, c).
  for _ in range(1, num_stages):
    previous, current = best[-1], np.full(n + 1, np.inf)
    for first in range(1, n + 1, _COLUMN_BLOCK):
      last = min(first + _COLUMN_BLOCK, n + 1)
      # Segments [a, c) with c in the block need a < c < last.
      current[first:last] = np.maximum(previous[:last - 1, None],
                                       value[:last - 1, first:last]).min(0)
    best.append(current)
  optimum = float(best[-1][n])
  if not math.isfinite(optimum):
    return optimum, []
  boundaries = [n]
  for k in range(num_stages - 1, 0, -1):
    end = boundaries[-1]
    boundaries.append(int(np.argmin(
        np.maximum(best[k - 1][:end], value[:end, end]))))
  boundaries.append(0)
  return optimum, boundaries[::-1]


def optimal_partition(costs: Sequence[float],
                      num_stages: int,
                      layer_memory: Optional[Sequence[float]] = None,
                      cut_memory: Optional[Sequence[float]] = None,
                      memory_budget: Optional[float] = None) -> Partition:
  """Exact minimum of the slowest stage, subject to the memory budget.

  Raises:
    ValueError: bad inputs, or more stages than layers.
    InfeasibleBudgetError: no partition fits `memory_budget`; the error names
      the smallest budget for which one exists.
  """
  costs, layer_memory, cut_memory = _as_arrays(costs, layer_memory,
                                               cut_memory)
  n = costs.shape[0]
  _check_num_stages(num_stages, n)
  cost_prefix = np.concatenate([[0.0], np.cumsum(costs)])
  memory_prefix = np.concatenate([[0.0], np.cumsum(layer_memory)])
  starts = np.arange(n + 1)[:, None]
  ends = np.arange(n + 1)[None, :]
  non_empty = starts < ends
  segment_cost = cost_prefix[None, :] - cost_prefix[:, None]
  segment_memory = (memory_prefix[None, :] - memory_prefix[:, None] +
                    cut_memory[:, None])
  allowed = non_empty
  if memory_budget is not None:
    allowed = non_empty & (segment_memory <= memory_budget)
  _, boundaries = _min_max_dp(segment_cost, allowed, num_stages)
  if not boundaries:
    min_budget, _ = _min_max_dp(segment_memory, non_empty, num_stages)
    raise InfeasibleBudgetError(memory_budget, min_budget, num_stages)
  return evaluate(boundaries, costs, layer_memory, cut_memory)


def uniform_boundaries(num_layers: int, num_stages: int) -> Tuple[int, ...]:
  """Equal layer counts per stage (the naive split), ignoring costs."""
  _check_num_stages(num_stages, num_layers)
  return tuple(int(round(s * num_layers / num_stages))
               for s in range(num_stages + 1))


def block_boundaries(costs: Sequence[float],
                     num_stages: int) -> Tuple[int, ...]:
  """Block-partition heuristic of Barany and Grinberg (arXiv:1308.2452).

  With costs scaled into [0, 1] and starting from the uniform split: fix a
  heaviest block p; repeatedly take a lightest block q closest to p and move
  into it the adjacent layer of its neighbour h on p's side, until
  heaviest <= lightest + 1 (one largest layer). This is the balancing
  torchgpipe uses: fast, not optimal. A move that would empty a block stops
  the search instead, so every stage keeps a layer.
  """
  costs = np.asarray(costs, dtype=np.float64)
  n = costs.shape[0]
  boundaries = list(uniform_boundaries(n, num_stages))
  scale = costs.max() if costs.max() > 0 else 1.0
  prefix = np.concatenate([[0.0], np.cumsum(costs / scale)])

  def sizes():
    return [prefix[boundaries[i + 1]] - prefix[boundaries[i]]
            for i in range(num_stages)]

  # The paper proves termination; the cap only guards against float
  # round-off making a move undo a previous one forever.
  moves_left = n * n * num_stages
  while moves_left > 0:
    heaviest = int(np.argmax(sizes()))
    while moves_left > 0:
      moves_left -= 1
      current = sizes()
      lightest_size = min(current)
      if current[heaviest] <= lightest_size + 1:
        return tuple(boundaries)
      lightest = min(
          (i for i in range(num_stages) if current[i] == lightest_size),
          key=lambda i: abs(i - heaviest))
      if heaviest < lightest:  # Move the last layer of block q-1 into q.
        donor, cut, step = lightest - 1, lightest, -1
      else:  # Move the first layer of block q+1 into q.
        donor, cut, step = lightest + 1, lightest + 1, 1
      boundaries[cut] += step
      if boundaries[donor] == boundaries[donor + 1]:
        boundaries[cut] -= step
        return tuple(boundaries)
      if donor == heaviest:
        break
  return tuple(boundaries)


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
