"""Contiguous min-max partitioning of a layer sequence into pipeline stages.

Pure numpy; no TensorFlow, no TFX.

Model: layer i costs `costs[i]` (seconds per micro-batch) and holds
`layer_memory[i]` bytes; a stage that starts at cut a (the boundary before
layer a) additionally holds `cut_memory[a]` bytes (the tensors it receives).
Each may instead be given per stage (a row per stage): under 1F1B a stage's
memory depends on its position in the pipeline.
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
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np



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


def _stage_rows(values, width: int, num_stages: int, name: str,
                what: str) -> np.ndarray:
  """(1 or K, width) float array: one row for all stages, or one per stage."""
  values = np.asarray(values, dtype=np.float64)
  if values.ndim == 1:
    values = values[None, :]
  if (values.ndim != 2 or values.shape[1] != width or
      values.shape[0] not in (1, num_stages)):
    raise ValueError(
        f'{name} needs {width} entries, one per {what}, or a row of them per '
        f'stage ({num_stages} rows); got shape {values.shape}.')
  return values


def _as_arrays(costs, layer_memory, cut_memory, num_stages: int):
  """Costs and memory as (1 or K, n) and (1 or K, n+1) rows.

  A 1-D input applies to every stage; K rows make a stage's cost or memory
  depend on its position (1F1B keeps K-s micro-batches in flight on stage
  s).
  """
  costs = np.asarray(costs, dtype=np.float64)
  if costs.ndim not in (1, 2) or costs.shape[-1] == 0:
    raise ValueError('costs must be a non-empty 1-D sequence (or a row per '
                     'stage).')
  n = costs.shape[-1]
  costs = _stage_rows(costs, n, num_stages, 'costs', 'layer')
  if not np.all(np.isfinite(costs)) or np.any(costs < 0):
    raise ValueError('costs must be finite and non-negative.')
  layer_memory = _stage_rows(
      np.zeros(n) if layer_memory is None else layer_memory, n, num_stages,
      'layer_memory', 'layer')
  cut_memory = _stage_rows(
      np.zeros(n + 1) if cut_memory is None else cut_memory, n + 1,
      num_stages, 'cut_memory', 'cut')
  if np.any(layer_memory < 0) or np.any(cut_memory < 0):
    raise ValueError('memory must be non-negative.')
  return costs, layer_memory, cut_memory


def _row(values: np.ndarray, stage: int) -> np.ndarray:
  return values[min(stage, values.shape[0] - 1)]


def _check_num_stages(num_stages: int, num_layers: int) -> None:
  if not isinstance(num_stages, int) or num_stages < 1:
    raise ValueError(f'num_stages must be a positive int, got {num_stages!r}.')
  if num_stages > num_layers:
    raise ValueError(
        f'num_stages {num_stages} exceeds the number of layers {num_layers}; '
        'every stage needs at least one layer.')


def evaluate(boundaries: Sequence[int],
             costs,
             layer_memory=None,
             cut_memory=None) -> Partition:
  """Costs and memory of the stages given by `boundaries`.

  Each of costs, layer_memory, cut_memory is one row for all stages or one
  row per stage (see `_as_arrays`).
  """
  boundaries = tuple(int(b) for b in boundaries)
  num_stages = max(len(boundaries) - 1, 1)
  costs, layer_memory, cut_memory = _as_arrays(costs, layer_memory,
                                               cut_memory, num_stages)
  n = costs.shape[1]
  if (len(boundaries) < 2 or boundaries[0] != 0 or boundaries[-1] != n or
      any(a >= b for a, b in zip(boundaries, boundaries[1:]))):
    raise ValueError(
        f'boundaries must rise strictly from 0 to {n}, got {boundaries}.')
  spans = list(enumerate(zip(boundaries, boundaries[1:])))
  return Partition(
      boundaries=boundaries,
      stage_costs=tuple(math.fsum(_row(costs, s)[a:c]) for s, (a, c) in spans),
      stage_memory=tuple(
          math.fsum(_row(layer_memory, s)[a:c]) + _row(cut_memory, s)[a]
          for s, (a, c) in spans))


_COLUMN_BLOCK = 128  # Keeps each block's working set in cache.


def _min_max_dp(stage_values: Callable[[int], np.ndarray],
                num_stages: int) -> Tuple[float, List[int]]:
  """Minimizes the largest segment value over exactly K-segment paths.

  `stage_values(k)[a, c]` is the value of the segment [a, c) as stage k,
  inf where that segment may not be used (only a < c ever is). Returns
  (optimum, boundaries); the optimum is inf when no path exists.
  """
  value = stage_values(0)
  n = value.shape[0] - 1
  best = [value[0].copy()]  # best[k][c]: k+1 stages covering [0, c).
  for k in range(1, num_stages):
    value = stage_values(k)
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
        np.maximum(best[k - 1][:end], stage_values(k)[:end, end]))))
  boundaries.append(0)
  return optimum, boundaries[::-1]


def _segment_matrices(costs, layer_memory, cut_memory):
  """Per stage k: (cost of [a, c), memory of [a, c)) as (n+1)^2 matrices."""
  n = costs.shape[1]
  cost_prefix = np.concatenate([np.zeros((costs.shape[0], 1)),
                                np.cumsum(costs, axis=1)], axis=1)
  memory_prefix = np.concatenate([np.zeros((layer_memory.shape[0], 1)),
                                  np.cumsum(layer_memory, axis=1)], axis=1)
  non_empty = np.arange(n + 1)[:, None] < np.arange(n + 1)[None, :]

  def matrices(k):
    cost_row, memory_row = _row(cost_prefix, k), _row(memory_prefix, k)
    return (cost_row[None, :] - cost_row[:, None],
            memory_row[None, :] - memory_row[:, None] +
            _row(cut_memory, k)[:, None])

  return non_empty, matrices


def _per_stage(fn: Callable[[int], np.ndarray], shared: bool):
  """`fn`, computed once when every stage has the same inputs."""
  if not shared:
    return fn
  value = fn(0)
  return lambda k: value


def optimal_partition(costs,
                      num_stages: int,
                      layer_memory=None,
                      cut_memory=None,
                      memory_budget: Optional[float] = None) -> Partition:
  """Exact minimum of the slowest stage, subject to the memory budget.

  Each of costs, layer_memory, cut_memory is one row for all stages or one
  row per stage (see `_as_arrays`).

  Raises:
    ValueError: bad inputs, or more stages than layers.
    InfeasibleBudgetError: no partition fits `memory_budget`; the error names
      the smallest budget for which one exists.
  """
  if not isinstance(num_stages, int) or num_stages < 1:
    raise ValueError(f'num_stages must be a positive int, got {num_stages!r}.')
  costs, layer_memory, cut_memory = _as_arrays(costs, layer_memory,
                                               cut_memory, num_stages)
  _check_num_stages(num_stages, costs.shape[1])
  non_empty, matrices = _segment_matrices(costs, layer_memory, cut_memory)
  shared = max(costs.shape[0], layer_memory.shape[0],
               cut_memory.shape[0]) == 1

  def costs_within_budget(k):
    cost, memory = matrices(k)
    allowed = non_empty if memory_budget is None else (
        non_empty & (memory <= memory_budget))
    return np.where(allowed, cost, np.inf)

  _, boundaries = _min_max_dp(_per_stage(costs_within_budget, shared),
                              num_stages)
  if not boundaries:
    min_budget, _ = _min_max_dp(_per_stage(
        lambda k: np.where(non_empty, matrices(k)[1], np.inf), shared),
                                num_stages)
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
