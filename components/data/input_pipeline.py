"""Builds the tf.data pipeline that feeds training from transformed examples.

This is the library half of OptimizedTransform: the tuner measures configs of
`InputPipelineConfig`, and HighPerfTrainer (or a `run_fn`) builds its dataset
with `build_dataset` from the chosen one. No TFX import, so it tests fast.

Why it is fast: each file reader batches its own records (`read_in_order`,
shared with the ordered reader), so the per-record cost of tf.data runs on
the reader threads; parsing is vectorized (`tf.io.parse_example` on a batch)
with parallel calls; `rebatch` then cuts exact batches without copying rows
one by one. Caching, when chosen, holds the parsed (and transformed) tensors,
so later epochs skip reading, parsing and transforming.

Where the transform runs: `transform_placement='materialized'` reads the
examples Transform wrote; `'on_the_fly'` reads the raw examples of the same
split (recorded in the config) and applies the transform graph inside the
pipeline, yielding the same tensors.

Determinism contract: with `config.deterministic` and a fixed `seed`, the
sequence of batches is a pure function of the files, the config and the
seed, so `skip_batches=n` yields exactly the batches an uninterrupted run
would see from batch n on, at a cost of up to an epoch of reading. The
synchronous trainer reads its split in `data_order` instead
(`ordered_pipeline`, over the shard index: a resume reads one shard); this
pipeline serves the tuner's measurements, evaluation, parameter-server
workers and train files with no index.
"""

import dataclasses
import hashlib
import json
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import tensorflow as tf

from components.data.config import AUTOTUNE, InputPipelineConfig

MIN_READ_BATCH = 512
_COUNT_BATCH = 4096
# TFX lays out every split of an Examples artifact as `<uri>/Split-<name>/`.
_SPLIT_PREFIX = 'Split-'


def options(config: InputPipelineConfig) -> tf.data.Options:
  options = tf.data.Options()
  options.deterministic = config.deterministic
  options.autotune.enabled = True
  if config.autotune_ram_budget_bytes:
    options.autotune.ram_budget = config.autotune_ram_budget_bytes
  options.experimental_optimization.map_parallelization = (
      config.map_parallelization)
  if config.private_threadpool_size:
    options.threading.private_threadpool_size = config.private_threadpool_size
  return options


def list_files(file_patterns: List[str]) -> List[str]:
  """The sorted files matching any pattern; an error if there are none."""
  files = sorted({f for p in file_patterns for f in tf.io.gfile.glob(p)})
  if not files:
    raise ValueError(f'No files match {file_patterns}.')
  return files


def count_records(files: List[str], compression_type: str) -> int:
  """Records in TFRecord files (for shard sizes and epoch lengths)."""
  # Eager batches: no tf.function to trace, which costs more than counting a
  # small split.
  dataset = tf.data.TFRecordDataset(files, compression_type=compression_type)
  return sum(len(batch) for batch in
             dataset.batch(_COUNT_BATCH).as_numpy_iterator())


def split_name(folder: str) -> Optional[str]:
  """`<name>` of a `Split-<name>` folder (TFX's layout), else None.

  The one reading of TFX's split folders: the readers of patterns, the shard
  index and the sharded Transform write all use it.
  """
  name = os.path.basename(folder.rstrip('/'))
  return name[len(_SPLIT_PREFIX):] if name.startswith(_SPLIT_PREFIX) else None


def _split_in(pattern: str) -> Optional[str]:
  """The split of the outermost non-empty split folder in `pattern`."""
  # A folder, so not the pattern's last part (its files).
  return next((name for name in map(split_name, pattern.split('/')[:-1])
               if name), None)


def split_of(file_patterns: List[str]) -> str:
  """The TFX split name (`.../Split-<name>/...`) shared by the patterns."""
  names = {_split_in(p) for p in file_patterns}
  if len(names) != 1 or None in names:
    raise ValueError(
        f'Cannot tell the split of {file_patterns}: an on-the-fly config '
        'reads the raw examples of the same split, so pass split= or patterns '
        f"under one TFX '{_SPLIT_PREFIX}<name>/' folder.")
  return names.pop()


def patterns_read(config: InputPipelineConfig, file_patterns: List[str],
                  split: Optional[str] = None) -> List[str]:
  """The patterns `config` reads for the split of `file_patterns` (the
  materialized examples): on the fly, the raw examples of the same split
  (`split`, by default the `Split-<name>` folder of the patterns). With
  `read_compression`, the one rule of what a placement reads."""
  if config.transform_placement != 'on_the_fly':
    return list(file_patterns)
  split = split or split_of(file_patterns)
  if split not in config.raw_file_patterns:
    raise ValueError(f'split={split!r} has no raw examples in the on-the-fly '
                     f'config; it has {sorted(config.raw_file_patterns)}.')
  return list(config.raw_file_patterns[split])


def read_batch_size(config: InputPipelineConfig, batch_size: int) -> int:
  return config.read_batch_size or max(batch_size, MIN_READ_BATCH)


# Batch size that holds a whole shard (a read-ahead reads it as one).
_WHOLE_SHARD = 2**62


def read_in_order(table: tf.data.Dataset, config: InputPipelineConfig,
                  compression_type: str, batch_size: int) -> tf.data.Dataset:
  """Batches of the records `table`'s (path, skip, take) elements name, in
  table order (take -1: to the file's end); a shard's last batch may be
  short.

  `config.read_ahead_shards` K > 1 reads K shards at once, each whole, and
  hands them on in table order: the rows and their read batches are those
  of K = 1, and up to K + 1 shards' records are in memory.
  """
  @tf.autograph.experimental.do_not_convert
  def records(path, skip, take):
    return tf.data.TFRecordDataset(
        path, compression_type=compression_type,
        buffer_size=config.read_buffer_bytes).skip(skip).take(take)

  if config.read_ahead_shards == 1:
    return table.flat_map(
        lambda path, skip, take: records(path, skip, take).batch(batch_size))

  @tf.autograph.experimental.do_not_convert
  def whole(path, skip, take):
    # A shard with no records to read is an empty batch.
    return records(path, skip, take).batch(_WHOLE_SHARD).concatenate(
        tf.data.Dataset.from_tensors(tf.zeros([0], tf.string))
    ).take(1).get_single_element()

  shards = table.map(whole, num_parallel_calls=config.read_ahead_shards,
                     deterministic=True)
  return shards.filter(lambda batch: tf.size(batch) > 0).flat_map(
      lambda batch: tf.data.Dataset.from_tensors(batch).rebatch(batch_size))


def read_batches(files: tf.data.Dataset, config: InputPipelineConfig,
                 compression_type: str, batch_size: int,
                 readable_records: Optional[Dict[str, int]] = None
                ) -> tf.data.Dataset:
  """Batches of serialized records from a dataset of file names, each
  file's records batched where they are read (`read_in_order`).
  `readable_records`: files read only up to that many records (damaged past
  them, `unreadable`).
  """
  limits = None
  if readable_records:
    limits = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
        tf.constant(sorted(readable_records)),
        tf.constant([readable_records[f] for f in sorted(readable_records)],
                    tf.int64)), default_value=-1)

  @tf.autograph.experimental.do_not_convert
  def whole_file(filename):
    take = (tf.constant(-1, tf.int64) if limits is None
            else limits.lookup(filename))
    return filename, tf.constant(0, tf.int64), take

  return read_in_order(files.map(whole_file), config, compression_type,
                       batch_size)


def make_parser(feature_spec: Dict[str, Any], label_key: Optional[str],
                config: InputPipelineConfig) -> Callable[[tf.Tensor], Any]:
  """Serialized batch -> features (or (features, label)), per placement.

  On the fly, the raw examples are parsed with the transform graph's raw spec
  and transformed by `TFTransformOutput.transform_features_layer()`; only the
  keys of `feature_spec` (the transformed spec) are kept, as when parsing
  materialized examples.
  """
  if config.transform_placement == 'on_the_fly':
    import tensorflow_transform as tft  # pylint: disable=g-import-not-at-top
    tft_output = tft.TFTransformOutput(config.transform_graph_uri)
    raw_spec = tft_output.raw_feature_spec()
    transform_layer = tft_output.transform_features_layer()

    def features_of(serialized):
      transformed = transform_layer(tf.io.parse_example(serialized, raw_spec))
      return {key: transformed[key] for key in feature_spec}
  else:
    def features_of(serialized):
      return tf.io.parse_example(serialized, feature_spec)

  # Straight-line TensorFlow: autograph would only add tracing time (seconds
  # when the on-the-fly transform layer is tf_keras code).
  @tf.autograph.experimental.do_not_convert
  def parse(serialized):
    features = features_of(serialized)
    if label_key is None:
      return features
    label = features.pop(label_key)
    return features, label

  return parse


def gather_rows(tensor, indices):
  if isinstance(tensor, tf.sparse.SparseTensor):
    # Rows of a (rank-2, parsed VarLenFeature) SparseTensor via ragged rows.
    return tf.gather(tf.RaggedTensor.from_sparse(tensor), indices).to_sparse()
  return tf.gather(tensor, indices)


def shuffle_windows(dataset: tf.data.Dataset, window_size: int, seed,
                    stream: int = 0, first_window: int = 0
                   ) -> tf.data.Dataset:
  """Shuffles the rows of each `window_size`-row window, seeded per window.

  A vectorized gather per window instead of a per-example shuffle buffer:
  the mixing of a buffer of `window_size` examples at a fraction of its cost.
  Window k of `stream` (a partition of the data order) is seeded by (seed,
  stream, first_window + k), so a stream resumed at a window shuffles it as
  the uninterrupted stream did.
  """
  @tf.autograph.experimental.do_not_convert
  def shuffle_rows(window_index, element):
    num_rows = tf.shape(tf.nest.flatten(element)[0])[0]
    order = tf.random.experimental.stateless_shuffle(
        tf.range(num_rows), seed=tf.stack([
            tf.cast(seed, tf.int64),
            stream * 2**32 + first_window + window_index]))
    return tf.nest.map_structure(lambda t: gather_rows(t, order), element)

  return dataset.rebatch(window_size).enumerate().map(
      shuffle_rows, num_parallel_calls=AUTOTUNE, deterministic=True)


_FOREVER = 2**62  # Epochs of `num_epochs=None`.


def rows_or_error(batches: tf.data.Dataset, message: str) -> tf.data.Dataset:
  """One element once `batches` (of records, never empty) yields one, or
  an InvalidArgumentError saying `message` if it yields none: a pipeline
  with no rows would otherwise loop over empty epochs for ever."""
  @tf.autograph.experimental.do_not_convert
  def check(has_rows):
    with tf.control_dependencies([tf.debugging.Assert(has_rows, [message])]):
      return tf.identity(has_rows)

  return batches.take(1).map(lambda *_: tf.constant(True)).concatenate(
      tf.data.Dataset.from_tensors(tf.constant(False))).take(1).map(check)


def seed_of_epoch(seed, epoch) -> tf.Tensor:
  """One seed per (seed, epoch); `seed` may be a tensor (a clock seed)."""
  return tf.cast(seed, tf.int64) * 1_000_003 + tf.cast(epoch, tf.int64)


def drop_rows(dataset: tf.data.Dataset, count: int) -> tf.data.Dataset:
  """`dataset`'s chunks of rows without its first `count` rows."""
  if not count:
    return dataset

  @tf.autograph.experimental.do_not_convert
  def drop(seen, chunk):
    num_rows = tf.shape(tf.nest.flatten(chunk)[0], out_type=tf.int64)[0]
    start = tf.clip_by_value(count - seen, 0, num_rows)
    kept = tf.range(start, num_rows)
    return seen + num_rows, tf.nest.map_structure(
        lambda t: gather_rows(t, kept), chunk)

  return dataset.scan(tf.constant(0, tf.int64), drop)


def disk_cache_prefix(config: InputPipelineConfig, what: List[Any]) -> str:
  """A cache file prefix unique to what is cached, ready to be written.

  A complete cache (`<prefix>.index`) is reused, also by a restarted run. A
  run killed while writing (preemption) leaves a lockfile and partial data
  that would make every later run fail, so those are removed.
  """
  key = json.dumps(what + [config.transform_placement,
                           config.transform_graph_uri])
  prefix = os.path.join(config.cache_dir,
                        hashlib.sha256(key.encode()).hexdigest()[:24])
  tf.io.gfile.makedirs(config.cache_dir)
  if not tf.io.gfile.exists(prefix + '.index'):
    for leftover in tf.io.gfile.glob(prefix + '_*'):
      tf.io.gfile.remove(leftover)
  return prefix


@dataclasses.dataclass(frozen=True)
class _Share:
  """What one input pipeline of `num_pipelines` reads: its files (`names`),
  or with fewer files than pipelines every file and a share of the read
  batches (`shard_batches`); its batch and read batch."""
  names: tf.data.Dataset
  num_pipelines: int
  pipeline_id: int
  batch_size: int
  shard_batches: bool
  reading_batch: int

  @classmethod
  def of(cls, files: List[str], batch_size: int,
         input_context: Optional[tf.distribute.InputContext],
         config: InputPipelineConfig) -> '_Share':
    num_pipelines, pipeline_id = 1, 0
    if input_context is not None:
      batch_size = input_context.get_per_replica_batch_size(batch_size)
      num_pipelines = input_context.num_input_pipelines
      pipeline_id = input_context.input_pipeline_id
    names = tf.data.Dataset.from_tensor_slices(files)
    shard_batches = num_pipelines > 1 and len(files) < num_pipelines
    if num_pipelines > 1 and not shard_batches:
      names = names.shard(num_pipelines, pipeline_id)
    # Sharded read batches are of the pipeline's batch: at the default read
    # batch, a file of fewer than that many rows x pipelines left a pipeline
    # none, looping over empty epochs (a cluster's first step hung).
    reading_batch = (batch_size if shard_batches else
                     read_batch_size(config, batch_size))
    return cls(names, num_pipelines, pipeline_id, batch_size, shard_batches,
               reading_batch)


def _resume_position(serialized: tf.data.Dataset, rows: int,
                     what: str) -> Tuple[int, int]:
  """(epoch, row in it) of the position `rows` rows in: every epoch has the
  rows `serialized` (one epoch's read batches) holds, so the resumed run
  builds that epoch and drops the rows before the position, at a cost of at
  most one epoch however long the training ran."""
  if not rows:
    return 0, 0
  rows_per_epoch = int(serialized.reduce(
      tf.constant(0, tf.int64),
      lambda count, batch: count + tf.shape(batch, out_type=tf.int64)[0]))
  if not rows_per_epoch:
    raise ValueError(f'No examples in {what}.')
  return divmod(rows, rows_per_epoch)


def build_dataset(file_patterns: List[str],
                  feature_spec: Dict[str, Any],
                  label_key: Optional[str],
                  batch_size: int,
                  config: Optional[InputPipelineConfig] = None,
                  *,
                  shuffle: bool = True,
                  seed: int = 0,
                  num_epochs: Optional[int] = None,
                  input_context: Optional[tf.distribute.InputContext] = None,
                  skip_batches: int = 0,
                  drop_remainder: bool = True,
                  split: Optional[str] = None,
                  readable_records: Optional[Dict[str, int]] = None
                 ) -> tf.data.Dataset:
  """Batched `(features, label)` (or `features` if no label_key) dataset.

  Args:
    file_patterns: Globs of (gzipped) TFRecord files of transformed
      tf.Examples. With an on-the-fly config, the raw examples of the same
      split (from the config) are read and transformed instead.
    feature_spec: Parsing spec, e.g.
      `TFTransformOutput.transformed_feature_spec()`.
    label_key: Feature popped into the label, or None.
    batch_size: Global batch size; with `input_context` each input pipeline
      batches `input_context.get_per_replica_batch_size(batch_size)`.
    config: Tuned pipeline config; defaults to `InputPipelineConfig()`.
    shuffle: Shuffle (seeded per epoch) the file order (not with a cache, or
      with batches sharded across pipelines), the examples within windows
      of `shuffle_window_batches` batches, and the batches when the config
      has a shuffle buffer.
    seed: Seed of every random choice, so runs are reproducible.
    num_epochs: Passes over the data; None repeats forever.
    input_context: Set by `strategy.distribute_datasets_from_function`; the
      files (or, with fewer files than pipelines, the batches) are sharded.
      Distribute the dataset that way, not with
      `experimental_distribute_dataset`: tf.data's auto-sharding finds no
      files inside the per-epoch `flat_map` (FILE fails) and its DATA
      rewrite breaks the batch shapes.
    skip_batches: Batches to skip from the start (exact resume), at a cost
      of up to two epochs of reading (the epoch's rows are counted first);
      the trainer resumes in `data_order` instead, at a cost of one shard.
    drop_remainder: Keep batch shapes static (needed for sync replicas).
    split: Split name for an on-the-fly config; by default taken from the
      `Split-<name>` folder of `file_patterns`.
    readable_records: Files read only up to that many records (damaged past
      them; `unreadable`, where the user opted in).
  """
  config = (config or InputPipelineConfig()).validate()
  compression_type = config.read_compression()
  file_patterns = patterns_read(config, file_patterns, split)
  files = list_files(file_patterns)
  share = _Share.of(files, batch_size, input_context, config)
  parser = make_parser(feature_spec, label_key, config)

  def serialized(file_names):
    batches = read_batches(file_names, config, compression_type,
                           share.reading_batch, readable_records)
    return (batches.shard(share.num_pipelines, share.pipeline_id)
            if share.shard_batches else batches)

  def parsed(file_names):
    return serialized(file_names).map(
        parser, num_parallel_calls=config.parse_parallel_calls,
        deterministic=config.deterministic)

  cached = None
  if config.cache != 'none':
    cached = parsed(share.names).cache(disk_cache_prefix(config, [
        files, share.reading_batch, share.num_pipelines, share.pipeline_id,
        sorted(feature_spec), label_key, shuffle, seed,
    ]) if config.cache == 'disk' else '')
  # The file order changes each epoch, except where it must not: a cache
  # replays its first pass, and batches sharded across pipelines must be
  # the same batches every epoch (so that every epoch has the same rows).
  shuffle_files = shuffle and cached is None and not share.shard_batches

  # Not converted by autograph: its branches are on Python values, and
  # converting it (with the readers it calls) took a quarter second a
  # dataset.
  @tf.autograph.experimental.do_not_convert
  def epoch_rows(epoch):
    """Epoch `epoch`'s rows (in chunks), a pure function of it and seed."""
    epoch_seed = seed_of_epoch(seed, epoch)
    if cached is not None:
      rows = cached
    elif shuffle_files:
      rows = parsed(share.names.shuffle(len(files), seed=epoch_seed))
    else:
      rows = parsed(share.names)
    if shuffle and config.shuffle_buffer_batches:
      rows = rows.shuffle(config.shuffle_buffer_batches, seed=epoch_seed)
    if shuffle and config.shuffle_window_batches:
      rows = shuffle_windows(
          rows, config.shuffle_window_batches * share.batch_size, epoch_seed)
    return rows

  first_epoch, first_row = _resume_position(
      serialized(share.names), skip_batches * share.batch_size,
      f'{file_patterns} for input pipeline {share.pipeline_id} of '
      f'{share.num_pipelines}')
  last_epoch = num_epochs if num_epochs is not None else _FOREVER
  dataset = tf.data.Dataset.range(first_epoch, last_epoch)
  dataset = drop_rows(dataset.take(1).flat_map(epoch_rows), first_row)
  epochs_after_first = tf.data.Dataset.range(first_epoch + 1, last_epoch)
  later_epochs = epochs_after_first
  if not skip_batches and last_epoch > first_epoch + 1:
    # Checked once, from one read batch, when the first epoch has ended
    # (with skip_batches the count above checked it).
    message = (f'No examples in {", ".join(file_patterns)} for input '
               f'pipeline {share.pipeline_id} of {share.num_pipelines} (its '
               f'share of {len(files)} file(s)): every epoch would be empty.')
    later_epochs = rows_or_error(serialized(share.names), message).flat_map(
        lambda _: epochs_after_first)
  dataset = dataset.concatenate(later_epochs.flat_map(epoch_rows))
  dataset = dataset.rebatch(share.batch_size, drop_remainder=drop_remainder)
  dataset = dataset.prefetch(config.prefetch_batches)
  return dataset.with_options(options(config))
