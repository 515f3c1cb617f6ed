"""Builds the tf.data pipeline that feeds training from transformed examples.

This is the library half of OptimizedTransform: the tuner measures configs of
`InputPipelineConfig`, and HighPerfTrainer (or a `run_fn`) builds its dataset
with `build_dataset` from the chosen one. No TFX import, so it tests fast.

Determinism contract (relied on by exact resume): with `config.deterministic`
and a fixed `seed`, the sequence of batches is a pure function of the files,
the config and the seed, so `skip_batches=n` yields exactly the batches an
uninterrupted run would see from batch n on.
"""

import dataclasses
import json
from typing import Any, Dict, List, Optional

import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE
CACHE_MODES = ('none', 'memory', 'disk')


@dataclasses.dataclass
class InputPipelineConfig:
  """How to read, parse, cache and prefetch transformed examples.

  Integer knobs take -1 for tf.data AUTOTUNE.
  """
  interleave_cycle_length: int = AUTOTUNE
  interleave_parallelism: int = AUTOTUNE
  read_buffer_bytes: int = 8 * 1024 * 1024
  parse_parallel_calls: int = AUTOTUNE
  deterministic: bool = True
  prefetch_batches: int = AUTOTUNE
  cache: str = 'none'
  cache_dir: Optional[str] = None
  shuffle_buffer_batches: int = 0
  autotune_ram_budget_bytes: int = 0
  map_parallelization: bool = True
  private_threadpool_size: int = 0
  compression_type: str = 'GZIP'

  def validate(self) -> 'InputPipelineConfig':
    if self.cache not in CACHE_MODES:
      raise ValueError(f'cache={self.cache!r} is not one of {CACHE_MODES}.')
    if self.cache == 'disk' and not self.cache_dir:
      raise ValueError("cache='disk' needs cache_dir (a local folder).")
    for name in ('interleave_cycle_length', 'interleave_parallelism',
                 'parse_parallel_calls', 'prefetch_batches'):
      value = getattr(self, name)
      if value == 0 or value < AUTOTUNE:
        raise ValueError(f'{name}={value} must be positive or -1 (AUTOTUNE).')
    for name in ('read_buffer_bytes', 'shuffle_buffer_batches',
                 'autotune_ram_budget_bytes', 'private_threadpool_size'):
      if getattr(self, name) < 0:
        raise ValueError(f'{name}={getattr(self, name)} must be >= 0.')
    if self.compression_type not in ('GZIP', 'ZLIB', ''):
      raise ValueError(f'compression_type={self.compression_type!r} is not '
                       "one of ('GZIP', 'ZLIB', '').")
    return self

  def to_dict(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), sort_keys=True)

  @classmethod
  def from_dict(cls, values: Optional[Dict[str, Any]]) -> 'InputPipelineConfig':
    values = dict(values or {})
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      raise ValueError(f'Unknown input pipeline option(s) {unknown}; allowed: '
                       f'{sorted(known)}.')
    return cls(**values).validate()

  @classmethod
  def from_json(cls, text: str) -> 'InputPipelineConfig':
    return cls.from_dict(json.loads(text) if text else {})


def _options(config: InputPipelineConfig) -> tf.data.Options:
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
                  drop_remainder: bool = True) -> tf.data.Dataset:
  """Batched `(features, label)` (or `features` if no label_key) dataset.

  Args:
    file_patterns: Globs of (gzipped) TFRecord files of tf.Examples.
    feature_spec: Parsing spec, e.g. `TFTransformOutput.transformed_feature_spec()`.
    label_key: Feature popped into the label, or None.
    batch_size: Global batch size; with `input_context` each input pipeline
      batches `input_context.get_per_replica_batch_size(batch_size)`.
    config: Tuned pipeline config; defaults to `InputPipelineConfig()`.
    shuffle: Shuffle file order and batches each epoch (seeded).
    seed: Seed of every random choice, so runs are reproducible.
    num_epochs: Passes over the data; None repeats forever.
    input_context: Set by `strategy.distribute_datasets_from_function`; the
      files (or, with fewer files than pipelines, the records) are sharded.
    skip_batches: Batches to skip from the start (exact resume).
    drop_remainder: Keep batch shapes static (needed for sync replicas).
  """
  config = (config or InputPipelineConfig()).validate()
  files = sorted({f for p in file_patterns for f in tf.io.gfile.glob(p)})
  if not files:
    raise ValueError(f'No files match {file_patterns}.')
  if input_context is not None:
    batch_size = input_context.get_per_replica_batch_size(batch_size)
  dataset = tf.data.Dataset.from_tensor_slices(files)
  shard_records = False
  if input_context is not None and input_context.num_input_pipelines > 1:
    if len(files) >= input_context.num_input_pipelines:
      dataset = dataset.shard(input_context.num_input_pipelines,
                              input_context.input_pipeline_id)
    else:
      shard_records = True
  cycle_length = (min(len(files), config.interleave_cycle_length)
                  if config.interleave_cycle_length != AUTOTUNE else AUTOTUNE)
  dataset = dataset.interleave(
      lambda f: tf.data.TFRecordDataset(
          f, compression_type=config.compression_type,
          buffer_size=config.read_buffer_bytes),
      cycle_length=cycle_length,
      num_parallel_calls=config.interleave_parallelism,
      deterministic=config.deterministic)
  if shard_records:
    dataset = dataset.shard(input_context.num_input_pipelines,
                            input_context.input_pipeline_id)
  if config.cache == 'memory':
    dataset = dataset.cache()
  elif config.cache == 'disk':
    dataset = dataset.cache(config.cache_dir)
  dataset = dataset.repeat(num_epochs)
  dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
  if shuffle and config.shuffle_buffer_batches:
    dataset = dataset.shuffle(config.shuffle_buffer_batches, seed=seed,
                              reshuffle_each_iteration=True)
  dataset = dataset.skip(skip_batches)

  def parse(serialized):
    features = tf.io.parse_example(serialized, feature_spec)
    if label_key is None:
      return features
    label = features.pop(label_key)
    return features, label

  dataset = dataset.map(parse, num_parallel_calls=config.parse_parallel_calls,
                        deterministic=config.deterministic)
  dataset = dataset.prefetch(config.prefetch_batches)
  return dataset.with_options(_options(config))
