"""Placement groups for a training cluster on Ray: one bundle per TF task.

`reserve` waits a bounded time for a group; `elastic_size` finds the
largest worker count an elastic cluster (`membership`) can be placed with.
"""

from typing import Any, Dict, Tuple

import ray

# How long a placement group may wait for its resources.
PLACEMENT_TIMEOUT_S = 120.0
# An elastic cluster's relaunch waits this long for its full size, then this
# long for each smaller size before its smallest (PLACEMENT_TIMEOUT_S). The
# stopped attempt's resources are free within a second or two; a dead node's
# count until Ray declares it dead, which the relaunch usually follows (it
# learns of the death from Ray). Longer waits only delay training at a smaller
# size (measured: benchmarks/results/elastic.md); when the full size frees up
# later, the supervisor's rescale check grows the cluster back.
FULL_SIZE_WAIT_S = 10.0
SMALLER_SIZE_WAIT_S = 5.0
# How long a check for room to grow may hold its trial reservation.
GROW_CHECK_WAIT_S = 2.0


def bundle(resources: Dict[str, float]) -> Dict[str, float]:
  """What one task reserves, from RayConfig.task_resources."""
  wanted = {'CPU': resources['cpus'], 'GPU': resources['gpus'],
            'memory': int(resources['memory_mb'] * 2**20)}
  return {key: value for key, value in wanted.items() if value}


def reserve(task_bundle: Dict[str, float], count: int,
            placement_strategy: str, wait_s: float):
  """A ready placement group of `count` bundles, or None after `wait_s`."""
  group = ray.util.placement_group([task_bundle] * count,
                                   strategy=placement_strategy)
  ready, _ = ray.wait([group.ready()], timeout=wait_s)
  if ready:
    return group
  ray.util.remove_placement_group(group)
  return None


def elastic_size(task_bundle: Dict[str, float], num_workers: int,
                 min_workers: int, placement_strategy: str
                ) -> Tuple[Any, int, str]:
  """The largest worker count from num_workers down to min_workers that the
  cluster places (with its reserved group), and why it is not the full
  size; (None, 0, '') when not even min_workers fit."""
  for workers in range(num_workers, min_workers - 1, -1):
    wait_s = (FULL_SIZE_WAIT_S if workers == num_workers else
              PLACEMENT_TIMEOUT_S if workers == min_workers else
              SMALLER_SIZE_WAIT_S)
    group = reserve(task_bundle, workers, placement_strategy, wait_s)
    if group is not None:
      reason = '' if workers == num_workers else (
          f'the Ray cluster places only {workers} of {num_workers} workers '
          f'of {task_bundle} (available: {ray.available_resources()})')
      return group, workers, reason
  return None, 0, ''
