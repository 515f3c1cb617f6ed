"""The training input pipeline of the data order (`data_order`).

An input pipeline reads only the partitions it owns; each partition is a
stream of its own: its shards' records, read in order from its position
(skipped at the record source, before any parsing), parsed in read batches,
window-shuffled and cut into batches. The pipeline takes batch j of each of
its partitions in turn and joins a replica's share of them into the
replica's batch, so update j trains the j-th batch of every partition for
any number of pipelines. A resume builds each stream at its position: it
reads at most the rest of one shard before the position and one window.
"""

from typing import Any, Callable, Dict, List, Optional

import tensorflow as tf

from components.data import data_order as data_order_lib
from components.data import input_pipeline
from components.data.config import InputPipelineConfig
from components.data.data_order import DataOrder


def _read_segments(paths: List[str], segments, config: InputPipelineConfig,
                   compression_type: str, read_batch: int,
                   read_counter: Optional[tf.Variable]) -> tf.data.Dataset:
  """Read batches of the records `segments` (tensors shard, skip, take)
  name, in order (`config.read_ahead_shards` at once). `read_counter`
  counts every record decompressed, the skipped ones included."""
  shards, skips, takes = segments
  table = tf.data.Dataset.from_tensor_slices(
      (tf.gather(tf.constant(paths), shards), skips, takes))
  if read_counter is None:
    return input_pipeline.read_in_order(table, config, compression_type,
                                        read_batch)

  @tf.autograph.experimental.do_not_convert
  def count_skipped(path, skip, take):
    with tf.control_dependencies([read_counter.assign_add(skip)]):
      return tf.identity(path), skip, take

  @tf.autograph.experimental.do_not_convert
  def count_read(batch):
    with tf.control_dependencies([read_counter.assign_add(
        tf.size(batch, out_type=tf.int64))]):
      return tf.identity(batch)

  return input_pipeline.read_in_order(
      table.map(count_skipped), config, compression_type,
      read_batch).map(count_read)


def _segment_tensors(segments: List[data_order_lib.Segment]):
  return (tf.constant([s.shard for s in segments], tf.int64),
          tf.constant([s.skip for s in segments], tf.int64),
          tf.constant([s.take for s in segments], tf.int64))


def partition_batches(order: DataOrder, paths: List[str], partition: int,
                      first_batch: int, batches: int, parser,
                      config: InputPipelineConfig, compression_type: str,
                      cache_prefix: Optional[str] = None,
                      read_counter: Optional[tf.Variable] = None
                     ) -> tf.data.Dataset:
  """Batches [first_batch, first_batch + batches) of `partition`."""
  start = order.start(first_batch)
  last_epoch = ((first_batch + batches) * order.batch -
                1) // order.rows_per_partition
  read_batch = input_pipeline.read_batch_size(config, order.batch)

  def rows_of(segments) -> tf.data.Dataset:
    # Decompressed in a thread of its own, ahead of the parsing.
    serialized = _read_segments(paths, segments, config, compression_type,
                                read_batch, read_counter).prefetch(
                                    input_pipeline.AUTOTUNE)
    return serialized.map(parser,
                          num_parallel_calls=config.parse_parallel_calls,
                          deterministic=True)

  def shuffled(rows, epoch, first_window=0):
    if not order.window:
      return rows
    seed = input_pipeline.seed_of_epoch(order.seed, epoch)
    return input_pipeline.shuffle_windows(rows, order.window, seed,
                                          stream=partition,
                                          first_window=first_window)

  cached = None
  if config.cache != 'none':
    # The shard order is fixed (`DataOrder.fixed_shard_order`): every epoch
    # has the same rows, parsed once.
    cached = rows_of(_segment_tensors(order.segments(0, partition))).cache(
        cache_prefix or '')

  if cached is not None and start.window_row == 0:
    first = cached
  else:
    first = rows_of(_segment_tensors(
        order.segments(start.epoch, partition, start.window_row)))
  first = shuffled(first, start.epoch,
                   start.window_row // order.window if order.window else 0)
  rows = input_pipeline.drop_rows(first, start.drop)

  if last_epoch > start.epoch:
    later = list(range(start.epoch + 1, last_epoch + 1))
    epochs = tf.data.Dataset.from_tensor_slices(tf.constant(later, tf.int64))
    if cached is not None:
      rows = rows.concatenate(epochs.flat_map(
          lambda epoch: shuffled(cached, epoch)))
    else:
      table = [(epoch, s) for epoch in later
               for s in order.segments(epoch, partition)]
      epoch_of = tf.constant([epoch for epoch, _ in table], tf.int64)
      all_segments = _segment_tensors([s for _, s in table])

      @tf.autograph.experimental.do_not_convert
      def epoch_rows(epoch):
        mine = tf.equal(epoch_of, epoch)
        return shuffled(rows_of(tuple(tf.boolean_mask(t, mine)
                                      for t in all_segments)), epoch)

      rows = rows.concatenate(epochs.flat_map(epoch_rows))
  return rows.rebatch(order.batch, drop_remainder=True).take(batches)


def build_ordered_dataset(paths: List[str], feature_spec: Dict[str, Any],
                          label_key: Optional[str], order: DataOrder,
                          config: Optional[InputPipelineConfig] = None, *,
                          compression_type: Optional[str] = None,
                          input_context: Optional[
                              tf.distribute.InputContext] = None,
                          start_update: int = 0, updates: int,
                          read_counter: Optional[tf.Variable] = None,
                          serve: Optional[Callable[..., tf.data.Dataset]]
                          = None) -> tf.data.Dataset:
  """The replica batches of updates [start_update, start_update + updates)
  for this input pipeline: `paths` are the index's shards in index order
  (those of the files the config reads: the raw ones on the fly).

  With `input_context`, pipeline i of n owns partitions [i * P/n, (i+1) *
  P/n) and each of its replicas takes P/(n x local replicas) consecutive
  partitions' batches as its batch; without it, one batch is a whole update.
  `serve(partition, first, batches, local_stream)`, where given, makes each
  partition's stream from `local_stream(first, batches)`, the function this
  pipeline would read it with (`offload` runs it elsewhere).
  """
  config = (config or InputPipelineConfig()).validate()
  if compression_type is None:
    compression_type = config.read_compression()
  num_pipelines, pipeline_id, replicas = 1, 0, 1
  if input_context is not None:
    num_pipelines = input_context.num_input_pipelines
    pipeline_id = input_context.input_pipeline_id
    replicas = input_context.num_replicas_in_sync // num_pipelines
  owned = data_order_lib.owned_partitions(order.partitions, num_pipelines,
                                          pipeline_id)
  if len(owned) % replicas:
    raise ValueError(f'{len(owned)} partitions cannot be shared evenly by '
                     f'{replicas} local replicas.')
  parser = input_pipeline.make_parser(feature_spec, label_key, config)
  streams = []
  for partition in owned:
    prefix = None
    if config.cache == 'disk':
      prefix = input_pipeline.disk_cache_prefix(config, [
          paths, order.state(), partition, sorted(feature_spec), label_key])
    def local_stream(first, batches, partition=partition, prefix=prefix):
      return partition_batches(order, paths, partition, first, batches,
                               parser, config, compression_type, prefix,
                               read_counter)
    streams.append(local_stream(start_update, updates) if serve is None else
                   serve(partition, start_update, updates, local_stream))
  if len(streams) == 1:
    dataset = streams[0]
  else:
    # Each stream is read ahead on its own, so the partitions are read in
    # parallel.
    turns = tf.data.Dataset.range(len(streams)).repeat(updates)
    dataset = tf.data.Dataset.choose_from_datasets(
        [stream.prefetch(1) for stream in streams], turns)
  if len(owned) > replicas:
    dataset = dataset.rebatch(len(owned) // replicas * order.batch,
                              drop_remainder=True)
  dataset = dataset.prefetch(config.prefetch_batches)
  return dataset.with_options(input_pipeline.options(config))
