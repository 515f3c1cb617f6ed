"""The min-max partitioner against brute force, budgets, heuristics, schedule.

Pure numpy, no TensorFlow: runs in about a second.
"""

import itertools
import math
import re

import numpy as np
import pytest

from components.partitioner import partition
from components.pipeline_parallel import schedules
from components.pipeline_parallel import simulator

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


def test_per_stage_costs_and_memory_match_brute_force():
  """Rows per stage (1F1B's memory depends on the stage's position)."""
  rng = np.random.default_rng(23)
  for _ in range(150):
    costs, k, layer_memory, cut_memory = _random_case(rng, True)
    n = len(costs)
    scale = rng.uniform(0.5, 3.0, (k, 1))
    stage_costs, stage_layers = costs[None] * scale, layer_memory[None] * scale
    stage_cuts = cut_memory[None] * scale[::-1]
    best, min_budget = math.inf, math.inf
    budget = float(rng.uniform(500, 6000))
    for cuts in itertools.combinations(range(1, n), k - 1):
      spans = list(enumerate(zip((0, *cuts), (*cuts, n))))
      memory = max(stage_layers[s, a:c].sum() + stage_cuts[s, a]
                   for s, (a, c) in spans)
      min_budget = min(min_budget, memory)
      if memory <= budget:
        best = min(best, max(stage_costs[s, a:c].sum() for s, (a, c) in spans))
    if math.isinf(best):
      with pytest.raises(partition.InfeasibleBudgetError) as error:
        partition.optimal_partition(stage_costs, k, stage_layers, stage_cuts,
                                    budget)
      assert error.value.min_budget == pytest.approx(min_budget)
      continue
    result = partition.optimal_partition(stage_costs, k, stage_layers,
                                         stage_cuts, budget)
    _assert_valid(result, n, k)
    assert result.bottleneck == pytest.approx(best, rel=REL_TOL)
    assert result.peak_memory <= budget


def test_per_stage_rows_need_one_row_per_stage():
  with pytest.raises(ValueError, match=r'costs needs 4 entries, one per '
                     r'layer, or a row of them per stage \(3 rows\); got '
                     r'shape \(2, 4\)'):
    partition.optimal_partition(np.ones((2, 4)), 3)


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


@pytest.mark.parametrize('schedule', schedules.SCHEDULES)
@pytest.mark.parametrize('num_stages,num_microbatches', [(1, 1), (2, 4),
                                                         (4, 16), (5, 3),
                                                         (3, 1), (4, 8)])
def test_balanced_schedule_idles_exactly_the_bubble(
    num_stages, num_microbatches, schedule):
  forward, backward = 1.0, 2.0
  simulated = simulator.simulate_schedule([forward] * num_stages,
                                          [backward] * num_stages,
                                          num_microbatches, schedule)
  assert simulated.makespan == pytest.approx(
      (num_microbatches + num_stages - 1) * (forward + backward))
  assert simulated.idle_fraction == pytest.approx(
      simulator.bubble_fraction(num_stages, num_microbatches))
  assert len(simulated.tasks) == 2 * num_stages * num_microbatches


@pytest.mark.parametrize('schedule', schedules.SCHEDULES)
def test_schedule_respects_dependencies_and_one_task_per_stage(schedule):
  simulated = simulator.simulate_schedule([1.0, 3.0, 2.0], [2.0, 5.0, 1.0],
                                          4, schedule)
  end = {(t.stage, t.microbatch, t.phase): t.end for t in simulated.tasks}
  for task in simulated.tasks:
    if task.phase == 'forward' and task.stage > 0:
      assert task.start >= end[(task.stage - 1, task.microbatch, 'forward')]
    if task.phase == 'backward':
      assert task.start >= end[(task.stage, task.microbatch, 'forward')]
      if task.stage < 2:
        assert task.start >= end[(task.stage + 1, task.microbatch,
                                  'backward')]
  for stage in range(3):
    tasks = sorted((t for t in simulated.tasks if t.stage == stage),
                   key=lambda t: t.start)
    assert all(a.end <= b.start for a, b in zip(tasks, tasks[1:]))
    # Each stage runs its tasks in the schedule's order.
    assert [(t.phase, t.microbatch) for t in tasks] == schedules.stage_order(
        schedule, 3, 4, stage)
  # The slow middle stage makes the real idle time exceed the formula.
  assert simulated.idle_fraction > simulator.bubble_fraction(3, 4)


def test_1f1b_orders_warm_up_alternate_and_cool_down():
  f, b = schedules.FORWARD, schedules.BACKWARD
  # K=3, M=4: stage 0 warms up with 2 forwards, stage 2 with none.
  assert schedules.stage_order('1f1b', 3, 4, 0) == [
      (f, 0), (f, 1), (f, 2), (b, 0), (f, 3), (b, 1), (b, 2), (b, 3)]
  assert schedules.stage_order('1f1b', 3, 4, 2) == [
      (f, 0), (b, 0), (f, 1), (b, 1), (f, 2), (b, 2), (f, 3), (b, 3)]
  # Fewer micro-batches than the warm-up: all forwards, then backwards.
  assert schedules.stage_order('1f1b', 4, 2, 0) == [(f, 0), (f, 1), (b, 0),
                                                    (b, 1)]
  assert schedules.stage_order('gpipe', 2, 3, 1) == [
      (f, 0), (f, 1), (f, 2), (b, 2), (b, 1), (b, 0)]
  for k in (1, 2, 3, 5):
    for m in (1, 2, 4, 8):
      for s in range(k):
        assert schedules.in_flight(schedules.stage_order('1f1b', k, m, s)) == (
            min(k - s, m))
        assert schedules.in_flight(schedules.stage_order('gpipe', k, m,
                                                         s)) == m


def test_unknown_schedule_is_named():
  with pytest.raises(ValueError, match=r"schedule must be one of \('gpipe', "
                     r"'1f1b'\), got 'pipedream'"):
    simulator.simulate_schedule([1.0], [1.0], 2, 'pipedream')
