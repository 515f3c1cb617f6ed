"""Measures input-pipeline candidates on transformed examples and picks one.

TensorFlow (and tf.Transform for the on-the-fly path), no TFX, so it tests
fast on small synthetic TFRecords. Everything runs against a wall-clock
deadline, the most informative measurements first (see `tune`). The parts:
`results` (what it returns), `measurement` (timing, the deadline), `sources`
(what it measures on), `decisions` (cache, placement, input-bound, the
search space; no measurement).

A search costs more than it saves where the trainer reads little: the
tuning spends at most `max_spend_fraction` of the default reader's time for
the trainer's `trainer_examples`, and keeps the defaults after one short
measurement where that cannot pay for a candidate.

The tuner also weighs the consumer: the model's training step rate (see
`consumer`). When the default reader delivers at least `input_bound_ratio`
times what the model consumes, training is not input-bound and no search can
speed it up, so the tuner stops with the defaults. A previous tuning of the
same data (`Previous`) is verified with one measurement instead of searching
again.
"""

import dataclasses
import os
from typing import Any, Dict, List, Optional, Sequence, Union

from components.data.config import DEFAULT_COMPRESSION
from components.data import memory_fit
from components.data.input_pipeline import InputPipelineConfig
from components.transform.config import TuningConfig
from components.transform import decisions
from components.transform import measurement
from components.transform.measurement import Clock
from components.transform.results import (
    KEPT_DEFAULTS, REUSED, SEARCHED, STOPPED_EARLY, ConsumerFn, ConsumerRate,
    DatasetFn, Measurement, Previous, StageRate, TuningResult)
from components.transform import sources as sources_lib
from components.transform.sources import Source


@dataclasses.dataclass(frozen=True)
class TuningInputs:
  """What `tune` measures on, and what it starts from."""
  tuning: TuningConfig
  # Transformed feature spec (parsing spec of the materialized examples, and
  # the outputs kept on the fly).
  feature_spec: Dict[str, Any]
  # Globs of the tune split's transformed examples, or None when Transform
  # did not materialize.
  materialized_patterns: Optional[List[str]] = None
  # Transform graph for the on-the-fly path, or None.
  transform_graph_uri: Optional[str] = None
  # Split -> globs of the raw tf.Examples (on the fly).
  raw_file_patterns: Optional[Dict[str, List[str]]] = None
  # Examples in the tune split, if known (else estimated).
  num_examples: Optional[int] = None
  # Name -> dataset factory measured for comparison only (e.g. the stock TFX
  # reader).
  references: Optional[Dict[str, DatasetFn]] = None
  # What training consumes: a known rate (e.g. the previous run's), or a
  # function measuring it on a sample batch (features with the label, parsed
  # by the default pipeline), or None (not known: search).
  consumer: Union[None, ConsumerRate, ConsumerFn] = None
  # A previous tuning of the same data to verify and reuse.
  previous: Optional[Previous] = None
  # Notes to start the report's list with.
  notes: Sequence[str] = ()
  # Other evidence that the measured batch is not the trainer's (e.g. the
  # batch the previous training read), for the flag.
  batch_mismatches: Sequence[str] = ()
  # Compression of the materialized and of the raw files.
  compression_type: str = DEFAULT_COMPRESSION
  raw_compression_type: str = DEFAULT_COMPRESSION
  # CPU cores for the search space; None: os.cpu_count().
  cores: Optional[int] = None
  # `time.monotonic()` at which the time budget started, if before `tune`.
  clock_start: Optional[float] = None


def tune(inputs: TuningInputs) -> TuningResult:
  """Measures candidates within `tuning.time_budget_s` and picks one.

  Order, most informative first: the default pipeline (materialized unless
  on the fly is requested or the only path), on a batch of the trainer's
  size; what the trainer's reading allows the tuning to spend (too little
  for a candidate: keep the defaults); the consumer. Training not
  input-bound (`tuning.early_stop`): stop with the defaults. Else a
  `previous` tuning of the same data is measured once and kept unless
  slower than the defaults. Else the search: the
  on-the-fly pipeline (always when it is the only or the requested
  placement, in 'auto' only if the budget leaves room for loading the
  transform graph); the references; a greedy search over the knobs at the
  best config so far; then, with time left, the chosen path's stage rates,
  the other path's and the later-epoch rate from the cache.
  """
  tuning = inputs.tuning.validate()
  search = _Search(tuning, Clock(tuning.time_budget_s,
                                 tuning.measure_seconds, inputs.clock_start),
                   sources_lib.make_sources(
                       tuning, inputs.feature_spec,
                       inputs.materialized_patterns,
                       inputs.transform_graph_uri, inputs.raw_file_patterns,
                       inputs.compression_type, inputs.raw_compression_type),
                   inputs.cores or os.cpu_count() or 1, list(inputs.notes),
                   [m for m in [tuning.batch_mismatch(),
                                *inputs.batch_mismatches] if m])
  sources, clock, notes = search.sources, search.clock, search.notes

  # 1. The default pipeline of the first path, keeping its first batch.
  first = ('on_the_fly' if tuning.materialize == 'on_the_fly' or
           'materialized' not in sources else 'materialized')
  kept: List[Any] = []
  defaults = {first: search.run(sources[first], {}, kept, quick=True)}
  defaults[first].note = 'quick measurement (the input-bound check)'
  probe = kept[0]

  # 2. Dataset size, then the cache decision (no measurement needed).
  bytes_per_example = measurement.dense_bytes(probe) / max(
      measurement.rows(probe), 1)
  num_examples = inputs.num_examples
  if num_examples is None:
    num_examples = measurement.estimate_num_examples(
        sources[first].files, sources[first].compression)
  search.decide_cache(num_examples, bytes_per_example)

  # 3. What the trainer's reading lets the tuning spend.
  if not search.pays_for_itself(defaults[first]):
    return search.result(sources[first], defaults[first], KEPT_DEFAULTS,
                         f'{first}: the default (a search cannot pay for '
                         'itself)')

  # 4. The consumer, and whether training is input-bound at all.
  search.weigh_consumer(inputs.consumer, probe, defaults[first])

  if tuning.early_stop and search.input_bound is False:
    notes.append('Stopped early with the default pipeline: training is not '
                 f'input-bound ({search.input_bound_reason}), so no reader '
                 'config can make it faster; nothing else was measured.')
    return search.result(sources[first], defaults[first], STOPPED_EARLY,
                         f'{first}: the default (stopped early)')

  # The quick default measurement decided the early stop; what follows
  # compares with it, so it is measured again at full length.
  defaults[first] = search.run(sources[first], {})

  # 5. A previous tuning of the same data: one measurement to verify it.
  if inputs.previous is not None:
    reused = _verify_previous(inputs.previous, sources, defaults, search.run,
                              clock, notes)
    if reused is not None:
      return search.result(
          sources[reused.placement], reused, REUSED,
          f'{reused.placement}: as in {inputs.previous.description}')

  # 6. The other placement, then where the transform runs.
  placement, placement_reason = search.choose_placement(defaults)
  source = sources[placement]

  # 7. References, for the report.
  reference_results = search.references(inputs.references or {})

  # 8. Greedy search over the knobs, each trial at the best config so far.
  best = search.greedy(source, defaults[placement])

  # 9. With time left: the stage rates of the chosen path, then the other's
  # (they explain the choice; the search makes it, so it goes first).
  stages = search.stage_rates(source, defaults)

  # 10. Later epochs from the memory cache, when filling it fits the budget.
  later = search.later_epochs_rate(source, best)
  return search.result(source, best, SEARCHED, placement_reason,
                       reference_results, stages, later)


class _Search:
  """One tuning's state: the deadline, the candidates measured so far, the
  notes for the report and the decisions taken."""

  def __init__(self, tuning: TuningConfig, clock: Clock,
               sources: Dict[str, Source], cores: int, notes: List[str],
               mismatches: List[str]):
    self.tuning = tuning
    self.clock = clock
    self.sources = sources
    self.cores = cores
    self.notes = notes
    self.batch = tuning.measure_batch_size
    self.candidates: List[Measurement] = []
    self.consumer: Optional[ConsumerRate] = None
    self.input_bound: Optional[bool] = None
    self.input_bound_reason = ''
    # Why the measured batch may not be the trainer's (the report's flag).
    self.mismatches = mismatches
    self.num_examples = 0
    self.cache = 'none'
    self.cache_reason = ''
    self.cache_bytes = 0
    self.ram_budget = 0

  def run(self, source: Source, changes: Dict[str, Any],
          keep_first: Optional[List[Any]] = None,
          quick: bool = False) -> Measurement:
    """Measures the trainer's pipeline with `changes`; a new candidate."""
    allowed = changes.get('deterministic', True) or (
        self.tuning.allow_nondeterministic)
    m = Measurement(
        decisions.describe(changes), source.placement,
        self.clock.measure(source.full(changes, self.batch), keep_first,
                           quick),
        dict(changes),
        allowed, '' if allowed else 'not allowed: exact resume needs a '
        'deterministic order (allow_nondeterministic=False)')
    self.candidates.append(m)
    return m

  def pays_for_itself(self, default: Measurement) -> bool:
    """Whether a search can pay for itself: the most it may spend,
    `max_spend_fraction` of the default reader's time for the trainer's
    reading, covers what has been spent and two more measurements (the
    default's at full length and one candidate). The deadline comes forward
    to that spend; a note says so."""
    examples = self.tuning.trainer_examples
    if examples is None:
      return True
    reading_s = examples / max(default.examples_per_sec, 1.0)
    affordable_s = self.tuning.max_spend_fraction * reading_s
    needed_s = self.clock.elapsed() + 2 * self.clock.measurement_cost
    spend = (f'the trainer reads {examples:,} examples, {reading_s:,.2f} s '
             f"at the default reader's {default.examples_per_sec:,.0f} "
             f'examples/s, so a search may spend at most '
             f'{self.tuning.max_spend_fraction:.0%} of that, '
             f'{affordable_s:,.2f} s')
    if affordable_s < needed_s:
      self.notes.append(
          f'Kept the default pipeline after one measurement: {spend}, less '
          f'than {needed_s:,.2f} s (spent so far and two more '
          'measurements).')
      return False
    if affordable_s < self.tuning.time_budget_s:
      self.clock.limit(affordable_s)
      self.notes.append(f'Search budget {affordable_s:,.1f} s: {spend} '
                        f'(time_budget_s={self.tuning.time_budget_s:g}).')
    return True

  def weigh_consumer(self, consumer: Union[None, ConsumerRate, ConsumerFn],
                     probe: Any, default: Measurement) -> None:
    """The consumer's rate (on the default reader's first batch), and
    whether training is input-bound at all."""
    self.consumer = _consumer_rate(consumer, probe, self.notes)
    if self.consumer is not None and self.consumer.batch_size != self.batch:
      self.mismatches.append(
          f'the consumer rate ({self.consumer.source}) is at batch '
          f'{self.consumer.batch_size}, the reader measured at {self.batch}')
    self.input_bound, self.input_bound_reason = decisions.input_bound(
        self.tuning, default, self.consumer)

  def choose_placement(self, defaults: Dict[str, Measurement]):
    """(placement, why), after measuring the on-the-fly path's default where
    it was not measured yet and the budget leaves room to load its graph."""
    if 'on_the_fly' in self.sources and 'on_the_fly' not in defaults:
      if self.clock.left() >= decisions.ON_THE_FLY_MIN_LEFT_S:
        defaults['on_the_fly'] = self.run(self.sources['on_the_fly'], {})
      else:
        self.notes.append(
            'On-the-fly transform not measured: loading the transform graph '
            f'needs ~{decisions.ON_THE_FLY_MIN_LEFT_S:.0f} s of budget.')
    return decisions.choose_placement(self.tuning, defaults,
                                      self.sources.keys())

  def references(self, references: Dict[str, DatasetFn]
                ) -> List[Measurement]:
    """Each reference measured once, for the report, as the budget allows."""
    measured = []
    for name, make in references.items():
      if not self.clock.fits(1):
        self.notes.append(f'Reference {name!r} not measured: time budget.')
        continue
      measured.append(Measurement(
          name, 'reference', self.clock.measure(make), {}, allowed=False,
          note='reference only'))
    return measured

  def stage_rates(self, chosen: Source, defaults: Dict[str, Measurement]
                 ) -> List[StageRate]:
    """The stage rates of `chosen`, then of the other path, as the budget
    allows."""
    stages = []
    for path in [chosen] + [other for other in self.sources.values()
                            if other is not chosen]:
      if path.placement in defaults:
        stages += sources_lib.stage_rates(path, defaults[path.placement],
                                          self.batch, self.clock, self.notes)
    return stages

  def decide_cache(self, num_examples: int, bytes_per_example: float) -> None:
    self.num_examples = num_examples
    self.cache_bytes = memory_fit.cache_bytes(num_examples,
                                              bytes_per_example)
    self.ram_budget = (self.tuning.ram_budget_bytes or
                       memory_fit.default_ram_budget())
    self.cache, self.cache_reason = decisions.choose_cache(
        self.tuning, self.cache_bytes, self.ram_budget)

  def final_config(self, source: Source,
                   best: Measurement) -> InputPipelineConfig:
    return _final_config(source, best, self.tuning, self.cache,
                         self.cache_bytes, self.ram_budget)

  def greedy(self, source: Source, best: Measurement) -> Measurement:
    """Each knob's alternatives in turn, at the best config so far."""
    clock, notes = self.clock, self.notes
    for knob, changes in decisions.search_space(
        len(source.shards()[0]), self.cores, self.read_ahead_limit(source)):
      if len(self.candidates) >= self.tuning.max_candidates:
        notes.append(f'Search stopped at max_candidates before {knob!r}.')
        break
      if not clock.fits(1):
        notes.append(f'Search stopped by the time budget before {knob!r}.')
        break
      trial = self.run(source, {**best.changes, **changes})
      if trial.allowed and trial.examples_per_sec > (
          best.examples_per_sec * decisions.MIN_GAIN):
        if clock.fits(2):
          best = _confirmed_better(source, best, trial, self.batch, clock)
        else:
          trial.note = 'faster once; no time left to confirm, not adopted'
          notes.append(f'Search stopped by the time budget at {knob!r}.')
          break
    return best

  def read_ahead_limit(self, source: Source) -> int:
    """The most shards read ahead that fit the RAM budget."""
    _, counts, _ = source.shards()
    largest = max(counts) * sources_lib.serialized_bytes_per_example(
        source, self.batch)
    return decisions.max_read_ahead(
        largest, self.ram_budget or memory_fit.default_ram_budget())

  def later_epochs_rate(self, source: Source,
                        best: Measurement) -> Optional[float]:
    """The memory cache's rate, when filling it fits the budget."""
    if self.cache != 'memory':
      return None
    fill_s = self.num_examples / max(best.examples_per_sec, 1.0)
    if self.clock.left() > fill_s + self.clock.measurement_cost:
      return sources_lib.cached_rate(source, self.final_config(source, best),
                                     self.batch, self.clock,
                                     self.num_examples)
    self.notes.append('Later-epoch (cached) rate not measured: time budget '
                      f'(filling the cache takes ~{fill_s:.1f} s).')
    return None

  def result(self, source: Source, best: Measurement, decision: str,
             placement_reason: str,
             reference_results: Optional[List[Measurement]] = None,
             stages: Optional[List[StageRate]] = None,
             later: Optional[float] = None) -> TuningResult:
    stages = stages or []
    costs = {s.stage: 1.0 / s.stage_examples_per_sec for s in stages
             if s.path == source.placement}
    return TuningResult(
        config=self.final_config(source, best),
        chosen=best, candidates=self.candidates,
        references=reference_results or [], stages=stages,
        bottleneck=max(costs, key=costs.get) if costs else 'not measured',
        cache_reason=self.cache_reason, placement_reason=placement_reason,
        num_examples=self.num_examples, cache_bytes=self.cache_bytes,
        ram_budget_bytes=self.ram_budget, batch_size=self.batch,
        later_epochs_examples_per_sec=later, seconds=self.clock.elapsed(),
        notes=self.notes, load_average=os.getloadavg()[0], cores=self.cores,
        consumer=self.consumer, input_bound=self.input_bound,
        input_bound_reason=self.input_bound_reason, decision=decision,
        batch_mismatch='; '.join(self.mismatches) or None)


def _final_config(source: Source, best: Measurement, tuning: TuningConfig,
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


def _verify_previous(previous: Previous, sources: Dict[str, Source],
                     defaults: Dict[str, Measurement], run, clock: Clock,
                     notes: List[str]) -> Optional[Measurement]:
  """The previous config, measured once; None if it is not kept."""
  placement = previous.config.transform_placement
  changes = decisions.knob_changes(previous.config)
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
  if trial.allowed and trial.examples_per_sec * decisions.MIN_GAIN >= (
      default.examples_per_sec):
    trial.note = f'reused from {previous.description}, verified'
    notes.append(f'Reused {previous.description} (same feature spec and '
                 'example count): verified at '
                 f'{trial.examples_per_sec:,.0f} examples/s vs the defaults\' '
                 f'{default.examples_per_sec:,.0f}; no search.')
    return trial
  trial.note = 'previous tuning, slower than the defaults now'
  notes.append(f'Previous tuning ({previous.description}) measured '
               f'{trial.examples_per_sec:,.0f} examples/s, below the '
               f'defaults\' {default.examples_per_sec:,.0f}' + (
                   '' if trial.allowed else ' (or not allowed)') +
               '; searching again.')
  return None


def _confirmed_better(source: Source, best: Measurement, trial: Measurement,
                      batch: int, clock: Clock) -> Measurement:
  """Re-measures both; the trial wins if its mean rate is still higher."""
  again_best = clock.measure(source.full(best.changes, batch))
  again_trial = clock.measure(source.full(trial.changes, batch))
  best.examples_per_sec = (best.examples_per_sec + again_best) / 2
  trial.examples_per_sec = (trial.examples_per_sec + again_trial) / 2
  trial.note = 'confirmed by a second measurement (mean of two)'
  return trial if trial.examples_per_sec > (
      best.examples_per_sec * decisions.MIN_GAIN) else best
