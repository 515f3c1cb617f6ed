"""The min-max partitioner against brute force, budgets, heuristics, schedule.

Pure numpy, no TensorFlow: runs in about a second.
"""

import itertools
import math
import re

import numpy as np
import pytest

from components.partitioner import partition

REL_TOL = 1e-9


def _brute_force(costs, num_stages, layer_memory, cut_memory, budget):
  """(best bottleneck, smallest feasible budget) over every partition."""
  n = len(costs)
  best, min_budget = math.inf, math.inf
  for cuts in itertools.combinations(range(1, n), num_stages - 1):
    boundaries = (0, *cuts, n)
    spans = list(zip(boundaries, boundaries[1:]))
    memory = max(math.fsum(layer_memory[a:c]) + cut_memory[a]
                 for a, c in spans)
    min_budget = min(min_budget, memory)
    if budget is not None and memory > budget:
      continue
    best = min(best, max(math.fsum(costs[a:c]) for a, c in spans))
  return best, min_budget


def _random_case(rng, heterogeneous):
  n = int(rng.integers(1, 13))
  num_stages = int(rng.integers(1, min(5, n) + 1))
  costs = rng.uniform(0.1, 1.0, n)
  if heterogeneous:
    heavy = rng.choice(n, size=min(n, int(rng.integers(1, 4))), replace=False)
    costs[heavy] *= 50.0
  layer_memory = rng.integers(0, 1000, n).astype(float)
  cut_memory = rng.integers(0, 3000, n + 1).astype(float)
  return costs, num_stages, layer_memory, cut_memory


def _assert_valid(result, n, num_stages):
  boundaries = result.boundaries
  assert len(boundaries) == num_stages + 1
  assert boundaries[0] == 0 and boundaries[-1] == n
  assert all(a < b for a, b in zip(boundaries, boundaries[1:])), boundaries


@pytest.mark.parametrize('heterogeneous', [False, True])
def test_optimal_without_budget_matches_brute_force(heterogeneous):
  rng = np.random.default_rng(11 + heterogeneous)
  for _ in range(300):
    costs, k, _, _ = _random_case(rng, heterogeneous)
    result = partition.optimal_partition(costs, k)
    _assert_valid(result, len(costs), k)
    expected, _ = _brute_force(costs, k, [0.0] * len(costs),
                               [0.0] * (len(costs) + 1), None)
    assert result.bottleneck == pytest.approx(expected, rel=REL_TOL)


@pytest.mark.parametrize('heterogeneous', [False, True])
def test_optimal_with_budget_matches_brute_force(heterogeneous):
  rng = np.random.default_rng(23 + heterogeneous)
  feasible = infeasible = 0
  for _ in range(400):
    costs, k, layer_memory, cut_memory = _random_case(rng, heterogeneous)
    _, min_budget = _brute_force(costs, k, layer_memory, cut_memory, None)
    # Budgets from a bit below the smallest feasible one to generous.
    budget = float(rng.uniform(0.8, 1.6) * min_budget)
    expected, _ = _brute_force(costs, k, layer_memory, cut_memory, budget)
    if math.isinf(expected):
      infeasible += 1
      with pytest.raises(partition.InfeasibleBudgetError) as error:
        partition.optimal_partition(costs, k, layer_memory, cut_memory,
                                    budget)
      assert error.value.min_budget == pytest.approx(min_budget)
      continue
    feasible += 1
    result = partition.optimal_partition(costs, k, layer_memory, cut_memory,
                                         budget)
    _assert_valid(result, len(costs), k)
    assert result.peak_memory <= budget
    assert result.bottleneck == pytest.approx(expected, rel=REL_TOL)
  # Both outcomes were exercised many times.
  assert feasible > 100 and infeasible > 50, (feasible, infeasible)


def test_budget_that_only_fits_non_greedy_split():
  # Big tensors cross cuts 1 and 3: a greedy "fill each stage up to the
  # budget" split cuts there and fails; the optimum avoids those cuts.
  costs = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
  layer_memory = [10.0] * 6
  cut_memory = [0.0, 500.0, 0.0, 500.0, 0.0, 0.0, 0.0]
  result = partition.optimal_partition(costs, 3, layer_memory, cut_memory,
                                       memory_budget=30.0)
  assert result.boundaries == (0, 2, 4, 6)
  assert result.peak_memory == 20.0


def test_infeasible_budget_message_names_smallest_budget():
  costs = [1.0, 1.0, 1.0]
  layer_memory = [100.0, 300.0, 100.0]
  with pytest.raises(partition.InfeasibleBudgetError) as error:
    partition.optimal_partition(costs, 2, layer_memory, None,
                                memory_budget=250.0)
  assert error.value.min_budget == 400.0
  assert re.search(r'smallest budget that works is 400 bytes',
                   str(error.value)), str(error.value)
  # And that budget does work.
  result = partition.optimal_partition(costs, 2, layer_memory, None,
                                       memory_budget=400.0)
  assert result.peak_memory == 400.0


def test_zero_costs_still_give_non_empty_stages():
  result = partition.optimal_partition([0.0] * 7, 7)
  assert result.boundaries == tuple(range(8))
  assert result.bottleneck == 0.0


@pytest.mark.parametrize('num_stages', [0, 4, -1])
def test_bad_stage_counts_are_rejected(num_stages):
  with pytest.raises(ValueError, match='num_stages'):
    partition.optimal_partition([1.0, 2.0, 3.0], num_stages)


@pytest.mark.parametrize('costs', [[], [1.0, -1.0], [1.0, math.nan]])
def test_bad_costs_are_rejected(costs):
  with pytest.raises(ValueError, match='costs'):
    partition.optimal_partition(costs, 1)


def test_thousand_layers_sixty_four_stages():
  rng = np.random.default_rng(5)
  costs = rng.uniform(1.0, 2.0, 1000)
  costs[rng.choice(1000, 20, replace=False)] *= 50.0
  layer_memory = rng.integers(1, 100, 1000).astype(float)
  cut_memory = rng.integers(0, 100, 1001).astype(float)
  free = partition.optimal_partition(costs, 64)
  _assert_valid(free, 1000, 64)
  # No partition beats the largest layer or the average stage.
  assert free.bottleneck >= max(costs.max(), costs.sum() / 64) - 1e-9
  # The exact optimum is at least as good as both heuristics.
  for boundaries in (partition.uniform_boundaries(1000, 64),
                     partition.block_boundaries(costs, 64)):
    assert free.bottleneck <= partition.evaluate(boundaries,
                                                 costs).bottleneck
  budget = 0.5 * partition.evaluate(free.boundaries, costs, layer_memory,
                                    cut_memory).peak_memory
  constrained = partition.optimal_partition(costs, 64, layer_memory,
                                            cut_memory, budget)
  _assert_valid(constrained, 1000, 64)
  assert constrained.peak_memory <= budget
  assert constrained.bottleneck >= free.bottleneck


def test_heuristics_are_valid_and_never_beat_the_optimum():
  rng = np.random.default_rng(7)
  for _ in range(200):
    costs, k, _, _ = _random_case(rng, heterogeneous=True)
    optimum = partition.optimal_partition(costs, k).bottleneck
    for boundaries in (partition.uniform_boundaries(len(costs), k),
                       partition.block_boundaries(costs, k)):
      result = partition.evaluate(boundaries, costs)
      _assert_valid(result, len(costs), k)
      assert result.bottleneck >= optimum * (1 - REL_TOL)


def test_block_partition_moves_off_the_uniform_split():
  costs = [5.0, 5.0, 5.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
  assert partition.uniform_boundaries(9, 3) == (0, 3, 6, 9)
  block = partition.evaluate(partition.block_boundaries(costs, 3), costs)
  assert block.bottleneck < partition.evaluate((0, 3, 6, 9), costs).bottleneck
  # Its stopping rule: heaviest <= lightest + the largest layer.
  assert max(block.stage_costs) <= min(block.stage_costs) + max(costs)


def test_evaluate_rejects_bad_boundaries():
  with pytest.raises(ValueError, match='boundaries'):
    partition.evaluate((0, 2, 2, 4), [1.0] * 4)
  with pytest.raises(ValueError, match='boundaries'):
    partition.evaluate((0, 3), [1.0] * 4)


@pytest.mark.parametrize('num_stages,num_microbatches', [(1, 1), (2, 4),
                                                         (4, 16), (5, 3)])
def test_balanced_schedule_idles_exactly_the_gpipe_bubble(
    num_stages, num_microbatches):
  forward, backward = 1.0, 2.0
  schedule = partition.gpipe_schedule([forward] * num_stages,
                                      [backward] * num_stages,
                                      num_microbatches)
  assert schedule.makespan == pytest.approx(
      (num_microbatches + num_stages - 1) * (forward + backward))
  assert schedule.idle_fraction == pytest.approx(
      partition.bubble_fraction(num_stages, num_microbatches))
  assert len(schedule.tasks) == 2 * num_stages * num_microbatches


def test_schedule_respects_dependencies_and_one_task_per_stage():
  schedule = partition.gpipe_schedule([1.0, 3.0, 2.0], [2.0, 5.0, 1.0], 4)
  end = {(t.stage, t.microbatch, t.phase): t.end for t in schedule.tasks}
  for task in schedule.tasks:
    if task.phase == 'forward' and task.stage > 0:
      assert task.start >= end[(task.stage - 1, task.microbatch, 'forward')]
    if task.phase == 'backward':
      assert task.start >= end[(task.stage, task.microbatch, 'forward')]
      if task.stage < 2:
        assert task.start >= end[(task.stage + 1, task.microbatch,
                                  'backward')]
  for stage in range(3):
    spans = sorted((t.start, t.end) for t in schedule.tasks
                   if t.stage == stage)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in
               zip(spans, spans[1:]))
  # The slow middle stage makes the real idle time exceed the formula.
  assert schedule.idle_fraction > partition.bubble_fraction(3, 4)
