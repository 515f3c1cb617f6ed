"""What one training process knows of itself, resolved once as it starts.

The process's entry (`entry.train`) validates the task's distribution config
(its one validation), builds the strategy from its registry entry, and
`ProcessContext.resolve` adds the rest: this process's role from TF_CONFIG,
the attempt's worker count, and the batch sizes and step counts for the
replicas it found. The managed loop, its datasets and `run_fn`'s fn_args read
these fields instead of deriving them again.
"""

import dataclasses
from typing import Any, Dict

from components.data import input_pipeline
from components.data import shard_index
from components.trainer.common import membership
from components.trainer.common.split_source import split_source
from components.trainer.common.split_source import SplitSource
from components.trainer.common import tf_config as tf_config_lib
from components.trainer.config import DistributionConfig
from components.trainer.common.task import TrainingTask
from components.trainer.strategies import registry


@dataclasses.dataclass(frozen=True)
class ProcessContext:
  """One training process's resolved view of its task."""
  # train_epochs turned into train_steps, eval_steps=0 into one eval pass.
  task: TrainingTask
  # Validated; per_replica_batch_size concrete, global_batch_size None.
  config: DistributionConfig
  spec: registry.StrategySpec
  strategy: Any  # tf.distribute.Strategy
  tf_config: Dict[str, Any]
  # Workers of this attempt (an elastic cluster may run below num_workers).
  workers: int
  # Writes the shared outputs: the model, results, checkpoints' records.
  is_chief: bool

  @property
  def replicas(self) -> int:
    return self.strategy.num_replicas_in_sync

  @property
  def global_batch(self) -> int:
    return self.config.global_batch(self.replicas)

  @property
  def train_steps(self) -> int:
    return int(self.task.train_steps)

  @property
  def accumulation(self) -> int:
    """This attempt's accumulation (an elastic cluster below full size
    accumulates more; the config keeps the full size's)."""
    return membership.accumulation_at(self.config, self.workers)

  @property
  def examples_per_step(self) -> int:
    """The examples of one optimizer update."""
    return self.global_batch * self.accumulation

  @property
  def data_partitions(self) -> int:
    """The data order's partitions: those of the full-size cluster."""
    full_size = membership.full_size_replicas(self.config, self.replicas,
                                              self.workers)
    return membership.order_partitions(self.config, full_size)

  @classmethod
  def resolve(cls, task: TrainingTask, config: DistributionConfig,
              strategy: Any) -> 'ProcessContext':
    """The context of a process that built `strategy` from `config`."""
    tf_config = tf_config_lib.from_env()
    workers = tf_config_lib.worker_count(tf_config)
    task, config = resolve_lengths(task, config, strategy.num_replicas_in_sync,
                                   workers)
    return cls(task=task, config=config, spec=registry.get(config.strategy),
               strategy=strategy, tf_config=tf_config, workers=workers,
               is_chief=tf_config_lib.is_chief(tf_config))

  @classmethod
  def of_strategy(cls, task: TrainingTask, strategy: Any) -> 'ProcessContext':
    """The context of a process that built `strategy` for `task` by other
    means than `entry.train` (a notebook, a test)."""
    return cls.resolve(task, DistributionConfig.from_dict(task.distribution),
                       strategy)


def resolve_lengths(task: TrainingTask, config: DistributionConfig,
                    num_replicas: int, workers: int = 1):
  """(task, config) with concrete batch sizes and step counts for
  `num_replicas` replicas over `workers` workers.

  The config then holds `per_replica_batch_size` (global batch = per-replica
  batch x replicas); `train_epochs` becomes `train_steps` (optimizer updates,
  each consuming the accumulation's global batches); in managed mode
  eval_steps=0 becomes one pass over the eval split. An elastic cluster
  running with fewer than num_workers workers keeps the full size's
  per-replica batch and update batch: its accumulation grows (`membership`).
  """
  accumulation = membership.accumulation_at(config, workers)
  per_replica = config.per_replica_batch(
      membership.full_size_replicas(config, num_replicas, workers))
  examples_per_update = per_replica * num_replicas * accumulation
  reading = input_pipeline.InputPipelineConfig.from_dict(task.input_pipeline)
  train_steps, eval_steps = task.train_steps, task.eval_steps
  if config.train_epochs:
    examples = _records(split_source(reading, task.train_files,
                                     task.checkpoint_dir))
    train_steps = max(1, config.train_epochs * examples // examples_per_update)
  if task.mode == 'managed' and not eval_steps:
    examples = _records(split_source(reading, task.eval_files,
                                     task.checkpoint_dir))
    eval_steps = max(1, examples // (per_replica * num_replicas))
  config = dataclasses.replace(config, per_replica_batch_size=per_replica,
                               global_batch_size=None, train_epochs=0)
  task = dataclasses.replace(task, distribution=config.to_dict(),
                             train_steps=train_steps, eval_steps=eval_steps)
  return task, config


def _records(source: SplitSource) -> int:
  """A split's records: from its shard index where one was written (by
  OptimizedTransform, or by an earlier attempt), else counted."""
  files = input_pipeline.list_files(source.patterns)
  index, _ = shard_index.ensure(source.patterns, files, source.compression,
                                source.index_dir, build_missing=False)
  if index is not None:
    return index.records
  return input_pipeline.count_records(files, source.compression)
