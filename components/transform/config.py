"""OptimizedTransform's tuning config: one JSON-serializable exec property.

Pure Python (no TFX, no TensorFlow) so that the component constructor rejects
bad settings at pipeline-definition time, and the executor, the tuner and the
tests share one definition of what is allowed. Every error names the bad
value and the allowed ones.
"""

import dataclasses
from typing import Any, Dict, Optional, Sequence, Union

from components.json_config import is_int as _is_int
from components.json_config import is_number as _is_number
from components.json_config import JsonConfig

CACHE_MODES = ('auto', 'memory', 'disk', 'none')
MATERIALIZE_MODES = ('auto', 'always', 'on_the_fly')
# Measurement batch when neither batch_size nor trainer_batch_size is set.
DEFAULT_BATCH_SIZE = 256


@dataclasses.dataclass
class TuningConfig(JsonConfig):
  """How OptimizedTransform measures and tunes the trainer's input pipeline.

  Attributes:
    time_budget_s: Wall-clock seconds for everything after the stock
      Transform (measuring the reader and the model, searching, report), so
      the step stays close to the stock Transform's wall time.
    ram_budget_bytes: Memory the trainer's input pipeline may use: in-memory
      caching is chosen only when the measured dataset fits. None: a quarter
      of the tuning machine's physical memory.
    batch_size: Batch size of the measurements. None: `trainer_batch_size`,
      else DEFAULT_BATCH_SIZE. A value that differs from the trainer's batch
      is flagged in the report (the rates were measured at another batch).
    trainer_batch_size: Examples the trainer reads per step (its global
      batch times gradient-accumulation steps, per input pipeline);
      `pipelines.taxi_pipeline.hpm_factories` sets it from the trainer's
      distribution config.
    trainer_examples: Examples the trainer reads in all, per input pipeline
      (its train steps times `trainer_batch_size`); `hpm_factories` sets it
      from the Trainer's train_args. A tuned reader can save at most the
      default reader's time for them, so the tuning spends at most
      `max_spend_fraction` of that time (`time_budget_s` stays the upper
      bound); where that is less than one candidate's measurement, it keeps
      the defaults after the first, short one. None: unknown, the tuning
      spends up to `time_budget_s`.
    max_spend_fraction: The most of that time (0 < f <= 1) the tuning spends.
    trainer_data_partitions: Streams of the trainer's data order one
      replica's batch is cut from (its data partitions over its replicas;
      1 by default): the tuner reads that many, as the trainer does.
      `hpm_factories` sets it from the trainer's distribution config.
    cache: 'auto' decides from the measured size against the budgets;
      'memory', 'disk' or 'none' force a mode ('memory' still must fit).
    cache_dir: Local folder for the on-disk cache; without it 'auto' never
      picks the disk.
    materialize: Where the transform runs for training: 'always' reads the
      materialized examples, 'on_the_fly' applies the transform graph inside
      the input pipeline, 'auto' picks the faster measured one (and
      on-the-fly whenever Transform does not materialize).
    num_output_shards: Files per materialized split, written by Transform's
      own Beam write (so it scales with the runner), so that parallel
      interleave and per-worker sharding have files to work with; 0 lets the
      runner decide, as the stock Transform does. A lower bound: a split
      whose raw examples exceed `num_output_shards x max_shard_mb` gets one
      file per `max_shard_mb` of them, so that one shard stays a small part
      of an epoch at any size (a resume reads at most one shard per reader).
    max_shard_mb: The bound on a materialized shard, estimated from the raw
      examples' size (0: no bound, `num_output_shards` files).
    max_candidates: Most pipeline configs measured (the time budget may stop
      the search earlier).
    measure_seconds: Timed seconds per measured pipeline.
    allow_nondeterministic: Let the tuner pick non-deterministic ordering when
      it is faster. Off by default: exact resume needs a deterministic order.
    tune_split: The split the tuner measures on. None: 'train' when
      Transform transforms it (as by default), else the first split of
      `splits_config.transform`.
    early_stop: Also measure the consumer, the model's training step (the
      module's `build_model`, or the previous run's training rate), and stop
      with the default pipeline when training is not input-bound: when the
      default reader delivers at least `input_bound_ratio` times what the
      model consumes. False: always search.
    input_bound_ratio: Reader rate / consumer rate below which training
      counts as input-bound (see `decisions.INPUT_BOUND_RATIO` for the default's
      reasoning).
    reuse: Start from the config of this node's previous TunedInputPipeline
      when the transformed feature spec and the tune split's example count
      are unchanged, and verify it with one measurement instead of searching.
  """
  OPTIONS_NAME = 'tuning'
  time_budget_s: float = 8.0
  ram_budget_bytes: Optional[int] = None
  batch_size: Optional[int] = None
  trainer_batch_size: Optional[int] = None
  trainer_examples: Optional[int] = None
  max_spend_fraction: float = 0.1
  trainer_data_partitions: int = 1
  cache: str = 'auto'
  cache_dir: Optional[str] = None
  materialize: str = 'auto'
  num_output_shards: int = 16
  max_shard_mb: float = 128.0
  max_candidates: int = 12
  measure_seconds: float = 0.3
  allow_nondeterministic: bool = False
  tune_split: Optional[str] = None
  early_stop: bool = True
  input_bound_ratio: float = 4.0
  reuse: bool = True

  @property
  def measure_batch_size(self) -> int:
    """The batch the tuner measures at."""
    return self.batch_size or self.trainer_batch_size or DEFAULT_BATCH_SIZE

  def batch_mismatch(self) -> Optional[str]:
    """Why the measured batch is not the trainer's, or None."""
    if self.trainer_batch_size is None:
      return None if self.batch_size else (
          f'the trainer\'s batch is unknown (trainer_batch_size not set); '
          f'measured at {DEFAULT_BATCH_SIZE}')
    if self.measure_batch_size != self.trainer_batch_size:
      return (f'measured at batch {self.measure_batch_size} but the trainer '
              f'reads {self.trainer_batch_size} examples per step')
    return None

  def validate(self) -> 'TuningConfig':
    """Raises ValueError naming the bad value and what is allowed."""
    if not _is_number(self.time_budget_s) or self.time_budget_s <= 0:
      raise ValueError('time_budget_s must be a positive number of seconds '
                       f'(finite), got {self.time_budget_s!r}.')
    if self.ram_budget_bytes is not None and (
        not _is_int(self.ram_budget_bytes) or self.ram_budget_bytes <= 0):
      raise ValueError('ram_budget_bytes must be a positive int or None (a '
                       'quarter of physical memory), got '
                       f'{self.ram_budget_bytes!r}.')
    if not _is_int(self.max_candidates) or self.max_candidates < 1:
      raise ValueError('max_candidates must be a positive int, got '
                       f'{self.max_candidates!r}.')
    for name in ('batch_size', 'trainer_batch_size', 'trainer_examples'):
      value = getattr(self, name)
      if value is not None and (not _is_int(value) or value < 1):
        raise ValueError(f'{name} must be a positive int or None, got '
                         f'{value!r}.')
    if not _is_number(self.max_spend_fraction) or not (
        0 < self.max_spend_fraction <= 1):
      raise ValueError('max_spend_fraction must be a number in (0, 1], got '
                       f'{self.max_spend_fraction!r}.')
    if not _is_int(self.trainer_data_partitions, 1):
      raise ValueError('trainer_data_partitions must be a positive int, got '
                       f'{self.trainer_data_partitions!r}.')
    if self.measure_batch_size % self.trainer_data_partitions:
      raise ValueError(
          f'The measured batch {self.measure_batch_size} cannot be cut from '
          f'trainer_data_partitions={self.trainer_data_partitions} streams: '
          'use a batch it divides.')
    if not _is_int(self.num_output_shards) or self.num_output_shards < 0:
      raise ValueError('num_output_shards must be an int >= 0 (0 keeps '
                       "Transform's files), got "
                       f'{self.num_output_shards!r}.')
    if not _is_number(self.max_shard_mb) or self.max_shard_mb < 0:
      raise ValueError('max_shard_mb must be a finite number >= 0 (0: no '
                       f'bound), got {self.max_shard_mb!r}.')
    if (not _is_number(self.measure_seconds) or self.measure_seconds <= 0 or
        self.measure_seconds > self.time_budget_s):
      raise ValueError('measure_seconds must be positive and at most '
                       f'time_budget_s={self.time_budget_s} (finite), got '
                       f'{self.measure_seconds!r}.')
    if self.cache not in CACHE_MODES:
      raise ValueError(
          f'cache must be one of {CACHE_MODES}, got {self.cache!r}.')
    if self.cache_dir is not None and (
        not isinstance(self.cache_dir, str) or not self.cache_dir):
      raise ValueError('cache_dir must be a local folder path (a non-empty '
                       f'string) or None, got {self.cache_dir!r}.')
    if self.cache == 'disk' and not self.cache_dir:
      raise ValueError("cache='disk' needs cache_dir (a local folder).")
    if self.materialize not in MATERIALIZE_MODES:
      raise ValueError(f'materialize must be one of {MATERIALIZE_MODES}, got '
                       f'{self.materialize!r}.')
    for name in ('allow_nondeterministic', 'early_stop', 'reuse'):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f'{name} must be a bool, got '
                         f'{getattr(self, name)!r}.')
    if (not _is_number(self.input_bound_ratio) or
        self.input_bound_ratio <= 0):
      raise ValueError('input_bound_ratio must be a positive number (finite), '
                       f'got {self.input_bound_ratio!r}.')
    if self.tune_split is not None and (
        not isinstance(self.tune_split, str) or not self.tune_split):
      raise ValueError('tune_split must be a split name such as "train" (or '
                       f'None), got {self.tune_split!r}.')
    return self

  def split_to_tune(self, transform: Sequence[str]) -> Optional[str]:
    """The split to measure, of the transformed ones; None: nothing is.

    Args:
      transform: The splits Transform transforms (resolved: every split when
        there is no splits_config).
    """
    if self.tune_split is not None:
      return self.tune_split if self.tune_split in transform else None
    if 'train' in transform:
      return 'train'
    return transform[0] if transform else None

  def validate_splits(self, analyze: Sequence[str], transform: Sequence[str],
                      materialize: bool) -> 'TuningConfig':
    """Checks the Transform's splits and materialization against tuning.

    A splits_config that transforms nothing is the stock Transform's
    (analysis only): there is then nothing to tune, which the artifact says.

    Args:
      analyze: `splits_config.analyze`, or empty when no splits_config.
      transform: `splits_config.transform`, or empty when no splits_config
        (then Transform analyzes 'train' and transforms every split).
      materialize: The stock `materialize` argument.
    """
    if transform and not analyze:
      raise ValueError(
          'splits_config.analyze is empty; Transform needs at least one '
          f'split to analyze (got analyze={list(analyze)}, '
          f'transform={list(transform)}).')
    if transform and self.tune_split not in (None, *transform):
      raise ValueError(f'tune_split={self.tune_split!r} is not transformed; '
                       f'choose one of splits_config.transform='
                       f'{list(transform)}.')
    if not materialize and self.materialize == 'always':
      raise ValueError("materialize='always' needs Transform to materialize "
                       "examples; with materialize=False use 'on_the_fly' or "
                       "'auto'.")
    return self

  @classmethod
  def parse(cls, value: Union[None, str, Dict[str, Any], 'TuningConfig']
            ) -> 'TuningConfig':
    """Accepts a TuningConfig, a dict or a JSON string (component argument)."""
    if isinstance(value, cls):
      return value.validate()
    if value is None or isinstance(value, dict):
      return cls.from_dict(value)
    if isinstance(value, str):
      return cls.from_json(value)
    raise ValueError('tuning must be a TuningConfig, a dict or a JSON string, '
                     f'got {type(value).__name__}.')
