"""Measures input-pipeline candidates on transformed examples and picks one.

Pure-ish: TensorFlow (and tf.Transform for the on-the-fly path), no TFX, so
it tests fast on small synthetic TFRecords. Everything runs against a
wall-clock deadline, the most informative measurements first (see `tune`).

Rates are examples/s of steady-state iteration after a short warm-up, over
datasets that repeat, so a small sample measures as well as a large one.
"""

import dataclasses
import math
import os
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import tensorflow as tf

from components.data import input_pipeline
from components.transform.config import TuningConfig
from components.data.input_pipeline import AUTOTUNE, InputPipelineConfig

# A knob value replaces the best one only when it is this much faster in a
# second, interleaved measurement of both, so that noise on a shared machine
# does not flip choices.
MIN_GAIN = 1.05
# Memory the cached tensors take beyond their raw bytes (tf.data buffers,
# tensor headers).
CACHE_OVERHEAD = 1.1
# Lets AUTOTUNE settle before timing.
_WARMUP_S = 0.2
_WINDOWS = 3
# Kept back from the deadline for writing the report (matplotlib included).
_REPORT_RESERVE_S = 1.5
# Budget left that 'auto' needs to try the on-the-fly path: loading the
# transform graph into a tf.data function takes seconds the first time.
ON_THE_FLY_MIN_LEFT_S = 12.0

DatasetFn = Callable[[], tf.data.Dataset]


@dataclasses.dataclass
class Measurement:
  """One measured pipeline."""
  name: str
  placement: str  # 'materialized' | 'on_the_fly' | 'reference'
  examples_per_sec: float
  changes: Dict[str, Any]  # InputPipelineConfig fields vs the default
  allowed: bool = True
  note: str = ''


@dataclasses.dataclass
class StageRate:
  """Rate of a pipeline prefix, and the cost its last stage adds."""
  path: str  # 'materialized' | 'on_the_fly'
  stage: str  # 'read' | 'parse' | 'transform' | 'batch'
  cumulative_examples_per_sec: float
  stage_examples_per_sec: float
  bytes_per_sec: Optional[float] = None


@dataclasses.dataclass
class TuningResult:
  config: InputPipelineConfig
  chosen: Measurement
  candidates: List[Measurement]
  references: List[Measurement]
  stages: List[StageRate]
  bottleneck: str
  cache_reason: str
  placement_reason: str
  num_examples: int
  cache_bytes: int
  ram_budget_bytes: int
  batch_size: int
  later_epochs_examples_per_sec: Optional[float]
  seconds: float
  notes: List[str]
  # 1-minute load average and cores while measuring: rates from a busy
  # machine are lower and noisier.
  load_average: float = 0.0
  cores: int = 1


def physical_memory_bytes() -> int:
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def default_ram_budget() -> int:
  return physical_memory_bytes() // 4


def _rows(element) -> int:
  first = tf.nest.flatten(element)[0]
  return int(first.shape[0])


def measure_rate(make_dataset: DatasetFn, seconds: float) -> float:
  """Examples/s of iterating a dataset (repeated) after a warm-up.

  The median of three windows, so that a burst of other work on a shared
  machine in one window does not decide the result.
  """
  iterator = iter(make_dataset().repeat())
  next(iterator)  # Tracing and pipeline start-up are not timed.
  warm_until = time.perf_counter() + min(_WARMUP_S, seconds)
  while time.perf_counter() < warm_until:
    next(iterator)
  rates = []
  for _ in range(_WINDOWS):
    examples, start = 0, time.perf_counter()
    while True:
      examples += _rows(next(iterator))
      elapsed = time.perf_counter() - start
      if elapsed >= seconds / _WINDOWS:
        rates.append(examples / elapsed)
        break
  return statistics.median(rates)


def _dense_bytes(element) -> int:
  total = 0
  for t in tf.nest.flatten(element, expand_composites=True):
    total += t.shape.num_elements() * t.dtype.size
  return total


class _Source:
  """Files, compression and parser of one transform placement."""

  def __init__(self, placement: str, patterns: List[str], compression: str,
               base: InputPipelineConfig, feature_spec: Dict[str, Any],
               split: str):
    self.placement = placement
    self.patterns = patterns
    self.files = input_pipeline.list_files(patterns)
    self.compression = compression
    self.base = dataclasses.replace(base, transform_placement=placement)
    self.feature_spec = feature_spec
    self.split = split

  def config(self, changes: Dict[str, Any]) -> InputPipelineConfig:
    return dataclasses.replace(self.base, **changes).validate()

  def dataset(self, config: InputPipelineConfig, batch_size: int,
              shuffle: bool) -> tf.data.Dataset:
    """The trainer's pipeline (`build_dataset`) over this source."""
    return input_pipeline.build_dataset(
        self.patterns, self.feature_spec, None, batch_size, config,
        shuffle=shuffle, split=self.split)

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


def _search_space(num_files: int,
                  cores: int) -> List[Tuple[str, Dict[str, Any]]]:
  """(knob, alternative) trials, the knobs in the order they matter most."""
  parallel = sorted({min(n, max(num_files, 1)) for n in (cores, 2 * cores)})
  knobs = [
      ('reader batching', [{'batch_in_reader': False}]),
      ('interleave', [{'interleave_cycle_length': n,
                       'interleave_parallelism': n} for n in parallel]),
      ('read batch size',
       [{'read_batch_size': 4 * input_pipeline.MIN_READ_BATCH}]),
      ('parse parallel calls', [{'parse_parallel_calls': n}
                                for n in sorted({1, cores})]),
      ('read buffer', [{'read_buffer_bytes': 64 * 1024},
                       {'read_buffer_bytes': 4 * 1024 * 1024}]),
      ('prefetch', [{'prefetch_batches': 2}, {'prefetch_batches': 8}]),
      ('map parallelization', [{'map_parallelization': False}]),
      ('private threadpool', [{'private_threadpool_size': cores}]),
      ('deterministic', [{'deterministic': False}]),
  ]
  return [(knob, changes) for knob, alternatives in knobs
          for changes in alternatives]


_SHORT_NAMES = {
    'interleave_cycle_length': 'cycle',
    'interleave_parallelism': 'interleave_par',
    'parse_parallel_calls': 'parse_par',
    'read_buffer_bytes': 'buffer',
    'prefetch_batches': 'prefetch',
    'read_batch_size': 'read_batch',
    'private_threadpool_size': 'threads',
}


def _describe(changes: Dict[str, Any]) -> str:
  """A short label of a candidate's knobs, for the report and chart."""
  if not changes:
    return 'default'
  return ', '.join(f'{_SHORT_NAMES.get(k, k)}={v}'
                   for k, v in sorted(changes.items()))


class _Clock:
  """The deadline, and how long one measurement takes on this machine now.

  Each measurement costs more than its timed seconds (building and tracing
  the pipeline, warm-up), and more on a loaded machine; the slowest one so
  far is the estimate used to decide whether another fits the budget.
  """

  def __init__(self, budget_s: float, seconds: float,
               start: Optional[float] = None):
    self.start = time.monotonic() if start is None else start
    self.deadline = self.start + budget_s - _REPORT_RESERVE_S
    self.seconds = seconds
    self.measurement_cost = seconds + _WARMUP_S

  def measure(self, make_dataset: DatasetFn) -> float:
    started = time.monotonic()
    rate = measure_rate(make_dataset, self.seconds)
    self.measurement_cost = max(self.measurement_cost,
                                time.monotonic() - started)
    return rate

  def fits(self, measurements: int) -> bool:
    return self.left() >= measurements * self.measurement_cost

  def left(self) -> float:
    return self.deadline - time.monotonic()

  def elapsed(self) -> float:
    return time.monotonic() - self.start


def estimate_num_examples(files: List[str], compression: str) -> int:
  """Records in `files`, from the first file's records per byte."""
  per_byte = input_pipeline.count_records(files[:1], compression) / max(
      tf.io.gfile.stat(files[0]).length, 1)
  return round(per_byte * sum(tf.io.gfile.stat(f).length for f in files))


def choose_cache(tuning: TuningConfig, cache_bytes: int, ram_budget: int
                 ) -> Tuple[str, str]:
  """(cache mode, reason) from the dataset's cached size and the budgets."""
  fits = cache_bytes <= ram_budget
  sizes = (f'cached tensors ~{cache_bytes / 2**20:,.1f} MiB, RAM budget '
           f'{ram_budget / 2**20:,.1f} MiB')
  if tuning.cache == 'memory':
    if not fits:
      raise ValueError(f"cache='memory' was requested but the {sizes}: the "
                       'data does not fit; raise ram_budget_bytes or use '
                       "cache='disk'/'auto'/'none'.")
    return 'memory', f'memory (requested; {sizes})'
  if tuning.cache in ('disk', 'none'):
    return tuning.cache, f'{tuning.cache} (requested; {sizes})'
  if fits:
    return 'memory', f'memory: fits ({sizes})'
  if tuning.cache_dir:
    return 'disk', (f'disk at {tuning.cache_dir}: does not fit in memory '
                    f'({sizes})')
  return 'none', (f'none: does not fit in memory ({sizes}) and no cache_dir '
                  'was given for a disk cache')


def tune(tuning: TuningConfig,
         feature_spec: Dict[str, Any],
         *,
         materialized_patterns: Optional[List[str]] = None,
         transform_graph_uri: Optional[str] = None,
         raw_file_patterns: Optional[Dict[str, List[str]]] = None,
         num_examples: Optional[int] = None,
         references: Optional[Dict[str, DatasetFn]] = None,
         compression_type: str = 'GZIP',
         raw_compression_type: str = 'GZIP',
         cores: Optional[int] = None,
         clock_start: Optional[float] = None) -> TuningResult:
  """Measures candidates within `tuning.time_budget_s` and picks one.

  Order, most informative first: the default materialized pipeline; the
  on-the-fly pipeline (always when it is the only or the requested
  placement, in 'auto' only if the budget leaves room for loading the
  transform graph); the references; the chosen path's stage rates; a greedy
  search over the knobs at the best config so far; then, with time left, the
  other path's stage rates and the later-epoch rate from the cache.

  Args:
    tuning: The tuning config.
    feature_spec: Transformed feature spec (parsing spec of the materialized
      examples, and the outputs kept on the fly).
    materialized_patterns: Globs of the tune split's transformed examples, or
      None when Transform did not materialize.
    transform_graph_uri: Transform graph for the on-the-fly path, or None.
    raw_file_patterns: Split -> globs of the raw tf.Examples (on the fly).
    num_examples: Examples in the tune split, if known (else estimated).
    references: Name -> dataset factory measured for comparison only (e.g.
      the stock TFX reader).
    compression_type: Compression of the materialized files.
    raw_compression_type: Compression of the raw files.
    cores: CPU cores for the search space; defaults to os.cpu_count().
    clock_start: `time.monotonic()` at which the time budget started, if
      before this call (e.g. before re-sharding).
  """
  tuning = tuning.validate()
  clock = _Clock(tuning.time_budget_s, tuning.measure_seconds, clock_start)
  batch = tuning.batch_size
  cores = cores or os.cpu_count() or 1
  notes: List[str] = []
  sources = _sources(tuning, feature_spec, materialized_patterns,
                     transform_graph_uri, raw_file_patterns, compression_type,
                     raw_compression_type)
  candidates: List[Measurement] = []

  def run(source: _Source, changes: Dict[str, Any]) -> Measurement:
    allowed = changes.get('deterministic', True) or (
        tuning.allow_nondeterministic)
    m = Measurement(
        _describe(changes), source.placement,
        clock.measure(source.full(changes, batch)), dict(changes),
        allowed, '' if allowed else 'not allowed: exact resume needs a '
        'deterministic order (allow_nondeterministic=False)')
    candidates.append(m)
    return m

  # 1. Default pipelines, then where the transform runs.
  defaults = {}
  if 'materialized' in sources:
    defaults['materialized'] = run(sources['materialized'], {})
  if 'on_the_fly' in sources:
    required = (tuning.materialize == 'on_the_fly' or
                'materialized' not in sources)
    if required or clock.left() >= ON_THE_FLY_MIN_LEFT_S:
      defaults['on_the_fly'] = run(sources['on_the_fly'], {})
    else:
      notes.append('On-the-fly transform not measured: loading the transform '
                   f'graph needs ~{ON_THE_FLY_MIN_LEFT_S:.0f} s of budget.')
  placement, placement_reason = choose_placement(tuning, defaults,
                                                 sources.keys())
  source = sources[placement]

  # 2. References, for the report.
  reference_results = []
  for name, make in (references or {}).items():
    if not clock.fits(1):
      notes.append(f'Reference {name!r} not measured: time budget.')
      continue
    reference_results.append(Measurement(
        name, 'reference', clock.measure(make), {}, allowed=False,
        note='reference only'))

  # 3. Dataset size, then the cache decision.
  probe = next(iter(source.full({}, batch)()))
  bytes_per_example = _dense_bytes(probe) / max(_rows(probe), 1)
  if num_examples is None:
    num_examples = estimate_num_examples(source.files, source.compression)
  cache_bytes = int(num_examples * bytes_per_example * CACHE_OVERHEAD)
  ram_budget = tuning.ram_budget_bytes or default_ram_budget()
  cache, cache_reason = choose_cache(tuning, cache_bytes, ram_budget)

  # 4. Stage rates of the chosen path.
  stages = _stage_rates(source, defaults[placement], batch, clock, notes)

  # 5. Greedy search over the knobs, each trial at the best config so far.
  best = defaults[placement]
  for knob, changes in _search_space(len(source.files), cores):
    if len(candidates) >= tuning.max_candidates:
      notes.append(f'Search stopped at max_candidates before {knob!r}.')
      break
    if not clock.fits(1):
      notes.append(f'Search stopped by the time budget before {knob!r}.')
      break
    trial = run(source, {**best.changes, **changes})
    if trial.allowed and trial.examples_per_sec > (
        best.examples_per_sec * MIN_GAIN):
      if clock.fits(2):
        best = _confirmed_better(source, best, trial, batch, clock)
      else:
        trial.note = 'faster once; no time left to confirm, not adopted'
        notes.append(f'Search stopped by the time budget at {knob!r}.')
        break

  # 6. With time left: the other path's stages.
  for other in sources.values():
    if other is not source and other.placement in defaults:
      stages += _stage_rates(other, defaults[other.placement], batch, clock,
                             notes)

  config = source.config({
      **best.changes, 'cache': cache,
      'cache_dir': tuning.cache_dir if cache == 'disk' else None,
      'autotune_ram_budget_bytes': max(
          ram_budget - (cache_bytes if cache == 'memory' else 0), 0),
  })
  if placement == 'materialized':
    config = dataclasses.replace(config, transform_graph_uri=None,
                                 raw_file_patterns={}).validate()

  # 7. Later epochs from the memory cache, when filling it fits the budget.
  later = None
  if cache == 'memory':
    fill_s = num_examples / max(best.examples_per_sec, 1.0)
    if clock.left() > fill_s + clock.measurement_cost:
      later = _cached_rate(source, config, batch, clock, num_examples)
    else:
      notes.append('Later-epoch (cached) rate not measured: time budget '
                   f'(filling the cache takes ~{fill_s:.1f} s).')

  costs = {s.stage: 1.0 / s.stage_examples_per_sec for s in stages
           if s.path == placement}
  return TuningResult(
      config=config, chosen=best, candidates=candidates,
      references=reference_results, stages=stages,
      bottleneck=max(costs, key=costs.get) if costs else 'not measured',
      cache_reason=cache_reason, placement_reason=placement_reason,
      num_examples=num_examples, cache_bytes=cache_bytes,
      ram_budget_bytes=ram_budget, batch_size=batch,
      later_epochs_examples_per_sec=later, seconds=clock.elapsed(),
      notes=notes, load_average=os.getloadavg()[0], cores=cores)


def _confirmed_better(source: _Source, best: Measurement, trial: Measurement,
                      batch: int, clock: _Clock) -> Measurement:
  """Re-measures both; the trial wins if its mean rate is still higher."""
  again_best = clock.measure(source.full(best.changes, batch))
  again_trial = clock.measure(source.full(trial.changes, batch))
  best.examples_per_sec = (best.examples_per_sec + again_best) / 2
  trial.examples_per_sec = (trial.examples_per_sec + again_trial) / 2
  trial.note = 'confirmed by a second measurement (mean of two)'
  return trial if trial.examples_per_sec > (
      best.examples_per_sec * MIN_GAIN) else best


def _sources(tuning: TuningConfig, feature_spec: Dict[str, Any],
             materialized_patterns: Optional[List[str]],
             transform_graph_uri: Optional[str],
             raw_file_patterns: Optional[Dict[str, List[str]]],
             compression_type: str,
             raw_compression_type: str) -> Dict[str, _Source]:
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
    sources['materialized'] = _Source('materialized', materialized_patterns,
                                      compression_type, base, feature_spec,
                                      split)
  if on_the_fly and (tuning.materialize != 'always' or not sources):
    sources['on_the_fly'] = _Source('on_the_fly', raw_file_patterns[split],
                                    raw_compression_type, base, feature_spec,
                                    split)
  return sources


def choose_placement(tuning: TuningConfig, defaults: Dict[str, Measurement],
                     available) -> Tuple[str, str]:
  """(placement, reason) from the measured default pipelines."""
  rates = ', '.join(f'{p} {m.examples_per_sec:,.0f} examples/s'
                    for p, m in defaults.items())
  if 'materialized' not in available:
    return 'on_the_fly', f'on the fly: Transform did not materialize ({rates})'
  if tuning.materialize == 'on_the_fly':
    return 'on_the_fly', f"on the fly: requested ({rates})"
  if tuning.materialize == 'always':
    return 'materialized', f"materialized: requested ({rates})"
  if 'on_the_fly' not in defaults:
    return 'materialized', (
        'materialized: the default' + (
            '; no raw tf.Examples to transform on the fly'
            if 'on_the_fly' not in available else
            '; on the fly not measured (time budget)') + f' ({rates})')
  if (defaults['on_the_fly'].examples_per_sec >
      defaults['materialized'].examples_per_sec):
    return 'on_the_fly', ('on the fly: transforming raw examples beats '
                          f'reading materialized ones ({rates})')
  return 'materialized', ('materialized: reading transformed examples beats '
                          f'transforming on the fly ({rates})')


def _stage_rates(source: _Source, full: Measurement, batch: int,
                 clock: _Clock, notes: List[str]) -> List[StageRate]:
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
  read_bytes = _serialized_bytes_per_example(source, batch)
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


def _serialized_bytes_per_example(source: _Source, batch: int) -> float:
  dataset = tf.data.TFRecordDataset(source.files[0],
                                    compression_type=source.compression)
  sizes = next(iter(dataset.batch(batch).map(tf.strings.length)))
  return float(tf.reduce_mean(tf.cast(sizes, tf.float64)))


def _cached_rate(source: _Source, config: InputPipelineConfig, batch: int,
                 clock: _Clock, num_examples: int) -> float:
  """Rate of the epochs after the first, once the cache is filled.

  The skip over the first epoch fills the cache before the timing starts.
  """
  return clock.measure(
      lambda: source.dataset(config, batch, shuffle=True).skip(
          num_examples // batch + 2))
