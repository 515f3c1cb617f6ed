"""What the managed loop reads: parsing spec, train and eval datasets, and
the check of the data against its shard index.

The train dataset is a pure function of the files, the input-pipeline config
and the seed (`distribution.seed`, else DATA_SEED), so a resumed run that
skips the batches its checkpointed steps consumed sees exactly the batches of
an uninterrupted run (synchronous strategies). Parameter-server workers
instead stream their own shuffle, seeded where each worker creates its
dataset.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional

from absl import logging
import tensorflow as tf

from components.data import input_pipeline
from components.data import shard_index
from components.data import unreadable
from components.trainer import fn_args
from components.trainer.process.task import TrainingTask

# Seed of the data order without distribution.seed; fixed so that every
# attempt replays the same order.
DATA_SEED = 20240611
# `seed` value for a new seed per dataset (parameter-server workers).
PER_WORKER_SEED = object()


@dataclasses.dataclass
class TrainingData:
  """How to parse the examples, and what to export with."""
  feature_spec: Dict[str, Any]
  label_key: str
  raw_label_key: Optional[str]
  config: input_pipeline.InputPipelineConfig
  tf_transform_output: Any  # tft.TFTransformOutput or None


def training_data(task: TrainingTask, module) -> TrainingData:
  """Feature spec from the Transform output, else from the schema."""
  for name in ('build_model', 'LABEL_KEY'):
    if not hasattr(module, name):
      raise ValueError(f'Managed mode needs `{name}` in the module '
                       f'{module.__name__}; it does not define it.')
  tf_transform_output = None
  if task.transform_output:
    import tensorflow_transform as tft  # pylint: disable=g-import-not-at-top
    tf_transform_output = tft.TFTransformOutput(task.transform_output)
  config = input_pipeline.InputPipelineConfig.from_dict(task.input_pipeline)
  if not config.deterministic:
    logging.warning('input_pipeline.deterministic is False: a resumed run '
                    'will not see exactly the examples an uninterrupted run '
                    'would have seen.')
  return TrainingData(feature_spec=fn_args.feature_spec(task),
                      label_key=module.LABEL_KEY,
                      raw_label_key=getattr(module, 'RAW_LABEL_KEY', None),
                      config=config, tf_transform_output=tf_transform_output)


def data_seed(seed: Optional[int]) -> int:
  """The synchronous strategies' data-order seed: `seed`, else DATA_SEED.

  Fixed for a given config either way, and the seed is part of the
  checkpoint fingerprint, so a resumed run replays the order it started.
  """
  return DATA_SEED if seed is None else seed


def _clock_seed() -> tf.Tensor:
  """A seed read from the clock where the dataset is created (each worker).

  Not a random op: those need a fixed seed (the same on every worker) under
  `enable_op_determinism`.
  """
  return tf.cast(tf.timestamp() * 1e6, tf.int64) % (2**31 - 1)


def train_dataset_fn(task: TrainingTask, data: TrainingData,
                     examples_per_step: int, start_step: int, seed,
                     config: input_pipeline.InputPipelineConfig,
                     records_per_file: Optional[Dict[str, int]] = None,
                     global_order: bool = False,
                     readable_records: Optional[Dict[str, int]] = None
                    ) -> Callable[[tf.distribute.InputContext],
                                  tf.data.Dataset]:
  """A `dataset_fn` for `distribute_datasets_from_function`.

  `seed`: an int, or PER_WORKER_SEED for a new seed per dataset;
  `records_per_file`: the train split's shard index (a resume then does not
  count the epoch's rows); `global_order`: the same data order at every
  worker count (an elastic cluster); `readable_records`: damaged files'
  readable prefixes (`check_data`).
  """

  def dataset_fn(input_context: tf.distribute.InputContext):
    # Each step takes one batch per replica from its input pipeline.
    batches_per_step = (input_context.num_replicas_in_sync //
                        input_context.num_input_pipelines)
    return input_pipeline.build_dataset(
        task.train_files, data.feature_spec, data.label_key,
        batch_size=examples_per_step, config=config,
        seed=_clock_seed() if seed is PER_WORKER_SEED else seed,
        input_context=input_context,
        skip_batches=start_step * batches_per_step,
        global_order=global_order, records_per_file=records_per_file,
        readable_records=readable_records)
  return dataset_fn


def sample_features(task: TrainingTask, data: TrainingData):
  """One small batch of features, to build a subclassed model."""
  dataset = input_pipeline.build_dataset(
      task.train_files, data.feature_spec, data.label_key, batch_size=1,
      config=data.config, shuffle=False)
  features, _ = next(iter(dataset))
  return features


def eval_dataset_fn(task: TrainingTask, data: TrainingData, global_batch: int,
                    readable_records: Optional[Dict[str, int]] = None
                   ) -> Optional[Callable[[tf.distribute.InputContext],
                                          tf.data.Dataset]]:
  """A `dataset_fn` of the eval split, unshuffled, for
  `distribute_datasets_from_function`.

  Each input pipeline reads its own share (files, or batches with fewer
  files than pipelines) as the train split does: tf.data's auto-sharding of
  a distributed dataset would not find the files inside the pipeline's
  per-epoch `flat_map`. It does not inherit the train split's cache: one
  partial pass over a memory cache would only be discarded (and TF warns
  that it is).
  """
  if not task.eval_steps or not task.eval_files:
    return None

  def dataset_fn(input_context: tf.distribute.InputContext):
    return input_pipeline.build_dataset(
        task.eval_files, data.feature_spec, data.label_key,
        batch_size=global_batch,
        config=dataclasses.replace(data.config, cache='none'), shuffle=False,
        seed=DATA_SEED, input_context=input_context,
        readable_records=readable_records)
  return dataset_fn


@dataclasses.dataclass
class DataCheck:
  """What `check_data` found: each split's index (as recorded), the train
  split's record count per file, and, where the user opted in to skipping
  unreadable records, each damaged file's readable prefix."""
  indexes: Dict[str, Any] = dataclasses.field(default_factory=dict)
  train_records: Optional[Dict[str, int]] = None
  readable_records: Dict[str, int] = dataclasses.field(default_factory=dict)
  unreadable: List[Dict[str, Any]] = dataclasses.field(default_factory=list)


def check_data(task: TrainingTask, data: TrainingData, is_chief: bool,
               all_workers: Callable[[bool], bool],
               skip_unreadable: bool = False) -> DataCheck:
  """Each split's files against its shard index (written with the
  examples, else built once beside the checkpoints by the chief; the other
  workers read it after `all_workers`): a changed or missing shard fails
  here, before any step, naming it. With `skip_unreadable`, the files are
  first read through once per training (`unreadable`) and each damaged
  file's readable prefix is what the datasets read."""
  found = DataCheck()
  if data.config.transform_placement == 'on_the_fly':
    return found
  splits = [(split, patterns, input_pipeline.list_files(patterns))
            for split, patterns in (('train', task.train_files),
                                    ('eval', task.eval_files)) if patterns]
  scanned, indexed = None, {}
  if skip_unreadable:
    files = sorted({f for _, _, split_files in splits for f in split_files})
    if is_chief:
      scanned = unreadable.read(task.checkpoint_dir, files)
      if scanned is None:
        scanned = unreadable.scan(files, data.config.compression_type)
        unreadable.write(task.checkpoint_dir, files, scanned)
    all_workers(True)
    if not is_chief:
      scanned = unreadable.read(task.checkpoint_dir, files)
  for split, patterns, files in splits:
    if not is_chief:
      all_workers(True)  # The chief has written the index.
    index, source = shard_index.ensure(
        patterns, files, data.config.compression_type, task.checkpoint_dir,
        build_missing=is_chief, counts=scanned and scanned.readable)
    if is_chief:
      all_workers(True)
    found.indexes[split] = {'source': source} if index is None else {
        'shards': len(index.shards), 'records': index.records,
        'source': source}
    if index is not None and source.startswith(
        shard_index.WRITTEN_WITH_THE_EXAMPLES):
      # The files' counts as written: what a damaged file's prefix leaves.
      indexed.update(index.records_by_path())
    if split == 'train' and index is not None:
      found.train_records = index.records_by_path()
  if scanned is not None and scanned.unreadable:
    found.readable_records = scanned.limits()
    # Records skipped where the file's count is known; None: the rest of
    # the file, count unknown.
    found.unreadable = [
        {**u, 'skipped': (indexed[u['path']] - u['position']
                          if u['path'] in indexed else None)}
        for u in scanned.describe()]
    if found.train_records is not None:
      found.train_records = {**found.train_records, **{
          path: count for path, count in found.readable_records.items()
          if path in found.train_records}}
    for u in found.unreadable:
      logging.warning(
          'skip_unreadable_records: %s is read up to record %d; %s '
          'record(s) after it are skipped (%s).', u['path'], u['position'],
          'the remaining' if u['skipped'] is None else u['skipped'],
          u['error'])
  return found
