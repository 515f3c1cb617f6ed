"""Warm start from `base_model`: the weights of a previous run's model, in
every form a stock module or ours saves it; the run_fn's `fn_args.base_model`
as under the stock Trainer (fast: tiny models in this process)."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf
from tfx.types import artifact_utils
from tfx.types import standard_artifacts
from tfx.types import standard_component_specs
from tfx.utils import path_utils

from components.trainer import fn_args as fn_args_lib
from components.trainer.managed import training
from components.trainer.managed import warm_start
from components.trainer.process.context import ProcessContext
from components.testing import trainer_testing as tt


def _model(units: int = 3) -> tf.keras.Model:
  model = tf.keras.Sequential([
      tf.keras.layers.Dense(units, input_shape=(2,)),
      tf.keras.layers.BatchNormalization(),
      tf.keras.layers.Dense(1, activation='sigmoid')])
  model.compile(loss='binary_crossentropy',
                optimizer=tf.keras.optimizers.Adam(learning_rate=0.01))
  return model


@pytest.fixture(scope='module')
def trained():
  """A trained model (BatchNormalization: non-trainable weights too)."""
  model = _model()
  rng = np.random.default_rng(0)
  x = rng.normal(size=(32, 2)).astype(np.float32)
  model.fit(x, (x[:, :1] > 0).astype(np.float32), epochs=3, verbose=0)
  return model


@pytest.mark.parametrize('save', ['keras', 'saved_model'])
@pytest.mark.parametrize('strategy', ['default', 'mirrored'])
def test_the_weights_come_from_the_base_model_and_the_optimizer_starts_fresh(
    tmp_path, trained, save, strategy):
  """As our export (model.save) and the stock taxi module
  (tf.saved_model.save) write it; in a strategy's scope as the loop builds
  models."""
  base = str(tmp_path / 'base')
  if save == 'keras':
    trained.save(base, save_format='tf')
  else:
    tf.saved_model.save(trained, base)
  scope = (tf.distribute.MirroredStrategy(['/cpu:0']) if strategy ==
           'mirrored' else tf.distribute.get_strategy())
  with scope.scope():
    model = _model()
    model.optimizer.learning_rate = 0.5  # This run's hyperparameter.
    model.optimizer.build(model.trainable_variables)

  record = warm_start.warm_start(model, base)

  assert record == {'base_model': base, 'weights': 8}
  for ours, theirs in zip(model.get_weights(), trained.get_weights()):
    np.testing.assert_array_equal(ours, theirs)
  assert int(model.optimizer.iterations.numpy()) == 0
  assert float(model.optimizer.learning_rate.numpy()) == 0.5


def test_another_architecture_fails_naming_the_weights(tmp_path, trained):
  base = str(tmp_path / 'base')
  trained.save(base, save_format='tf')
  wider = _model(units=4)
  before = [w.copy() for w in wider.get_weights()]
  with pytest.raises(warm_start.WarmStartError,
                     match=r"cannot warm-start this model: 7 of its 8 "
                     r"weights .*kernel:0 \[2, 4\] \(base model: \[2, 3\]\)"
                     r'.*\(and 2 more\)\. Warm start needs the architecture'):
    warm_start.warm_start(wider, base)
  # Nothing was assigned.
  for now, then in zip(wider.get_weights(), before):
    np.testing.assert_array_equal(now, then)


def test_a_folder_without_variables_fails_naming_it(tmp_path):
  with pytest.raises(warm_start.WarmStartError,
                     match=f"base_model '{tmp_path}' has no variables"):
    warm_start.warm_start(_model(), str(tmp_path))


def test_managed_training_warm_starts_once_then_resumes_its_own(tmp_path,
                                                                data):
  """A fresh training starts from the base model (learning rate 0: its
  export is the base model's weights); a rerun resumes its own checkpoint
  and does not warm-start again."""
  base_task = tt.make_task(str(tmp_path / 'base'), data, train_steps=6)
  training.run_managed_training(base_task,
                            tf.distribute.OneDeviceStrategy('/cpu:0'))
  task = tt.make_task(str(tmp_path / 'warm'), data, train_steps=4,
                      hparams={'learning_rate': 0.0})
  task.base_model = base_task.serving_model_dir

  result = training.run_managed_training(
      task, tf.distribute.OneDeviceStrategy('/cpu:0'))

  assert result.warm_start['base_model'] == base_task.serving_model_dir
  assert result.warm_start['weights'] > 0
  base = tf.saved_model.load(base_task.serving_model_dir)
  warm = tf.saved_model.load(task.serving_model_dir)
  for theirs, ours in zip(base.trainable_variables,
                          warm.trainable_variables):
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())

  task.train_steps = 6
  resumed = training.run_managed_training(
      task, tf.distribute.OneDeviceStrategy('/cpu:0'))
  assert resumed.warm_start is None
  assert resumed.start_step == 4


def test_run_fn_gets_the_base_model_as_from_the_stock_trainer(tmp_path,
                                                             data):
  examples = standard_artifacts.Examples()
  examples.uri = str(tmp_path / 'examples')
  examples.split_names = artifact_utils.encode_split_names(['train', 'eval'])
  base_model = standard_artifacts.Model()
  base_model.uri = str(tmp_path / 'base_model')
  os.makedirs(path_utils.serving_model_path(base_model.uri))
  outputs = {}
  for key, artifact in (
      (standard_component_specs.MODEL_KEY, standard_artifacts.Model()),
      (standard_component_specs.MODEL_RUN_KEY, standard_artifacts.ModelRun())):
    artifact.uri = str(tmp_path / key)
    outputs[key] = [artifact]
  task = tt.make_task(str(tmp_path), data)
  task.mode = 'run_fn'
  task.executor_io = {
      'input_dict': artifact_utils.jsonify_artifact_dict(
          {standard_component_specs.EXAMPLES_KEY: [examples],
           standard_component_specs.BASE_MODEL_KEY: [base_model]}),
      'output_dict': artifact_utils.jsonify_artifact_dict(outputs),
      'exec_properties': {
          standard_component_specs.TRAIN_ARGS_KEY: json.dumps(
              {'num_steps': 3}),
          standard_component_specs.EVAL_ARGS_KEY: json.dumps(
              {'num_steps': 1}),
          standard_component_specs.CUSTOM_CONFIG_KEY: 'null',
          standard_component_specs.RUN_FN_KEY: 'x.run_fn'}}

  fn_args = fn_args_lib.build_fn_args(ProcessContext.of_strategy(
      task, tf.distribute.OneDeviceStrategy('/cpu:0')))

  assert fn_args.base_model == path_utils.serving_model_path(base_model.uri)
