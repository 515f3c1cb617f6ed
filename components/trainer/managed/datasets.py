"""What the managed loop reads: parsing spec, train and eval datasets, and
the check of the data against its shard index.

The synchronous strategies train in the data order (`data_order`) over the
train split's shard index, seeded by `distribution.seed` (else DATA_SEED): a
resumed run, at any worker count, starts each partition at the update its
checkpoint reached and sees exactly the batches of an uninterrupted run.
Parameter-server workers instead stream their own shuffle, seeded where each
worker creates its dataset.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Tuple

from absl import logging
import tensorflow as tf

from components.data import data_order
from components.data import input_pipeline
from components.data import memory_fit
from components.data import ordered_pipeline
from components.data import shard_index
from components.data import unreadable
from components.trainer.common import task as task_lib
from components.trainer.common.split_source import split_source
from components.trainer.common.task import TrainingTask
from components.trainer.process.context import ProcessContext

# Seed of the data order without distribution.seed; fixed so that every
# attempt replays the same order.
DATA_SEED = 20240611
# `seed` value for a new seed per dataset (parameter-server workers).
PER_WORKER_SEED = object()
# Batches each parameter-server worker shuffles over (its own order).
PS_SHUFFLE_BATCHES = 16
# Rows parsed to measure what a cached row takes.
_SIZE_SAMPLE_ROWS = 256


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
  return TrainingData(feature_spec=task_lib.feature_spec(task),
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


def train_order(data: TrainingData, check: 'DataCheck', seed: int,
                batch: int, partitions: int
               ) -> Optional[data_order.DataOrder]:
  """The synchronous strategies' data order over the train split's index
  (None without one): `partitions` batches of `batch` rows an update. Its
  window is `shuffle_window_batches` of those batches."""
  if check.train_records is None:
    return None
  if data.config.shuffle_buffer_batches:
    logging.warning(
        'input_pipeline.shuffle_buffer_batches=%d is not used: the data '
        'order shuffles windows of shuffle_window_batches=%d batches inside '
        'each partition (a buffer has no position to resume at).',
        data.config.shuffle_buffer_batches, data.config.shuffle_window_batches)
  paths = sorted(check.train_records)
  return data_order.DataOrder(
      seed=seed, partitions=partitions, batch=batch,
      window=data.config.shuffle_window_batches * batch,
      shard_records=tuple(check.train_records[p] for p in paths),
      fixed_shard_order=data.config.cache != 'none')


def ordered_train_dataset_fn(check: 'DataCheck', data: TrainingData,
                             order: data_order.DataOrder, start_step: int,
                             train_steps: int, serve=None
                            ) -> Callable[[tf.distribute.InputContext],
                                          tf.data.Dataset]:
  """A `dataset_fn` of updates [start_step, train_steps) in `order`, its
  partitions made by `serve` where given (`offload`)."""
  paths = sorted(check.train_records)

  def dataset_fn(input_context: tf.distribute.InputContext):
    return ordered_pipeline.build_ordered_dataset(
        paths, data.feature_spec, data.label_key, order, data.config,
        input_context=input_context, start_update=start_step,
        updates=max(train_steps - start_step, 0), serve=serve)
  return dataset_fn


def train_dataset_fn(task: TrainingTask, data: TrainingData,
                     examples_per_step: int, start_step: int, seed,
                     config: input_pipeline.InputPipelineConfig,
                     readable_records: Optional[Dict[str, int]] = None
                    ) -> Callable[[tf.distribute.InputContext],
                                  tf.data.Dataset]:
  """A `dataset_fn` for `distribute_datasets_from_function` without a data
  order: parameter-server workers (`seed` PER_WORKER_SEED, a new seed per
  dataset), or train files that are not one folder to index (a resume then
  rebuilds its epoch and skips to `start_step`). `readable_records`:
  damaged files' readable prefixes (`check_data`)."""

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
        readable_records=readable_records)
  return dataset_fn


@dataclasses.dataclass(frozen=True)
class AttemptData:
  """What an attempt reads: the data (its memory cache as it fit this
  process), what `check_data` found, the data order (None: parameter
  servers, or train files that are not one folder to index), and why the
  memory cache fell back, if it did."""
  data: TrainingData
  check: 'DataCheck'
  order: Optional[data_order.DataOrder]
  cache_fallback: Optional[str]


def attempt_data(context: ProcessContext, data: TrainingData,
                 check: 'DataCheck', start: int,
                 recorded: Optional[Dict[str, Any]]) -> AttemptData:
  """What the attempt that starts at update `start` reads: `data` with its
  cache fit to this process's share, and the data order, which a resume
  (`start` > 0) checks against `recorded`, the order its checkpoint was
  trained in."""
  data, cache_fallback = fit_cache(data, check, 1 / context.workers)
  return AttemptData(data=data, check=check,
                     order=attempt_order(context, data, check, start,
                                         recorded),
                     cache_fallback=cache_fallback)


def attempt_order(context: ProcessContext, data: TrainingData,
                  check: 'DataCheck', start: int,
                  recorded: Optional[Dict[str, Any]]
                 ) -> Optional[data_order.DataOrder]:
  """The data order this attempt trains in: None for parameter servers
  and for train files that are not one folder to index; else the context's
  partitions of an update's examples, shared evenly by its replicas. An
  elastic cluster cannot train without one."""
  if context.spec.asynchronous:
    return None
  distribution = context.config
  examples_per_step = context.examples_per_step
  partitions, replicas = context.data_partitions, context.replicas
  if examples_per_step % partitions or partitions % replicas:
    raise ValueError(
        f'The data order has {partitions} partitions (distribution.'
        f'data_partitions={distribution.data_partitions}): they must '
        f'divide the {examples_per_step} examples of an update and '
        f'be shared evenly by the {replicas} replicas.')
  order = train_order(data, check, data_seed(distribution.seed),
                      examples_per_step // partitions, partitions)
  if order is None:
    if distribution.elastic:
      raise ValueError(
          'An elastic cluster (min_workers < num_workers) trains in the '
          'data order over a shard index, and the train files '
          f'{context.task.train_files} are not one folder to index: pass '
          "the patterns of one split folder (TFX's 'Split-<name>/*').")
    return None
  if start and recorded:
    data_order.check_resumable(recorded, order.state(),
                               context.task.checkpoint_dir)
  return order


def attempt_train_dataset_fn(context: ProcessContext, attempt: AttemptData,
                             start: int, serve=None
                            ) -> Callable[[tf.distribute.InputContext],
                                          tf.data.Dataset]:
  """The `dataset_fn` of an attempt that starts at update `start`.

  Parameter-server workers each stream their own shuffle over at least
  PS_SHUFFLE_BATCHES batches from the beginning (there is no global order to
  resume); the synchronous strategies train the attempt's order from
  `start` (its partitions from `serve`, where given), else (no order) the
  shuffle of `distribution.seed`, skipped to `start`.
  """
  task, data = context.task, attempt.data
  if context.spec.asynchronous:
    config = dataclasses.replace(data.config, shuffle_buffer_batches=max(
        PS_SHUFFLE_BATCHES, data.config.shuffle_buffer_batches))
    return train_dataset_fn(task, data, context.examples_per_step, 0,
                            PER_WORKER_SEED, config)
  if attempt.order is not None:
    return ordered_train_dataset_fn(attempt.check, data, attempt.order, start,
                                    context.train_steps, serve)
  return train_dataset_fn(task, data, context.examples_per_step, start,
                          data_seed(context.config.seed), data.config,
                          attempt.check.readable_records)


def sample_features(task: TrainingTask, data: TrainingData):
  """One small batch of features, to build a subclassed model."""
  dataset = input_pipeline.build_dataset(
      task.train_files, data.feature_spec, data.label_key, batch_size=1,
      config=data.config, shuffle=False)
  features, _ = next(iter(dataset))
  return features


def eval_dataset_fn(context: ProcessContext, attempt: AttemptData
                   ) -> Optional[Callable[[tf.distribute.InputContext],
                                          tf.data.Dataset]]:
  """A `dataset_fn` of the eval split, unshuffled, for
  `distribute_datasets_from_function`; damaged files are read up to their
  readable prefix (`check_data`).

  Each input pipeline reads its own share (files, or batches with fewer
  files than pipelines) as the train split does: tf.data's auto-sharding of
  a distributed dataset would not find the files inside the pipeline's
  per-epoch `flat_map`. It does not inherit the train split's cache: one
  partial pass over a memory cache would only be discarded (and TF warns
  that it is).
  """
  task, data = context.task, attempt.data
  global_batch = context.global_batch
  readable_records = attempt.check.readable_records
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
  sources = {split: split_source(data.config, patterns, task.checkpoint_dir)
             for split, patterns in (('train', task.train_files),
                                     ('eval', task.eval_files)) if patterns}
  splits = [(split, source, input_pipeline.list_files(source.patterns))
            for split, source in sources.items()]
  compression = data.config.read_compression()
  scanned, indexed = None, {}
  if skip_unreadable:
    files = sorted({f for _, _, split_files in splits for f in split_files})
    if is_chief:
      scanned = unreadable.read(task.checkpoint_dir, files)
      if scanned is None:
        scanned = unreadable.scan(files, compression)
        unreadable.write(task.checkpoint_dir, files, scanned)
    all_workers(True)
    if not is_chief:
      scanned = unreadable.read(task.checkpoint_dir, files)
  for split, read, files in splits:
    if not is_chief:
      all_workers(True)  # The chief has written the index.
    index, source = shard_index.ensure(
        read.patterns, files, compression, read.index_dir,
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


def fit_cache(data: TrainingData, check: 'DataCheck', share: float,
              budget_bytes: Optional[int] = None
             ) -> Tuple[TrainingData, Optional[str]]:
  """`data` with its memory cache kept only where the rows this process
  caches (its `share` of the train split's index), parsed, fit its RAM
  budget (`budget_bytes`, else a quarter of this machine's memory): the
  tuner chose the cache on the machine it measured on. Else the cache falls
  back to disk (with a cache_dir) or none: (data, why)."""
  config = data.config
  if config.cache != 'memory' or check.train_records is None:
    return data, None
  rows = int(sum(check.train_records.values()) * share)
  files = sorted(check.train_records)[:1]
  sample = next(iter(input_pipeline.build_dataset(
      files, data.feature_spec, None, _SIZE_SAMPLE_ROWS,
      dataclasses.replace(config, cache='none'), shuffle=False,
      num_epochs=1, drop_remainder=False)))
  sample_rows = int(tf.shape(tf.nest.flatten(sample)[0])[0])
  per_row = sum(_nbytes(t) for t in tf.nest.flatten(sample)) / max(
      sample_rows, 1)
  needed = memory_fit.cache_bytes(rows, per_row)
  budget = budget_bytes or memory_fit.default_ram_budget()
  if needed <= budget:
    return data, None
  fallback = 'disk' if config.cache_dir else 'none'
  why = (f"input_pipeline.cache='memory' would hold {rows:,} rows "
         f'(~{needed / 2**20:,.1f} MiB parsed, {per_row:,.0f} bytes a row) in '
         f'this process, over its RAM budget of {budget / 2**20:,.1f} MiB: '
         f'cache={fallback!r} instead.')
  logging.warning('%s', why)
  return dataclasses.replace(data, config=dataclasses.replace(
      config, cache=fallback)), why


def _nbytes(value) -> int:
  if isinstance(value, tf.sparse.SparseTensor):
    return _nbytes(value.values) + _nbytes(value.indices)
  if value.dtype == tf.string:
    return int(tf.reduce_sum(tf.strings.length(value))) + 16 * int(
        tf.size(value))
  return int(tf.size(value)) * value.dtype.size
