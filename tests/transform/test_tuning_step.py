"""The tuning as a step of records (fast, no TFX run): its plan before the
stock Transform, the model step prepared meanwhile, and the tuning on what
the Transform wrote, written and found again by the next run."""

import json
import os
import time

import pytest
import tensorflow as tf

from components.records import tuned_input_pipeline
from components.transform import artifact as artifact_lib
from components.transform.config import TuningConfig
from components.transform import history
from components.transform import model_preparation
from components.transform.model_preparation import ModelPreparation
from components.transform import tuner
from components.transform import tuning_step
from components.transform.tuning_step import Plan
from components.types import TunedInputPipeline
from tests.support import transform_data

NUM_EXAMPLES = 2000
BATCH = 64


def _training(reader_batch):
  return history.PreviousTraining(500.0, reader_batch, '/root/Trainer/run/1')


def test_the_previous_trainings_rate_is_the_consumer_at_the_same_batch():
  tuning = TuningConfig(batch_size=BATCH, tune_split='train')
  same = Plan.from_previous_training(tuning, '/t/1', _training(BATCH))
  assert same.consumer == tuner.ConsumerRate(
      500.0, "the previous run's training rate, /root/Trainer/run/1", BATCH)
  assert (same.notes, same.mismatches) == ((), ())
  assert not same.measures_model
  other = Plan.from_previous_training(tuning, '/t/1', _training(32))
  assert other.consumer is None and other.measures_model
  assert other.mismatches == (
      'the previous training (/root/Trainer/run/1) read batches of 32, the '
      f'tuning measures at {BATCH}',)
  assert other.notes == ('The previous training read another batch: its '
                         'rate was not used for the consumer.',)
  assert Plan.from_previous_training(tuning, '/t/1', None).measures_model
  no_early_stop = Plan.from_previous_training(
      TuningConfig(batch_size=BATCH, early_stop=False), '/t/1',
      _training(BATCH))
  assert no_early_stop.consumer is None and not no_early_stop.measures_model
  assert not Plan(tuning, '/t/1', not_tuned='no split').measures_model


def _preprocessing_fn(**module_globals):
  """A preprocessing_fn defined in a module holding `module_globals`."""
  namespace = {'__name__': 'user_module', **module_globals}
  exec('def preprocessing_fn(inputs):\n  return inputs\n', namespace)  # pylint: disable=exec-used
  return namespace['preprocessing_fn']


def _model(hparams):
  del hparams
  inputs = tf.keras.layers.Input(name='x', shape=(), dtype=tf.float32)
  output = tf.keras.layers.Dense(1, activation='sigmoid')(
      tf.keras.layers.Reshape((1,))(inputs))
  model = tf.keras.Model({'x': inputs}, output)
  model.compile(loss='binary_crossentropy', optimizer='adam')
  return model


def test_the_model_step_is_prepared_from_the_preprocessing_fns_module():
  preparation = ModelPreparation(_preprocessing_fn(build_model=_model,
                                                   LABEL_KEY='label'))
  measure, why_not = model_preparation.consumer(preparation, BATCH, 0.2)
  assert why_not == ''
  sample = {'x': tf.zeros([BATCH]), 'label': tf.zeros([BATCH, 1])}
  rate = measure(sample)
  assert rate.examples_per_sec > 0 and rate.batch_size == BATCH
  assert preparation.step.prepare_seconds > 0


def test_why_the_model_step_was_not_measured_is_said():
  assert model_preparation.consumer(None, BATCH, 0.2) == (
      None, 'The module was not loaded, so the consumer was not measured; '
      'searching as before.')
  no_model = ModelPreparation(_preprocessing_fn())
  assert no_model.step is None
  assert model_preparation.consumer(no_model, BATCH, 0.2) == (
      None, 'user_module defines no build_model(hparams) and LABEL_KEY, so '
      'the consumer was not measured; searching as before.')

  def broken(hparams):
    raise ValueError(f'no model for {hparams}')
  failed = ModelPreparation(_preprocessing_fn(build_model=broken,
                                              LABEL_KEY='label'))
  assert model_preparation.consumer(failed, BATCH, 0.2) == (
      None, 'Building the model for the consumer failed (ValueError: no '
      'model for {}); searching as before.')


@pytest.fixture(scope='module')
def patterns(tmp_path_factory):
  return transform_data.write_split(str(tmp_path_factory.mktemp('data')),
                                    NUM_EXAMPLES, num_files=4)


def _tune_and_write(patterns, tuned_uri):  # pylint: disable=redefined-outer-name
  """One run's tuning on `patterns`, written into a TunedInputPipeline."""
  tuning = TuningConfig(time_budget_s=3.0, measure_seconds=0.1,
                        batch_size=BATCH, max_candidates=1, early_stop=False,
                        tune_split='train')
  plan = Plan.from_previous_training(tuning, tuned_uri, None)
  key = history.tuning_key(transform_data.DENSE_SPEC, NUM_EXAMPLES, 'train',
                           BATCH)
  data = tuning_step.TransformedData(
      transform_data.DENSE_SPEC, '/graph', True, NUM_EXAMPLES, patterns, None,
      {}, key)
  counted = {'/out/Split-train/transformed_examples': NUM_EXAMPLES}
  tuned = tuning_step.tune(plan, tuning_step.StockTransform(
      2.5, counted, time.monotonic()), data)
  artifact = TunedInputPipeline()
  artifact.uri = tuned_uri
  tf.io.gfile.makedirs(tuned_uri)
  artifact_lib.write(artifact, tuned)
  return tuned, artifact


def test_a_tuning_is_written_and_reused_by_the_next_run(patterns, tmp_path):  # pylint: disable=redefined-outer-name
  first, artifact = _tune_and_write(patterns, str(tmp_path / 'tuned' / '1'))
  assert first.result.decision == tuner.SEARCHED
  assert 'early_stop is off: the consumer was not measured.' in (
      first.result.notes)
  assert first.report_rows[
      'examples per split (Beam counter)'] == 'Split-train: 2,000'
  assert first.report_rows['model step prepared while Beam ran (s)'] == 'no'
  assert first.report_rows['stock Transform seconds (inside this step, '
                           'sharded Beam write included)'] == '2.5'
  assert sorted(os.listdir(artifact.uri)) == [
      'candidates.png', tuned_input_pipeline.CONFIG_FILE,
      history.FINGERPRINT_FILE, 'report.md']
  with open(os.path.join(artifact.uri, history.FINGERPRINT_FILE)) as f:
    assert json.load(f)['num_examples'] == NUM_EXAMPLES
  assert artifact.get_float_custom_property('transform_seconds') == 2.5
  assert artifact.get_float_custom_property('after_transform_seconds') > 0
  assert artifact.get_string_custom_property('decision') == tuner.SEARCHED

  second, _ = _tune_and_write(patterns, str(tmp_path / 'tuned' / '2'))
  assert second.result.decision == tuner.REUSED
  assert any(n.startswith(f'Reused the previous tuning {artifact.uri}')
             for n in second.result.notes), second.result.notes
