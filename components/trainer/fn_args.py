"""run_fn mode: the stock `fn_args`, plus what HighPerfTrainer adds.

A training process rebuilds exactly the `FnArgs` the stock Trainer would pass
(`components.patches.stock_fn_args` on the executor's inputs, carried as JSON in
the TrainingTask) and adds:
- `strategy`: the tf.distribute strategy chosen for this run;
- `dataset_factory(file_patterns, label_key, ...)`: distributed `(features,
  label)` datasets for that strategy, read with the (tuned) input pipeline;
- `checkpoint_dir`: the stable checkpoint location of this training.
On non-chief workers of a multi-worker run, `serving_model_dir` is a scratch
directory and `model_run_dir` a per-worker subdirectory, so a `run_fn` that
saves unconditionally (as MultiWorkerMirrored requires) does not overwrite
the chief's outputs.

TFX is imported only inside `build_fn_args` / `run_user_fn`; the dataset
factory is TFX-free.
"""

import os
import tempfile
from typing import Any, Dict, List, Optional

import tensorflow as tf

from components.data import input_pipeline
from components import patches
from components.trainer.process.context import ProcessContext
from components.trainer.common.task import feature_spec


class DatasetFactory:
  """Builds datasets distributed over a strategy's input pipelines.

  Each input pipeline (one per worker) reads its share of the files (or of
  the records, when there are fewer files than pipelines) and batches its
  replicas' part of the global batch: `input_pipeline.build_dataset` with the
  strategy's InputContext.
  """

  def __init__(self, strategy: tf.distribute.Strategy,
               spec: Dict[str, Any],
               config: Optional[input_pipeline.InputPipelineConfig],
               global_batch_size: int, asynchronous: bool = False):
    self.strategy = strategy
    # Parameter servers (`StrategySpec.asynchronous`) take a DatasetCreator.
    self.asynchronous = asynchronous
    self.feature_spec = spec
    self.config = config
    self.global_batch_size = global_batch_size

  def __call__(self, file_patterns: List[str], label_key: Optional[str], *,
               batch_size: Optional[int] = None, shuffle: bool = True,
               num_epochs: Optional[int] = None, seed: int = 0):
    """A distributed dataset (a DatasetCreator for parameter servers).

    Args:
      file_patterns: e.g. `fn_args.train_files`.
      label_key: Feature returned as the label, or None for features only.
      batch_size: Global batch; defaults to the configured one.
      shuffle: Shuffle (seeded) as configured by the input pipeline.
      num_epochs: Passes over the data; None repeats forever.
      seed: Seed of the shuffling.
    """
    global_batch = batch_size or self.global_batch_size

    def dataset_fn(input_context: tf.distribute.InputContext):
      return input_pipeline.build_dataset(
          file_patterns, self.feature_spec, label_key, global_batch,
          self.config, shuffle=shuffle, seed=seed, num_epochs=num_epochs,
          input_context=input_context)

    if self.asynchronous:
      return tf.keras.utils.experimental.DatasetCreator(dataset_fn)
    return self.strategy.distribute_datasets_from_function(dataset_fn)


def make_dataset_factory(context: ProcessContext) -> DatasetFactory:
  task = context.task
  tuned = (input_pipeline.InputPipelineConfig.from_dict(task.input_pipeline)
           if task.input_pipeline else None)
  return DatasetFactory(context.strategy, feature_spec(task), tuned,
                        context.global_batch, context.spec.asynchronous)


def auto_shard_policy(num_files: int, num_workers: int):
  """FILE sharding when every worker gets a file, else DATA (by element)."""
  policy = tf.data.experimental.AutoShardPolicy
  return policy.FILE if num_files >= num_workers else policy.DATA


def with_auto_shard(tf_dataset_factory, num_workers: int):
  """Wraps `data_accessor.tf_dataset_factory` with a fitting shard policy.

  tf.data's default (AUTO) shards by file, which leaves a worker without data
  when there are fewer files than workers; a stock `run_fn` that feeds
  `model.fit` from the data accessor then fails under MultiWorkerMirrored.
  """

  def factory(file_pattern, options, schema):
    dataset = tf_dataset_factory(file_pattern, options, schema)
    num_files = len(input_pipeline.list_files(file_pattern))
    dataset_options = tf.data.Options()
    dataset_options.experimental_distribute.auto_shard_policy = (
        auto_shard_policy(num_files, num_workers))
    return dataset.with_options(dataset_options)

  return factory


def build_fn_args(context: ProcessContext):
  """The stock FnArgs of the task's executor inputs, plus our attributes."""
  task = context.task
  # pylint: disable=g-import-not-at-top
  from tfx.types import artifact_utils
  # pylint: enable=g-import-not-at-top
  io = task.executor_io
  fn_args = patches.stock_fn_args(
      artifact_utils.parse_artifact_dict(io['input_dict']),
      artifact_utils.parse_artifact_dict(io['output_dict']),
      io['exec_properties'])
  # `train_epochs` resolved into steps (`context.resolve_lengths`).
  fn_args.train_steps = task.train_steps or None
  fn_args.strategy = context.strategy
  fn_args.dataset_factory = make_dataset_factory(context)
  fn_args.checkpoint_dir = task.checkpoint_dir
  if context.workers > 1:
    fn_args.data_accessor = fn_args.data_accessor._replace(
        tf_dataset_factory=with_auto_shard(
            fn_args.data_accessor.tf_dataset_factory, context.workers))
  if not context.is_chief:
    task_info = context.tf_config.get('task', {})
    fn_args.serving_model_dir = tempfile.mkdtemp(prefix='hpm-nonchief-model-')
    fn_args.model_run_dir = os.path.join(
        fn_args.model_run_dir,
        f'{task_info.get("type", "worker")}-{task_info.get("index", 0)}')
  return fn_args


def run_user_fn(context: ProcessContext) -> Optional[int]:
  """Calls the module's run_fn with the extended fn_args; returns the train
  steps it was asked for (the result's `steps`)."""
  from tfx.components.util import udf_utils  # pylint: disable=g-import-not-at-top
  run_fn = udf_utils.get_fn(context.task.executor_io['exec_properties'],
                            'run_fn')
  fn_args = build_fn_args(context)
  run_fn(fn_args)
  return fn_args.train_steps
