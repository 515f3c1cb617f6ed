"""What the tuner measures on: a placement's files and parser (`Source`),
read by the trainer's reader (the data order's `ordered_pipeline`), its stage
rates and its cached (later-epoch) rate."""

import dataclasses
import math
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf

from components.data import data_order
from components.data import input_pipeline
from components.data import ordered_pipeline
from components.data import shard_index
from components.data.input_pipeline import AUTOTUNE, InputPipelineConfig
from components.transform.config import TuningConfig
from components.transform import measurement
from components.transform.measurement import Clock
from components.transform.results import DatasetFn, Measurement, StageRate


# Shards the measured data order spans at most: the measurements read a
# few seconds of data, so the order's segment table stays this size
# however many shards the split has.
MEASURED_SHARDS = 64
SEED = 0


class Source:
  """Files, compression and parser of one transform placement, read as the
  trainer reads them: its data order over the split's shard index (the one
  written with the examples, else counts estimated from the file sizes),
  `partitions` streams, each `read_ahead_shards` shards ahead."""

  def __init__(self, placement: str, patterns: List[str], compression: str,
               base: InputPipelineConfig, feature_spec: Dict[str, Any],
               split: str, partitions: int = 1):
    self.placement = placement
    self.patterns = patterns
    self.files = input_pipeline.list_files(patterns)
    self.compression = compression
    self.base = dataclasses.replace(base, transform_placement=placement)
    self.feature_spec = feature_spec
    self.split = split
    self.partitions = partitions
    self._shards: Optional[Tuple[List[str], Tuple[int, ...], str]] = None

  def config(self, changes: Dict[str, Any]) -> InputPipelineConfig:
    return dataclasses.replace(self.base, **changes).validate()

  def shards(self) -> Tuple[List[str], Tuple[int, ...], str]:
    """The measured shards (at most MEASURED_SHARDS, in index order), their
    record counts, and where the counts come from."""
    if self._shards is None:
      files = self.files[:MEASURED_SHARDS]
      folder = shard_index.split_folder(self.patterns)
      path = folder and shard_index.artifact_index_path(folder)
      index = shard_index.read(folder, path) if path else None
      counts = index and index.records_by_path()
      if counts and all(f in counts for f in files):
        self._shards = (files, tuple(counts[f] for f in files),
                        f'the shard index {path}')
      else:
        per_byte = measurement.records_per_byte(files, self.compression)
        self._shards = (files, tuple(
            max(1, round(per_byte * tf.io.gfile.stat(f).length))
            for f in files), 'estimated from the file sizes')
    return self._shards

  def order(self, config: InputPipelineConfig, batch_size: int,
            shuffle: bool) -> data_order.DataOrder:
    """The trainer's data order over the measured shards at `batch_size`
    rows an update (one input pipeline)."""
    if batch_size % self.partitions:
      raise ValueError(f'batch_size={batch_size} cannot be shared by '
                       f'{self.partitions} data partitions.')
    batch = batch_size // self.partitions
    _, counts, _ = self.shards()
    return data_order.DataOrder(
        seed=SEED, partitions=self.partitions, batch=batch,
        window=config.shuffle_window_batches * batch if shuffle else 0,
        shard_records=counts, fixed_shard_order=config.cache != 'none')

  def dataset(self, config: InputPipelineConfig, batch_size: int,
              shuffle: bool, epochs: int = 1) -> tf.data.Dataset:
    """The trainer's reader over this source: `epochs` epochs of the
    measured shards."""
    files, _, _ = self.shards()
    order = self.order(config, batch_size, shuffle)
    return ordered_pipeline.build_ordered_dataset(
        files, self.feature_spec, None, order, config,
        compression_type=self.compression,
        updates=max(1, epochs * order.rows_per_partition // order.batch))

  def full(self, changes: Dict[str, Any], batch_size: int) -> DatasetFn:
    """The trainer's first-epoch pipeline (no cache) for these knobs."""
    config = self.config({**changes, 'cache': 'none'})
    return lambda: self.dataset(config, batch_size, shuffle=True)

  def prefix(self, batch_size: int, stage: str,
             raw_spec: Optional[Dict[str, Any]] = None) -> DatasetFn:
    """The default pipeline up to `stage`: 'read', 'parse' or 'transform'.

    'parse' on the fly parses the raw examples (`raw_spec`) without
    transforming them.
    """
    config = self.base

    def make():
      files = tf.data.Dataset.from_tensor_slices(self.files).repeat()
      dataset = input_pipeline.read_batches(
          files, config, self.compression,
          input_pipeline.read_batch_size(config, batch_size))
      if stage == 'read':
        return dataset.prefetch(AUTOTUNE)
      if stage == 'parse' and raw_spec is not None:
        parser = input_pipeline.make_parser(
            raw_spec, None, dataclasses.replace(
                config, transform_placement='materialized'))
      else:
        parser = input_pipeline.make_parser(self.feature_spec, None, config)
      return dataset.map(parser, num_parallel_calls=config.parse_parallel_calls,
                         deterministic=config.deterministic).prefetch(AUTOTUNE)
    return make


def make_sources(tuning: TuningConfig, feature_spec: Dict[str, Any],
             materialized_patterns: Optional[List[str]],
             transform_graph_uri: Optional[str],
             raw_file_patterns: Optional[Dict[str, List[str]]],
             compression_type: str,
             raw_compression_type: str) -> Dict[str, Source]:
  """The placements that can be measured, by name."""
  split = tuning.tune_split
  on_the_fly = bool(transform_graph_uri and raw_file_patterns and
                    split in raw_file_patterns)
  if materialized_patterns is None and not on_the_fly:
    raise ValueError('Nothing to tune on: no materialized examples and no raw '
                     f'tf.Examples of split {split!r} with a transform graph.')
  if tuning.materialize == 'on_the_fly' and not on_the_fly:
    raise ValueError("materialize='on_the_fly' needs raw tf.Examples of split "
                     f'{split!r} and a transform graph.')
  base = InputPipelineConfig(compression_type=compression_type,
                             raw_compression_type=raw_compression_type)
  if on_the_fly:
    base = dataclasses.replace(
        base, transform_graph_uri=transform_graph_uri,
        raw_file_patterns={k: list(v) for k, v in raw_file_patterns.items()})
  sources = {}
  if materialized_patterns is not None:
    sources['materialized'] = Source('materialized', materialized_patterns,
                                      compression_type, base, feature_spec,
                                      split, tuning.trainer_data_partitions)
  if on_the_fly and (tuning.materialize != 'always' or not sources):
    sources['on_the_fly'] = Source('on_the_fly', raw_file_patterns[split],
                                    raw_compression_type, base, feature_spec,
                                    split, tuning.trainer_data_partitions)
  return sources


def stage_rates(source: Source, full: Measurement, batch: int,
                 clock: Clock, notes: List[str]) -> List[StageRate]:
  """Cumulative rates of read -> parse (-> transform) -> batch on one path.

  'batch' is the whole default pipeline (rebatch, shuffle window, prefetch).
  The per-example cost a stage adds is the difference of the inverse
  cumulative rates; its reciprocal is the stage's own rate.
  """
  raw_spec = None
  stage_names = ['read', 'parse']
  if source.placement == 'on_the_fly':
    import tensorflow_transform as tft  # pylint: disable=g-import-not-at-top
    raw_spec = tft.TFTransformOutput(
        source.base.transform_graph_uri).raw_feature_spec()
    stage_names.append('transform')
  if not clock.fits(len(stage_names)):
    notes.append(f'Stage rates of the {source.placement} path not measured: '
                 'time budget.')
    return []
  cumulative = [(stage, clock.measure(source.prefix(batch, stage, raw_spec)))
                for stage in stage_names]
  cumulative.append(('batch', full.examples_per_sec))
  read_bytes = serialized_bytes_per_example(source, batch)
  result, previous_cost = [], 0.0
  for stage, rate in cumulative:
    # Noise can make a longer prefix measure faster: that stage costs ~0.
    cost = 1.0 / rate - previous_cost
    previous_cost = max(previous_cost, 1.0 / rate)
    result.append(StageRate(
        source.placement, stage, rate,
        1.0 / cost if cost > 0 else math.inf,
        rate * read_bytes if stage == 'read' else None))
  return result


def serialized_bytes_per_example(source: Source, batch: int) -> float:
  dataset = tf.data.TFRecordDataset(source.files[0],
                                    compression_type=source.compression)
  sizes = next(iter(dataset.batch(batch).map(tf.strings.length)))
  return float(tf.reduce_mean(tf.cast(sizes, tf.float64)))


def cached_rate(source: Source, config: InputPipelineConfig, batch: int,
                 clock: Clock, num_examples: int) -> float:
  """Rate of the epochs after the first, once the cache is filled.

  The skip over the first epoch fills the cache before the timing starts.
  """
  del num_examples  # The measured shards' epoch is what is cached.

  def later_epochs():
    order = source.order(config, batch, shuffle=True)
    first_epoch = max(1, order.rows_per_partition // order.batch)
    return source.dataset(config, batch, shuffle=True, epochs=3).skip(
        first_epoch)
  return clock.measure(later_epochs)
