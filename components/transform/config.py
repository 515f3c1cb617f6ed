"""OptimizedTransform's tuning config: one JSON-serializable exec property.

Pure Python (no TFX, no TensorFlow) so that the component constructor rejects
bad settings at pipeline-definition time, and the executor, the tuner and the
tests share one definition of what is allowed. Every error names the bad
value and the allowed ones.
"""

import dataclasses
from typing import Any, Dict, Optional, Sequence, Union

from components.json_config import JsonConfig

CACHE_MODES = ('auto', 'memory', 'disk', 'none')
MATERIALIZE_MODES = ('auto', 'always', 'on_the_fly')


@dataclasses.dataclass
class TuningConfig(JsonConfig):
  OPTIONS_NAME = 'tuning'
  """How OptimizedTransform measures and tunes the trainer's input pipeline.

  Attributes:
    time_budget_s: Wall-clock seconds for everything after the stock
      Transform (re-sharding, measuring, report), so the step stays close to
      the stock Transform's wall time.
    ram_budget_bytes: Memory the trainer's input pipeline may use: in-memory
      caching is chosen only when the measured dataset fits. None: a quarter
      of the tuning machine's physical memory.
    batch_size: Batch size of the measurements (use the trainer's).
    cache: 'auto' decides from the measured size against the budgets;
      'memory', 'disk' or 'none' force a mode ('memory' still must fit).
    cache_dir: Local folder for the on-disk cache; without it 'auto' never
      picks the disk.
    materialize: Where the transform runs for training: 'always' reads the
      materialized examples, 'on_the_fly' applies the transform graph inside
      the input pipeline, 'auto' picks the faster measured one (and
      on-the-fly whenever Transform does not materialize).
    num_output_shards: Files per materialized split, so that parallel
      interleave and per-worker sharding have files to work with; 0 keeps the
      files Transform wrote.
    max_candidates: Most pipeline configs measured (the time budget may stop
      the search earlier).
    measure_seconds: Timed seconds per measured pipeline.
    allow_nondeterministic: Let the tuner pick non-deterministic ordering when
      it is faster. Off by default: exact resume needs a deterministic order.
    tune_split: The materialized split the tuner measures on.
  """
  time_budget_s: float = 8.0
  ram_budget_bytes: Optional[int] = None
  batch_size: int = 256
  cache: str = 'auto'
  cache_dir: Optional[str] = None
  materialize: str = 'auto'
  num_output_shards: int = 16
  max_candidates: int = 12
  measure_seconds: float = 0.3
  allow_nondeterministic: bool = False
  tune_split: str = 'train'

  def validate(self) -> 'TuningConfig':
    """Raises ValueError naming the bad value and what is allowed."""
    if not _is_number(self.time_budget_s) or self.time_budget_s <= 0:
      raise ValueError('time_budget_s must be a positive number of seconds, '
                       f'got {self.time_budget_s!r}.')
    if self.ram_budget_bytes is not None and (
        not _is_int(self.ram_budget_bytes) or self.ram_budget_bytes <= 0):
      raise ValueError('ram_budget_bytes must be a positive int or None (a '
                       'quarter of physical memory), got '
                       f'{self.ram_budget_bytes!r}.')
    for name in ('batch_size', 'max_candidates'):
      value = getattr(self, name)
      if not _is_int(value) or value < 1:
        raise ValueError(f'{name} must be a positive int, got {value!r}.')
    if not _is_int(self.num_output_shards) or self.num_output_shards < 0:
      raise ValueError('num_output_shards must be an int >= 0 (0 keeps '
                       "Transform's files), got "
                       f'{self.num_output_shards!r}.')
    if (not _is_number(self.measure_seconds) or self.measure_seconds <= 0 or
        self.measure_seconds > self.time_budget_s):
      raise ValueError('measure_seconds must be positive and at most '
                       f'time_budget_s={self.time_budget_s}, got '
                       f'{self.measure_seconds!r}.')
    if self.cache not in CACHE_MODES:
      raise ValueError(
          f'cache must be one of {CACHE_MODES}, got {self.cache!r}.')
    if self.cache == 'disk' and not self.cache_dir:
      raise ValueError("cache='disk' needs cache_dir (a local folder).")
    if self.materialize not in MATERIALIZE_MODES:
      raise ValueError(f'materialize must be one of {MATERIALIZE_MODES}, got '
                       f'{self.materialize!r}.')
    if not isinstance(self.allow_nondeterministic, bool):
      raise ValueError('allow_nondeterministic must be a bool, got '
                       f'{self.allow_nondeterministic!r}.')
    if not isinstance(self.tune_split, str) or not self.tune_split:
      raise ValueError('tune_split must be a split name such as "train", got '
                       f'{self.tune_split!r}.')
    return self

  def validate_splits(self, analyze: Sequence[str], transform: Sequence[str],
                      materialize: bool) -> 'TuningConfig':
    """Checks the Transform's splits and materialization against tuning.

    Args:
      analyze: `splits_config.analyze`, or empty when no splits_config.
      transform: `splits_config.transform`, or empty when no splits_config
        (then Transform analyzes 'train' and transforms every split).
      materialize: The stock `materialize` argument.
    """
    if (analyze or transform) and not (analyze and transform):
      empty = 'analyze' if not analyze else 'transform'
      raise ValueError(
          f'splits_config.{empty} is empty; OptimizedTransform needs at least '
          'one split to analyze and one to transform and tune on (got '
          f'analyze={list(analyze)}, transform={list(transform)}).')
    if transform and self.tune_split not in transform:
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


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)
