"""Measures input-pipeline candidates on transformed examples and picks one.

Pure-ish: TensorFlow (and tf.Transform for the on-the-fly path), no TFX, so
it tests fast on small synthetic TFRecords. Everything runs against a
wall-clock deadline, the most informative measurements first (see `tune`).

Rates are examples/s of steady-state iteration after a short warm-up, over
datasets that repeat, so a small sample measures as well as a large one.

The tuner also weighs the consumer: the model's training step rate (see
`consumer`). When the default reader delivers at least `input_bound_ratio`
times what the model consumes, training is not input-bound and no search can
speed it up, so the tuner stops with the defaults. A previous tuning of the
same data (`Previous`) is verified with one measurement instead of searching
again.
"""

import dataclasses
import math
import os
import statistics
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

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
# The first measurement (the default pipeline) only has to tell whether the
# reader is a factor (input_bound_ratio) faster than the model: half the
# warm-up and timed seconds. The search re-measures it at full length.
_QUICK = 0.5
_WINDOWS = 3
# Kept back from the deadline for writing the report (matplotlib included).
_REPORT_RESERVE_S = 1.5
# Budget left that 'auto' needs to try the on-the-fly path: loading the
# transform graph into a tf.data function takes seconds the first time.
ON_THE_FLY_MIN_LEFT_S = 12.0

# Default reader rate / consumer rate below which training is input-bound.
# The reader and the training step share the CPU cores here: at a ratio k the
# reader takes at most 1/(k+1) of the CPU time per example (none of it
# overlapped), and the search gains the reader 1.0-1.3x over the defaults on
# this data (benchmarks/results/transform.md), so at k = 4 the best a search
# could save is 0.2 * (1 - 1/1.3) ~ 5% of the step time, the noise level
# MIN_GAIN already ignores. With an accelerator the reader overlaps the step
# entirely, and k = 4 is the margin for a busier host than the one measured.
INPUT_BOUND_RATIO = 4.0
# InputPipelineConfig fields the search sets (what a reused config carries
# over); placement, cache and budgets are decided anew.
SEARCH_KNOBS = ('interleave_cycle_length', 'interleave_parallelism',
                'batch_in_reader', 'read_batch_size', 'parse_parallel_calls',
                'read_buffer_bytes', 'prefetch_batches',
                'map_parallelization', 'private_threadpool_size',
                'deterministic')
# Decisions (TuningResult.decision).
SEARCHED = 'searched'
STOPPED_EARLY = 'stopped early: training is not input-bound'
REUSED = 'reused the previous tuning (verified)'

DatasetFn = Callable[[], tf.data.Dataset]


@dataclasses.dataclass
class ConsumerRate:
  """How fast training consumes examples, and where the number comes from."""
  examples_per_sec: float
  source: str
  batch_size: int


# Measures the consumer on one parsed batch (features and label, a dict).
ConsumerFn = Callable[[Dict[str, Any]], ConsumerRate]


@dataclasses.dataclass
class Previous:
  """A previous tuning of the same data, to verify instead of searching."""
  config: InputPipelineConfig
  description: str


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
  # What the model consumes (None: not measured), and the verdict.
  consumer: Optional[ConsumerRate] = None
  input_bound: Optional[bool] = None
  input_bound_reason: str = ''
  decision: str = SEARCHED
  # Why the measured batch is not the trainer's, or None.
  batch_mismatch: Optional[str] = None


def physical_memory_bytes() -> int:
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def default_ram_budget() -> int:
  return physical_memory_bytes() // 4


def _rows(element) -> int:
  first = tf.nest.flatten(element)[0]
  return int(first.shape[0])


def _rows_tensor(element) -> tf.Tensor:
  """Rows of a batch, in the graph (dense, sparse or ragged first feature)."""
  first = tf.nest.flatten(element)[0]
  if isinstance(first, tf.sparse.SparseTensor):
    return first.dense_shape[0]
  if isinstance(first, tf.RaggedTensor):
    return first.nrows()
  return tf.shape(first, out_type=tf.int64)[0]


def _in_graph_puller(iterator) -> Callable[[int], int]:
  """pull(n): takes n batches inside one tf.function call; returns rows.

  The trainer takes its batches inside its compiled step, so the reader is
  timed the same way: iterating from Python costs tens of microseconds per
  batch, which at a small batch would be most of what is measured.
  """
  @tf.function(autograph=False)
  def pull(n):
    def body(i, rows):
      return i + 1, rows + _rows_tensor(iterator.get_next())
    _, rows = tf.while_loop(lambda i, _: i < n, body,
                            [tf.constant(0), tf.constant(0, tf.int64)])
    return rows

  return lambda n: int(pull(tf.constant(n, tf.int32)))


def measure_rate(make_dataset: DatasetFn, seconds: float,
                 keep_first: Optional[List[Any]] = None,
                 warmup_s: float = _WARMUP_S) -> float:
  """Examples/s of iterating a dataset (repeated) after a warm-up.

  The batches are taken inside a tf.function, as the trainer's step takes
  them. The median of three windows, so that a burst of other work on a
  shared machine in one window does not decide the result. `keep_first`, if
  given, gets the first element appended (a sample batch, at no extra cost).
  """
  iterator = iter(make_dataset().repeat())
  first = next(iterator)  # Tracing and pipeline start-up are not timed.
  if keep_first is not None:
    keep_first.append(first)
  pull = _in_graph_puller(iterator)
  pull(1)  # Traces the puller.
  # Warm-up (AUTOTUNE settles), which also times one batch.
  batches, start = 0, time.perf_counter()
  warm_until = start + min(warmup_s, seconds)
  step = 1
  while time.perf_counter() < warm_until:
    pull(step)
    batches += step
    step = min(2 * step, 64)
  per_batch = (time.perf_counter() - start) / max(batches, 1)
  rates = []
  for _ in range(_WINDOWS):
    n = max(1, int(seconds / _WINDOWS / max(per_batch, 1e-7)))
    start = time.perf_counter()
    rows = pull(n)
    elapsed = time.perf_counter() - start
    per_batch = elapsed / n
    rates.append(rows / elapsed)
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

  def measure(self, make_dataset: DatasetFn,
              keep_first: Optional[List[Any]] = None,
              quick: bool = False) -> float:
    started = time.monotonic()
    scale = _QUICK if quick else 1.0
    rate = measure_rate(make_dataset, self.seconds * scale, keep_first,
                        _WARMUP_S * scale)
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
         consumer: Union[None, ConsumerRate, ConsumerFn] = None,
         previous: Optional[Previous] = None,
         notes: Optional[List[str]] = None,
         batch_mismatches: Optional[List[str]] = None,
         compression_type: str = 'GZIP',
         raw_compression_type: str = 'GZIP',
         cores: Optional[int] = None,
         clock_start: Optional[float] = None) -> TuningResult:
  """Measures candidates within `tuning.time_budget_s` and picks one.

  Order, most informative first: the default pipeline (materialized unless
  on the fly is requested or the only path), on a batch of the trainer's
  size; the consumer. Training not input-bound (`tuning.early_stop`): stop
  with the defaults. Else a `previous` tuning of the same data is measured
  once and kept unless slower than the defaults. Else the search: the
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
    consumer: What training consumes: a known rate (e.g. the previous run's),
      or a function measuring it on a sample batch (features with the label,
      parsed by the default pipeline), or None (not known: search).
    previous: A previous tuning of the same data to verify and reuse.
    notes: Notes to start the report's list with.
    batch_mismatches: Other evidence that the measured batch is not the
      trainer's (e.g. the batch the previous training read), for the flag.
    compression_type: Compression of the materialized files.
    raw_compression_type: Compression of the raw files.
    cores: CPU cores for the search space; defaults to os.cpu_count().
    clock_start: `time.monotonic()` at which the time budget started, if
      before this call.
  """
  tuning = tuning.validate()
  clock = _Clock(tuning.time_budget_s, tuning.measure_seconds, clock_start)
  batch = tuning.measure_batch_size
  cores = cores or os.cpu_count() or 1
  notes = list(notes or [])
  mismatches = [m for m in [tuning.batch_mismatch(),
                             *(batch_mismatches or [])] if m]
  sources = _sources(tuning, feature_spec, materialized_patterns,
                     transform_graph_uri, raw_file_patterns, compression_type,
                     raw_compression_type)
  candidates: List[Measurement] = []

  def run(source: _Source, changes: Dict[str, Any],
          keep_first: Optional[List[Any]] = None,
          quick: bool = False) -> Measurement:
    allowed = changes.get('deterministic', True) or (
        tuning.allow_nondeterministic)
    m = Measurement(
        _describe(changes), source.placement,
        clock.measure(source.full(changes, batch), keep_first, quick),
        dict(changes),
        allowed, '' if allowed else 'not allowed: exact resume needs a '
        'deterministic order (allow_nondeterministic=False)')
    candidates.append(m)
    return m

  # 1. The default pipeline of the first path, keeping its first batch.
  first = ('on_the_fly' if tuning.materialize == 'on_the_fly' or
           'materialized' not in sources else 'materialized')
  kept: List[Any] = []
  defaults = {first: run(sources[first], {}, kept, quick=True)}
  defaults[first].note = 'quick measurement (the input-bound check)'
  probe = kept[0]

  # 2. The consumer, and whether training is input-bound at all.
  consumer_rate = _consumer_rate(consumer, probe, notes)
  if consumer_rate is not None and consumer_rate.batch_size != batch:
    mismatches.append(
        f'the consumer rate ({consumer_rate.source}) is at batch '
        f'{consumer_rate.batch_size}, the reader measured at {batch}')
  mismatch = '; '.join(mismatches) or None
  input_bound, input_bound_reason = _input_bound(
      tuning, defaults[first], consumer_rate)

  # 3. Dataset size, then the cache decision (no measurement needed).
  bytes_per_example = _dense_bytes(probe) / max(_rows(probe), 1)
  if num_examples is None:
    num_examples = estimate_num_examples(sources[first].files,
                                         sources[first].compression)
  cache_bytes = int(num_examples * bytes_per_example * CACHE_OVERHEAD)
  ram_budget = tuning.ram_budget_bytes or default_ram_budget()
  cache, cache_reason = choose_cache(tuning, cache_bytes, ram_budget)

  def result(source: _Source, best: Measurement, decision: str,
             placement_reason: str, reference_results: List[Measurement],
             stages: List[StageRate], later: Optional[float]
             ) -> TuningResult:
    costs = {s.stage: 1.0 / s.stage_examples_per_sec for s in stages
             if s.path == source.placement}
    return TuningResult(
        config=_final_config(source, best, tuning, cache, cache_bytes,
                             ram_budget),
        chosen=best, candidates=candidates,
        references=reference_results, stages=stages,
        bottleneck=max(costs, key=costs.get) if costs else 'not measured',
        cache_reason=cache_reason, placement_reason=placement_reason,
        num_examples=num_examples, cache_bytes=cache_bytes,
        ram_budget_bytes=ram_budget, batch_size=batch,
        later_epochs_examples_per_sec=later, seconds=clock.elapsed(),
        notes=notes, load_average=os.getloadavg()[0], cores=cores,
        consumer=consumer_rate, input_bound=input_bound,
        input_bound_reason=input_bound_reason, decision=decision,
        batch_mismatch=mismatch)

  if tuning.early_stop and input_bound is False:
    notes.append('Stopped early with the default pipeline: training is not '
                 f'input-bound ({input_bound_reason}), so no reader config '
                 'can make it faster; nothing else was measured.')
    return result(sources[first], defaults[first], STOPPED_EARLY,
                  f'{first}: the default (stopped early)', [], [], None)

  # The quick default measurement decided the early stop; what follows
  # compares with it, so it is measured again at full length.
  defaults[first] = run(sources[first], {})

  # 4. A previous tuning of the same data: one measurement to verify it.
  if previous is not None:
    reused = _verify_previous(previous, sources, defaults, run, clock, notes)
    if reused is not None:
      source = sources[reused.placement]
      return result(source, reused, REUSED,
                    f'{reused.placement}: as in {previous.description}', [],
                    [], None)

  # 5. The other placement, then where the transform runs.
  if 'on_the_fly' in sources and 'on_the_fly' not in defaults:
    if clock.left() >= ON_THE_FLY_MIN_LEFT_S:
      defaults['on_the_fly'] = run(sources['on_the_fly'], {})
    else:
      notes.append('On-the-fly transform not measured: loading the transform '
                   f'graph needs ~{ON_THE_FLY_MIN_LEFT_S:.0f} s of budget.')
  placement, placement_reason = choose_placement(tuning, defaults,
                                                 sources.keys())
  source = sources[placement]

  # 6. References, for the report.
  reference_results = []
  for name, make in (references or {}).items():
    if not clock.fits(1):
      notes.append(f'Reference {name!r} not measured: time budget.')
      continue
    reference_results.append(Measurement(
        name, 'reference', clock.measure(make), {}, allowed=False,
        note='reference only'))

  # 7. Stage rates of the chosen path.
  stages = _stage_rates(source, defaults[placement], batch, clock, notes)

  # 8. Greedy search over the knobs, each trial at the best config so far.
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

  # 9. With time left: the other path's stages.
  for other in sources.values():
    if other is not source and other.placement in defaults:
      stages += _stage_rates(other, defaults[other.placement], batch, clock,
                             notes)

  # 10. Later epochs from the memory cache, when filling it fits the budget.
  later = None
  if cache == 'memory':
    fill_s = num_examples / max(best.examples_per_sec, 1.0)
    if clock.left() > fill_s + clock.measurement_cost:
      later = _cached_rate(
          source, _final_config(source, best, tuning, cache, cache_bytes,
                                ram_budget), batch, clock, num_examples)
    else:
      notes.append('Later-epoch (cached) rate not measured: time budget '
                   f'(filling the cache takes ~{fill_s:.1f} s).')
  return result(source, best, SEARCHED, placement_reason, reference_results,
                stages, later)


def _final_config(source: '_Source', best: Measurement, tuning: TuningConfig,
                  cache: str, cache_bytes: int,
                  ram_budget: int) -> InputPipelineConfig:
  """The chosen knobs with the cache decision and the RAM left to tf.data."""
  config = source.config({
      **best.changes, 'cache': cache,
      'cache_dir': tuning.cache_dir if cache == 'disk' else None,
      'autotune_ram_budget_bytes': max(
          ram_budget - (cache_bytes if cache == 'memory' else 0), 0),
  })
  if source.placement == 'materialized':
    config = dataclasses.replace(config, transform_graph_uri=None,
                                 raw_file_patterns={}).validate()
  return config


def _consumer_rate(consumer: Union[None, ConsumerRate, ConsumerFn],
                   sample: Dict[str, Any],
                   notes: List[str]) -> Optional[ConsumerRate]:
  """The consumer's rate: given, measured on `sample`, or None (a note)."""
  if consumer is None or isinstance(consumer, ConsumerRate):
    return consumer
  try:
    return consumer(sample)
  except Exception as e:  # pylint: disable=broad-except
    # The consumer only decides whether to search; without it, search.
    notes.append(f'Consumer not measured ({type(e).__name__}: {e}); '
                 'searching as if training were input-bound.')
    return None


def _input_bound(tuning: TuningConfig, default: Measurement,
                 consumer: Optional[ConsumerRate]) -> Tuple[Optional[bool],
                                                            str]:
  """(input-bound?, why) from the default reader's and the consumer's rate."""
  if consumer is None:
    return None, 'consumer not measured'
  ratio = default.examples_per_sec / max(consumer.examples_per_sec, 1e-9)
  rates = (f'default reader {default.examples_per_sec:,.0f} examples/s = '
           f'{ratio:.1f}x the consumer\'s {consumer.examples_per_sec:,.0f} '
           f'({consumer.source})')
  if ratio >= tuning.input_bound_ratio:
    return False, f'{rates} >= {tuning.input_bound_ratio:g}x'
  return True, f'{rates} < {tuning.input_bound_ratio:g}x'


def knob_changes(config: InputPipelineConfig) -> Dict[str, Any]:
  """The search knobs of `config` that differ from the defaults."""
  default = InputPipelineConfig()
  return {k: getattr(config, k) for k in SEARCH_KNOBS
          if getattr(config, k) != getattr(default, k)}


def _verify_previous(previous: Previous, sources: Dict[str, '_Source'],
                     defaults: Dict[str, Measurement], run, clock: '_Clock',
                     notes: List[str]) -> Optional[Measurement]:
  """The previous config, measured once; None if it is not kept."""
  placement = previous.config.transform_placement
  changes = knob_changes(previous.config)
  if placement not in defaults:
    notes.append(f'Previous tuning ({previous.description}) not reused: its '
                 f'placement {placement!r} is not the measured default '
                 'path; searching.')
    return None
  if not changes:
    notes.append(f'Reused {previous.description}: it chose the defaults, '
                 'measured above.')
    return defaults[placement]
  if not clock.fits(1):
    notes.append(f'Previous tuning ({previous.description}) not verified: '
                 'time budget; keeping the defaults.')
    return defaults[placement]
  trial = run(sources[placement], changes)
  default = defaults[placement]
  if trial.allowed and trial.examples_per_sec * MIN_GAIN >= (
      default.examples_per_sec):
    trial.note = f'reused from {previous.description}, verified'
    notes.append(f'Reused {previous.description} (same feature spec and '
                 'example count): verified at '
                 f'{trial.examples_per_sec:,.0f} examples/s vs the defaults\' '
                 f'{default.examples_per_sec:,.0f}; no search.')
    return trial
  trial.note = 'previous tuning, slower than the defaults now'
  notes.append(f'Previous tuning ({previous.description}) measured '
               f'{trial.examples_per_sec:,.0f} examples/s, below the defaults\' '
               f'{default.examples_per_sec:,.0f}' + (
                   '' if trial.allowed else ' (or not allowed)') +
               '; searching again.')
  return None


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
