"""Elastic membership: a MultiWorkerMirrored cluster that runs on with fewer
workers, with its mathematics unchanged.

`distribution.min_workers` below `num_workers` makes the cluster elastic: an
attempt may run with any worker count W in [min_workers, num_workers]. Every
optimizer update then trains the same examples at every W: the per-replica
batch stays what it is at full size, gradient accumulation grows by
num_workers / W (so the update batch, per-replica batch x replicas x
accumulation, stays equal), and the data order does not depend on the worker
count: its partitions are those of the full-size cluster (`order_partitions`),
update j trains batch j of every partition, and each worker reads only the
partitions it owns (`data.data_order`). Only the summation order of an
update's gradients changes with W. Every change of the worker count between
attempts is a `MembershipEvent` in the supervisor's result. Pure Python.
"""

import dataclasses
import time
from typing import List, Optional

from absl import logging

from components.trainer.launchers import registry as launchers
from components.trainer.strategies import registry


def elastic_strategies():
  """Strategies whose workers can come and go between attempts ('auto' picks
  such a one for several workers without parameter servers)."""
  return ('auto',) + registry.names(elastic=True)


def is_elastic(num_workers: int, min_workers: Optional[int]) -> bool:
  return min_workers is not None and min_workers < num_workers


def check(*, num_workers: int, min_workers: Optional[int], num_ps: int,
          accumulation: int, strategy: str, launcher: str,
          data_partitions: Optional[int] = None) -> None:
  """Raises ValueError unless an elastic config can keep its update batch
  at every worker count it allows (the config's own values, no I/O)."""
  if min_workers is None:
    return
  if (not isinstance(min_workers, int) or isinstance(min_workers, bool) or
      not 1 <= min_workers <= num_workers):
    raise ValueError(f'min_workers={min_workers!r} must be an integer in '
                     f'[1, num_workers={num_workers}].')
  if not is_elastic(num_workers, min_workers):
    return
  if strategy not in elastic_strategies() or num_ps:
    raise ValueError(
        f'min_workers={min_workers} < num_workers={num_workers} needs '
        f'strategy in {elastic_strategies()} without parameter servers, not '
        f'strategy={strategy!r}, num_ps={num_ps}.')
  if not launchers.on_ray_cluster(launcher):
    raise ValueError(
        f'min_workers={min_workers} < num_workers={num_workers} needs a '
        f'launcher on a Ray cluster {launchers.names(ray_cluster=True)} (its '
        f'nodes can be lost), not launcher={launcher!r}; or set '
        f'min_workers={num_workers}.')
  micro_batches = num_workers * accumulation
  for workers in range(min_workers, num_workers):
    if micro_batches % workers:
      raise ValueError(
          f'min_workers={min_workers}: with {workers} of num_workers='
          f'{num_workers} workers the update batch cannot be kept: its '
          f'{num_workers} x gradient_accumulation_steps={accumulation} '
          f'per-replica batches do not divide among {workers} workers. Use '
          'a gradient_accumulation_steps that every worker count from '
          'min_workers to num_workers divides, or a larger min_workers.')
    if data_partitions and data_partitions % workers:
      raise ValueError(
          f'data_partitions={data_partitions} cannot be shared by {workers} '
          f'workers (min_workers={min_workers}, num_workers={num_workers}): '
          'each worker reads whole partitions. Use a multiple of every '
          'worker count from min_workers to num_workers.')


def accumulation_for(num_workers: int, accumulation: int, workers: int
                    ) -> int:
  """Gradient accumulation steps that keep the full-size update batch with
  `workers` of `num_workers` workers."""
  return num_workers * accumulation // workers


def accumulation_at(config, workers: int) -> int:
  """Gradient accumulation steps of a DistributionConfig `config` running
  with `workers` workers: the configured ones at full size (or when not
  elastic), more below it."""
  if not is_elastic(config.num_workers, config.min_workers):
    return config.gradient_accumulation_steps
  return accumulation_for(config.num_workers,
                          config.gradient_accumulation_steps, workers)


def full_size_replicas(config, replicas: int, workers: int) -> int:
  """Replicas of the full-size cluster of a DistributionConfig `config` that
  runs `replicas` replicas on `workers` workers."""
  if not is_elastic(config.num_workers, config.min_workers):
    return replicas
  return replicas * config.num_workers // workers


def order_partitions(config, full_replicas: int) -> int:
  """The data order's partitions for a DistributionConfig `config` whose
  full-size cluster has `full_replicas` replicas: `data_partitions`, else
  one per full-size replica, or one per micro-batch of its update where a
  worker count it may run with does not divide num_workers (a worker owns
  whole partitions)."""
  if config.data_partitions:
    return config.data_partitions
  if is_elastic(config.num_workers, config.min_workers) and any(
      config.num_workers % workers
      for workers in range(config.min_workers, config.num_workers)):
    return full_replicas * config.gradient_accumulation_steps
  return full_replicas


@dataclasses.dataclass
class MembershipEvent:
  """The cluster's worker count changed between two attempts."""
  attempt: int
  from_workers: int
  to_workers: int
  full_workers: int
  reason: str
  time: float


def record_change(attempt, index: int, previous: int,
                  events: List[MembershipEvent]) -> int:
  """Records a change of the worker count of `attempt` (a
  supervisor.Attempt, number `index`) from `previous` (0: the first attempt,
  a change if it is below full size); returns the new count."""
  if not attempt.workers:
    return previous
  if attempt.workers != (previous or attempt.full_workers):
    reason = attempt.membership_reason or (
        f'room for all {attempt.full_workers} workers again')
    events.append(MembershipEvent(index, previous or attempt.full_workers,
                                  attempt.workers, attempt.full_workers,
                                  reason, time.time()))
    logging.warning('Attempt %d runs with %d of %d workers: %s', index,
                    attempt.workers, attempt.full_workers, reason)
  return attempt.workers
