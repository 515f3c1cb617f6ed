"""Tuner decisions and report on small synthetic TFRecords (fast).

Time budgets are small; the assertions are on decisions and bookkeeping,
never on how fast this shared machine happens to be.
"""

import time

import pytest
import tensorflow as tf

from components.data.input_pipeline import InputPipelineConfig
from components.transform.config import TuningConfig
from components.transform import consumer as consumer_lib
from components.transform import decisions
from components.transform import measurement
from components.transform import report
from components.transform import tuner
from tests.support import transform_data

NUM_EXAMPLES = 2000
# Cached size of one example: id, label (int64) and x (float32).
EXAMPLE_BYTES = 8 + 8 + 4
QUICK = dict(time_budget_s=1.5, measure_seconds=0.1, batch_size=64)


@pytest.fixture(scope='module')
def patterns(tmp_path_factory):
  return transform_data.write_split(str(tmp_path_factory.mktemp('data')),
                                    NUM_EXAMPLES, num_files=4)


def _tune(patterns, consumer=None, previous=None, batch_mismatches=None,
          **changes):
  return tuner.tune(tuner.TuningInputs(
      TuningConfig(**{**QUICK, **changes}), transform_data.DENSE_SPEC,
      materialized_patterns=patterns, num_examples=NUM_EXAMPLES,
      consumer=consumer, previous=previous,
      batch_mismatches=batch_mismatches or ()))


def test_ram_budget_smaller_than_data_forbids_memory_cache(patterns, tmp_path):
  budget = NUM_EXAMPLES * EXAMPLE_BYTES // 2
  no_dir = _tune(patterns, ram_budget_bytes=budget)
  assert no_dir.config.cache == 'none'
  assert 'does not fit in memory' in no_dir.cache_reason
  assert no_dir.cache_bytes > budget
  with_dir = _tune(patterns, ram_budget_bytes=budget,
                   cache_dir=str(tmp_path))
  assert with_dir.config.cache == 'disk'
  assert with_dir.config.cache_dir == str(tmp_path)


def test_ram_budget_larger_than_data_caches_in_memory(patterns):
  result = _tune(patterns, ram_budget_bytes=10 * NUM_EXAMPLES * EXAMPLE_BYTES)
  assert result.config.cache == 'memory'
  # The dataset size is measured from the parsed tensors.
  assert (NUM_EXAMPLES * EXAMPLE_BYTES <= result.cache_bytes <=
          2 * NUM_EXAMPLES * EXAMPLE_BYTES)
  # The rest of the budget is left to tf.data's autotuner.
  assert (result.config.autotune_ram_budget_bytes ==
          10 * NUM_EXAMPLES * EXAMPLE_BYTES - result.cache_bytes)


def test_requested_memory_cache_that_does_not_fit_fails(patterns):
  with pytest.raises(ValueError, match="cache='memory' was requested but"):
    _tune(patterns, cache='memory', ram_budget_bytes=1000)


def test_choose_cache_rules():
  tuning = TuningConfig()
  assert decisions.choose_cache(tuning, 10, 100)[0] == 'memory'
  assert decisions.choose_cache(tuning, 100, 10)[0] == 'none'
  assert decisions.choose_cache(
      TuningConfig(cache_dir='/c'), 100, 10)[0] == 'disk'
  assert decisions.choose_cache(
      TuningConfig(cache='none'), 10, 100)[0] == 'none'


def test_search_respects_budget_and_candidate_limit(patterns):
  # A budget no loaded machine runs out of (30 s did once under the
  # two-worker suite, leaving no time for the later epochs): the candidate
  # limit ends this search.
  result = _tune(patterns, max_candidates=3, time_budget_s=600.0)
  assert len(result.candidates) == 3
  assert any('max_candidates' in note for note in result.notes)
  # With time left, the later epochs are measured from the filled cache.
  assert result.config.cache == 'memory'
  assert result.later_epochs_examples_per_sec > 0
  quick = _tune(patterns, time_budget_s=2.0)
  # The budget, not the candidate limit, ended this search, and says so.
  assert any('time budget' in note for note in quick.notes), quick.notes
  assert len(quick.candidates) < len(result.candidates)
  # The chosen config was measured and is deterministic (resume needs it).
  assert quick.chosen in quick.candidates
  assert quick.config.deterministic


def test_nondeterministic_candidates_only_when_allowed(patterns):
  trial = {'deterministic': False}
  assert not tuner.Measurement('t', 'materialized', 1.0, trial,
                               allowed=False).allowed
  # A budget no loaded machine runs out of before the 'deterministic' knob
  # (30 s did once, under the two-worker suite); the candidate limit and
  # the short measurements bound the search.
  result = _tune(patterns, time_budget_s=600.0, max_candidates=30,
                 measure_seconds=0.05)
  assert not any('time budget' in note for note in result.notes), result.notes
  nondeterministic = [c for c in result.candidates
                      if c.changes.get('deterministic') is False]
  assert nondeterministic and not any(c.allowed for c in nondeterministic)
  assert result.config.deterministic


def test_stage_rates_and_report(patterns, tmp_path):
  stock = lambda: tf.data.TFRecordDataset(  # pylint: disable=g-long-lambda
      tf.io.gfile.glob(patterns[0]), 'GZIP').batch(64).map(
          lambda s: tf.io.parse_example(s, transform_data.DENSE_SPEC))
  # A budget no machine runs out of (the tuner skips, and reports, stages
  # it has no time for); one candidate keeps the search itself short.
  result = tuner.tune(tuner.TuningInputs(
      TuningConfig(**{**QUICK, 'time_budget_s': 600.0, 'max_candidates': 1}),
      transform_data.DENSE_SPEC, materialized_patterns=patterns,
      references={'plain reader': stock}))
  # Estimated from file sizes when not given.
  assert abs(result.num_examples - NUM_EXAMPLES) < NUM_EXAMPLES * 0.1
  assert [s.stage for s in result.stages] == ['read', 'parse', 'batch']
  assert result.bottleneck in ('read', 'parse', 'batch')
  assert result.stages[0].bytes_per_sec > 0
  assert [r.name for r in result.references] == ['plain reader']
  md_path, png_path = report.write_report(result, str(tmp_path), {'k': 'v'})
  text = open(md_path).read()
  for expected in ('limited by: **', '## Stages', '## Candidates',
                   '## Chosen config', 'vs plain reader', '- k: v',
                   'transform placement: materialized'):
    assert expected in text
  with open(png_path, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def test_on_the_fly_needs_raw_examples(patterns):
  with pytest.raises(ValueError, match="materialize='on_the_fly' needs raw"):
    _tune(patterns, materialize='on_the_fly')
  with pytest.raises(ValueError, match='Nothing to tune on'):
    tuner.tune(tuner.TuningInputs(TuningConfig(**QUICK),
                                  transform_data.DENSE_SPEC))


def test_placement_rules():
  fast, slow = (tuner.Measurement('d', p, r, {}) for p, r in
                (('materialized', 2.0), ('on_the_fly', 1.0)))
  both = {'materialized': fast, 'on_the_fly': slow}
  available = both.keys()
  assert decisions.choose_placement(TuningConfig(), both, available)[0] == (
      'materialized')
  slow.examples_per_sec = 3.0
  assert decisions.choose_placement(TuningConfig(), both, available)[0] == (
      'on_the_fly')
  assert decisions.choose_placement(TuningConfig(materialize='always'), both,
                                available)[0] == 'materialized'
  assert decisions.choose_placement(TuningConfig(), {'on_the_fly': slow},
                                ['on_the_fly'])[0] == 'on_the_fly'
  placement, reason = decisions.choose_placement(
      TuningConfig(), {'materialized': fast}, available)
  assert placement == 'materialized' and 'not measured' in reason


# --- the consumer: early stop, the trainer's batch


def _slow_model(hparams):
  """A compiled model whose training step sleeps 20 ms: a slow consumer."""
  del hparams

  def sleep(x):
    time.sleep(0.02)
    return x

  def slow(t):
    out = tf.numpy_function(sleep, [t], tf.float32, stateful=True)
    out.set_shape(t.shape)
    return out

  inputs = tf.keras.layers.Input(name='x', shape=(), dtype=tf.float32)
  slowed = tf.keras.layers.Reshape((1,))(tf.keras.layers.Lambda(slow)(inputs))
  output = tf.keras.layers.Dense(1, activation='sigmoid')(slowed)
  model = tf.keras.Model({'x': inputs}, output)
  model.compile(loss='binary_crossentropy', optimizer='adam')
  return model


def test_slow_consumer_stops_early_with_the_defaults(patterns, tmp_path):
  seen = []

  def measure(sample):
    seen.append(int(sample['label'].shape[0]))
    # The real measurement (ModelStep) of a model at most 64 / 0.02 s fast.
    rate = consumer_lib.model_step_rate(_slow_model, 'label', sample, 0.3)
    return tuner.ConsumerRate(rate, 'slow test model', 64)

  stock = lambda: tf.data.TFRecordDataset(  # pylint: disable=g-long-lambda
      tf.io.gfile.glob(patterns[0]), 'GZIP').batch(64)
  result = tuner.tune(tuner.TuningInputs(
      TuningConfig(**{**QUICK, 'batch_size': None, 'trainer_batch_size': 64,
                      'time_budget_s': 30.0}),
      transform_data.DENSE_SPEC, materialized_patterns=patterns,
      num_examples=NUM_EXAMPLES, consumer=measure,
      references={'plain reader': stock}))
  # The consumer got a real batch of the trainer's size.
  assert seen == [64]
  assert result.consumer.examples_per_sec <= 64 / 0.02
  assert result.input_bound is False
  assert result.decision == tuner.STOPPED_EARLY
  # Only the default pipeline was measured: no search, no references.
  assert [c.changes for c in result.candidates] == [{}]
  assert result.references == [] and result.stages == []
  assert decisions.knob_changes(result.config) == {}
  assert result.config.cache == 'memory'  # The cache decision still holds.
  assert any('not input-bound' in n for n in result.notes)
  text = report.render_markdown(result, {})
  assert 'training is **not input-bound**' in text
  assert tuner.STOPPED_EARLY in text


def test_a_search_that_cannot_pay_for_itself_keeps_the_defaults(patterns):
  # 64 examples: a fraction of a millisecond of reading, nothing to save.
  fast = tuner.ConsumerRate(1e12, 'a consumer faster than any reader', 64)
  result = _tune(patterns, time_budget_s=6.0, consumer=fast,
                 trainer_examples=64)
  assert result.decision == tuner.KEPT_DEFAULTS
  assert [c.changes for c in result.candidates] == [{}]
  assert result.consumer is None  # Not measured either.
  assert result.config.cache == 'memory'  # The cache decision still holds.
  assert any(n.startswith('Kept the default pipeline after one measurement: '
                          'the trainer reads 64 examples') for n in
             result.notes)
  assert tuner.KEPT_DEFAULTS in report.render_markdown(result, {})


@pytest.mark.parametrize('trainer_examples, pays, budget_s', [
    (10, False, None),  # 0.01 s of reading: not one candidate's worth.
    (30_000, True, 3.0),  # 30 s of reading: 10% of it, under the 8 s.
    (10**6, True, None),  # 1,000 s: the 8 s budget is the bound.
])
def test_the_search_spends_a_fraction_of_what_the_reading_costs(
    trainer_examples, pays, budget_s):
  config = TuningConfig(trainer_examples=trainer_examples,
                        measure_seconds=0.3, time_budget_s=8.0)
  clock = measurement.Clock(config.time_budget_s, config.measure_seconds)
  deadline = clock.deadline
  search = tuner._Search(config, clock, {}, 2, [], [])  # pylint: disable=protected-access
  default = tuner.Measurement('default', 'materialized', 1000.0, {})
  assert search.pays_for_itself(default) is pays
  if budget_s is None:
    assert clock.deadline == deadline
  else:
    assert clock.deadline == pytest.approx(deadline - 8.0 + budget_s)
    assert search.notes == [
        'Search budget 3.0 s: the trainer reads 30,000 examples, 30.00 s at '
        "the default reader's 1,000 examples/s, so a search may spend at "
        'most 10% of that, 3.00 s (time_budget_s=8).']
  if not pays:
    assert search.notes[0].startswith(
        'Kept the default pipeline after one measurement: the trainer reads '
        '10 examples, 0.01 s')


def test_fast_consumer_searches(patterns):
  fast = tuner.ConsumerRate(1e12, 'a consumer faster than any reader', 64)
  result = _tune(patterns, time_budget_s=6.0, consumer=fast)
  assert result.input_bound is True
  assert result.decision == tuner.SEARCHED
  assert len(result.candidates) > 1
  assert 'training is **input-bound**' in report.render_markdown(result, {})


def test_early_stop_off_or_no_consumer_searches(patterns):
  slow = tuner.ConsumerRate(1.0, 'a consumer slower than any reader', 64)
  off = _tune(patterns, time_budget_s=4.0, consumer=slow, early_stop=False)
  assert off.input_bound is False and off.decision == tuner.SEARCHED
  assert len(off.candidates) > 1

  def broken(sample):
    raise RuntimeError('no model here')
  failed = _tune(patterns, time_budget_s=4.0, consumer=broken)
  assert failed.consumer is None and failed.input_bound is None
  assert failed.decision == tuner.SEARCHED
  assert any('Consumer not measured (RuntimeError: no model here)' in n
             for n in failed.notes)


def test_batch_mismatch_is_flagged(patterns):
  result = _tune(patterns, batch_size=64, trainer_batch_size=32,
                 time_budget_s=2.0)
  assert result.batch_size == 64
  assert result.batch_mismatch == ('measured at batch 64 but the trainer '
                                   'reads 32 examples per step')
  assert '**Batch mismatch:** measured at batch 64' in report.render_markdown(
      result, {})
  # A previous training that read another batch is flagged too.
  other = _tune(patterns, batch_size=None, trainer_batch_size=64,
                time_budget_s=2.0,
                batch_mismatches=['the previous training read batches of 32'])
  assert other.batch_size == 64
  assert other.batch_mismatch == 'the previous training read batches of 32'
  same = _tune(patterns, batch_size=None, trainer_batch_size=64,
               time_budget_s=2.0)
  assert same.batch_mismatch is None
  assert 'Batch mismatch' not in report.render_markdown(same, {})


# --- reusing a previous tuning


def test_previous_tuning_is_verified_instead_of_searched(patterns):
  fast = tuner.ConsumerRate(1e12, 'fast', 64)
  previous = tuner.Previous(InputPipelineConfig(cache='memory'),
                            'the previous tuning /p/1')
  result = _tune(patterns, time_budget_s=30.0, consumer=fast,
                 previous=previous)
  # It chose the defaults: the default measurement verified it (the quick
  # input-bound check, then the full-length one).
  assert result.decision == tuner.REUSED
  assert [c.changes for c in result.candidates] == [{}, {}]
  assert any('Reused the previous tuning /p/1' in n for n in result.notes)


class _FakeClock:

  def fits(self, measurements):
    del measurements
    return True


def _verify(previous_rate, changes):
  default = tuner.Measurement('default', 'materialized', 100.0, {})
  measured = []

  def run(source, trial_changes):
    del source
    measured.append(trial_changes)
    return tuner.Measurement('previous', 'materialized', previous_rate,
                             dict(trial_changes))
  notes = []
  kept = tuner._verify_previous(  # pylint: disable=protected-access
      tuner.Previous(InputPipelineConfig(**changes), 'the previous tuning'),
      {'materialized': object()}, {'materialized': default}, run,
      _FakeClock(), notes)
  return kept, measured, notes


def test_previous_config_kept_unless_slower_than_the_defaults():
  changes = {'parse_parallel_calls': 1, 'prefetch_batches': 2}
  kept, measured, _ = _verify(98.0, changes)  # Within noise of the defaults.
  assert measured == [changes] and kept.changes == changes
  assert 'verified' in kept.note
  slower, measured, notes = _verify(90.0, changes)
  assert slower is None and measured == [changes]
  assert 'searching again' in notes[-1]


def test_read_ahead_candidates_fit_the_ram_budget_and_the_shards():
  # K + 1 shards of 100 MB in half of a 1 GB budget: K = 4.
  assert decisions.max_read_ahead(100e6, 10**9) == 4
  assert decisions.max_read_ahead(10e9, 10**9) == 1
  tried = [changes['read_ahead_shards'] for knob, changes in
           decisions.search_space(num_files=6, cores=2, read_ahead_limit=8)
           if knob == 'read-ahead']
  assert tried == [2, 4]
  assert not [knob for knob, _ in decisions.search_space(64, 2, 1)
              if knob == 'read-ahead']
