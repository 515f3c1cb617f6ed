"""Finding the previous tuning and training in a pipeline root (fast)."""

import os
import time

import tensorflow as tf

from components.data.input_pipeline import InputPipelineConfig
from components.records import training_result
from components.records import tuned_input_pipeline
from components.transform import history

SPEC = {'x': tf.io.FixedLenFeature([1], tf.float32),
        'label': tf.io.FixedLenFeature([1], tf.int64)}
TUNED = InputPipelineConfig(parse_parallel_calls=1, cache='memory')


def _tuned_artifact(root, execution, key, config=TUNED):
  uri = os.path.join(root, 'Transform', 'tuned_input_pipeline',
                     str(execution))
  os.makedirs(uri)
  tuned_input_pipeline.write(uri, config)
  history.write_fingerprint(uri, key, {'decision': 'searched'})
  return uri


def _this_run(root, execution=9):
  uri = os.path.join(root, 'Transform', 'tuned_input_pipeline',
                     str(execution))
  os.makedirs(uri)
  return uri


def test_unchanged_spec_and_volume_reuse_the_newest(tmp_path):
  key = history.tuning_key(SPEC, 1000, 'train', 32)
  older = _tuned_artifact(str(tmp_path), 1, key,
                          InputPipelineConfig(prefetch_batches=2))
  time.sleep(0.01)
  newest = _tuned_artifact(str(tmp_path), 5, key)
  found = history.previous_tuning(_this_run(str(tmp_path)), key)
  assert found.uri == newest != older
  assert found.config == TUNED
  assert newest in found.reason


def test_changed_spec_volume_or_batch_are_not_reused(tmp_path):
  key = history.tuning_key(SPEC, 1000, 'train', 32)
  _tuned_artifact(str(tmp_path), 1, key)
  this = _this_run(str(tmp_path))
  changed_spec = {**SPEC, 'y': tf.io.FixedLenFeature([1], tf.float32)}
  for now, what in [
      (history.tuning_key(changed_spec, 1000, 'train', 32),
       'transformed feature spec'),
      (history.tuning_key(SPEC, 1001, 'train', 32),
       'example count (1000 then, 1001 now)'),
      (history.tuning_key(SPEC, 1000, 'train', 64), 'batch size'),
      (history.tuning_key(SPEC, None, 'train', 32), 'example count'),
  ]:
    found = history.previous_tuning(this, now)
    assert found.config is None, what
    assert what in found.reason and found.reason.startswith('not reused')
  # A dtype change is a spec change too.
  retyped = {**SPEC, 'x': tf.io.FixedLenFeature([1], tf.int64)}
  assert history.feature_spec_digest(retyped) != history.feature_spec_digest(
      SPEC)
  assert history.feature_spec_digest(dict(reversed(SPEC.items()))) == (
      history.feature_spec_digest(SPEC))


def test_no_previous_tuning(tmp_path):
  key = history.tuning_key(SPEC, 10, 'train', 32)
  this = _this_run(str(tmp_path))
  assert history.previous_tuning(this, key) is None
  # A folder of a failed execution (no fingerprint) is not a tuning.
  os.makedirs(os.path.join(os.path.dirname(this), '3'))
  assert history.previous_tuning(this, key) is None


def test_previous_training_rate_and_reader_batch(tmp_path):
  root = str(tmp_path)
  assert history.previous_training(root) is None
  run_dir = tmp_path / 'Trainer' / 'model_run' / '7'
  training_result.publish_steady_rate(root, training_result.SteadyRate(
      examples_per_sec=28000.0, reader_batch=64, model_run_dir=str(run_dir)))
  found = history.previous_training(root)
  assert found.examples_per_sec == 28000.0
  assert found.reader_batch == 64
  assert found.uri == str(run_dir)
