"""Tuner decisions and report on small synthetic TFRecords (fast).

Time budgets are small; the assertions are on decisions and bookkeeping,
never on how fast this shared machine happens to be.
"""

import pytest
import tensorflow as tf

from components.transform import report
from components.transform import tuner
from components.transform.config import TuningConfig
from tests import transform_data

NUM_EXAMPLES = 2000
# Cached size of one example: id, label (int64) and x (float32).
EXAMPLE_BYTES = 8 + 8 + 4
QUICK = dict(time_budget_s=1.5, measure_seconds=0.1, batch_size=64)


@pytest.fixture(scope='module')
def patterns(tmp_path_factory):
  return transform_data.write_split(str(tmp_path_factory.mktemp('data')),
                                    NUM_EXAMPLES, num_files=4)


def _tune(patterns, **changes):
  return tuner.tune(TuningConfig(**{**QUICK, **changes}),
                    transform_data.DENSE_SPEC, materialized_patterns=patterns,
                    num_examples=NUM_EXAMPLES)


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
  assert tuner.choose_cache(tuning, 10, 100)[0] == 'memory'
  assert tuner.choose_cache(tuning, 100, 10)[0] == 'none'
  assert tuner.choose_cache(TuningConfig(cache_dir='/c'), 100, 10)[0] == 'disk'
  assert tuner.choose_cache(TuningConfig(cache='none'), 10, 100)[0] == 'none'


def test_search_respects_budget_and_candidate_limit(patterns):
  result = _tune(patterns, max_candidates=3, time_budget_s=30.0)
  assert len(result.candidates) == 3
  assert any('max_candidates' in note for note in result.notes)
  # With time left, the later epochs are measured from the filled cache.
  assert result.config.cache == 'memory'
  assert result.later_epochs_examples_per_sec > 0
  quick = _tune(patterns, time_budget_s=2.0)
  # One measurement may start just before the deadline.
  assert quick.seconds < 2.0 + 1.0
  # The chosen config was measured and is deterministic (resume needs it).
  assert quick.chosen in quick.candidates
  assert quick.config.deterministic


def test_nondeterministic_candidates_only_when_allowed(patterns):
  trial = {'deterministic': False}
  assert not tuner.Measurement('t', 'materialized', 1.0, trial,
                               allowed=False).allowed
  result = _tune(patterns, time_budget_s=30.0, max_candidates=30,
                 measure_seconds=0.05)
  nondeterministic = [c for c in result.candidates
                      if c.changes.get('deterministic') is False]
  assert nondeterministic and not any(c.allowed for c in nondeterministic)
  assert result.config.deterministic


def test_stage_rates_and_report(patterns, tmp_path):
  stock = lambda: tf.data.TFRecordDataset(  # pylint: disable=g-long-lambda
      tf.io.gfile.glob(patterns[0]), 'GZIP').batch(64).map(
          lambda s: tf.io.parse_example(s, transform_data.DENSE_SPEC))
  # A budget that leaves room for every stage even on a loaded machine: the
  # tuner skips (and reports) stages it has no time for.
  result = tuner.tune(
      TuningConfig(**{**QUICK, 'time_budget_s': 12.0}),
      transform_data.DENSE_SPEC, materialized_patterns=patterns,
      references={'plain reader': stock})
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
    tuner.tune(TuningConfig(**QUICK), transform_data.DENSE_SPEC)


def test_placement_rules():
  fast, slow = (tuner.Measurement('d', p, r, {}) for p, r in
                (('materialized', 2.0), ('on_the_fly', 1.0)))
  both = {'materialized': fast, 'on_the_fly': slow}
  available = both.keys()
  assert tuner.choose_placement(TuningConfig(), both, available)[0] == (
      'materialized')
  slow.examples_per_sec = 3.0
  assert tuner.choose_placement(TuningConfig(), both, available)[0] == (
      'on_the_fly')
  assert tuner.choose_placement(TuningConfig(materialize='always'), both,
                                available)[0] == 'materialized'
  assert tuner.choose_placement(TuningConfig(), {'on_the_fly': slow},
                                ['on_the_fly'])[0] == 'on_the_fly'
  placement, reason = tuner.choose_placement(
      TuningConfig(), {'materialized': fast}, available)
  assert placement == 'materialized' and 'not measured' in reason
