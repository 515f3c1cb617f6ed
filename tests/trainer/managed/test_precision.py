"""Mixed precision in the managed loop: fit's loss scaling, the module's
choice winning, `auto`'s rules, and exact resume with a loss-scale state.

The trajectory tests build the same model twice (same seed, same batches)
and train one with Keras `fit` and one with the managed loop's per-replica
step (`accumulation.replica_step_fn` under `SynchronousSteps`).
"""

import json
import signal

import numpy as np
import pytest
import tensorflow as tf

from components.trainer.managed import accumulation
from components.trainer.managed import precision
from components.trainer.managed import step_runners
from components.trainer.managed import training
from components.trainer.common import cpu_threads
from components.trainer import user_module
from components.testing import trainer_testing as tt

BATCH = 16
STEPS = 12
LOSS_SCALE = ('optimizer/loss_scale/current_loss_scale/.ATTRIBUTES/'
              'VARIABLE_VALUE')
GOOD_STEPS = 'optimizer/loss_scale/good_steps/.ATTRIBUTES/VARIABLE_VALUE'
ITERATIONS = 'optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE'


def _build(seed, loss='mse', policy=precision.FLOAT16):
  """A float16 MLP with a float32 output, compiled as a module would."""
  tf.keras.utils.set_random_seed(seed)
  tf.keras.mixed_precision.set_global_policy(policy)
  try:
    inputs = tf.keras.Input((8,))
    hidden = tf.keras.layers.Dense(32, activation='relu')(inputs)
    hidden = tf.keras.layers.Dense(32, activation='relu')(hidden)
    outputs = tf.keras.layers.Dense(1, dtype='float32')(hidden)
    model = tf.keras.Model(inputs, outputs)
    model.compile(tf.keras.optimizers.Adam(1e-3), loss)
  finally:
    tf.keras.mixed_precision.set_global_policy('float32')
  return model


def _batches(target_scale):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(BATCH * STEPS, 8)).astype('f4')
  y = (x @ rng.normal(size=(8,)) * target_scale).astype('f4')
  return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


def _train_with_fit(model, dataset):
  model.fit(dataset, epochs=1, steps_per_epoch=STEPS, shuffle=False,
            verbose=0)
  return model


def _train_managed(model, dataset, accumulation_steps=1, steps=STEPS):
  strategy = tf.distribute.get_strategy()
  replica_step = accumulation.replica_step_fn(
      model, accumulation_steps, BATCH, BATCH // accumulation_steps)
  runner = step_runners.SynchronousSteps(
      strategy, lambda context: dataset, replica_step,
      tf.Variable(0, dtype=tf.int64))
  runner(0, steps)
  return model


def _scale(model):
  return float(model.optimizer.loss_scale.numpy())


def test_float16_follows_fit_through_overflows():
  """Targets in the hundreds overflow float16 gradients at the initial
  scale (2**15): both loops skip those updates and halve the scale alike,
  then train to the same weights."""
  dataset = _batches(target_scale=300.0)
  fitted = _train_with_fit(_build(7), dataset)
  managed = _train_managed(_build(7), dataset)
  assert isinstance(managed.optimizer,
                    tf.keras.mixed_precision.LossScaleOptimizer)
  assert _scale(managed) < 2**15  # Halved at least once: an overflow.
  assert _scale(managed) == _scale(fitted)
  assert int(managed.optimizer.iterations) == STEPS
  for ours, theirs in zip(managed.get_weights(), fitted.get_weights()):
    np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=1e-5)
  # Updates did happen after the overflows.
  assert not np.allclose(managed.get_weights()[0], _build(7).get_weights()[0])


def test_gradients_below_float16s_range_train_only_with_loss_scaling():
  """A loss of ~1e-9 gives the float16 layers gradients that flush to zero
  unscaled: with the loss scale the managed loop trains them as fit does;
  without it (a plain optimizer) they never move."""
  tiny = lambda y, p: 1e-9 * tf.square(y - p)
  dataset = _batches(target_scale=1.0)
  initial = _build(3, tiny).get_weights()[0]
  fitted = _train_with_fit(_build(3, tiny), dataset)
  managed = _train_managed(_build(3, tiny), dataset)
  assert not np.allclose(managed.get_weights()[0], initial)
  np.testing.assert_allclose(managed.get_weights()[0],
                             fitted.get_weights()[0], rtol=1e-3, atol=1e-6)
  unscaled = _build(3, tiny)
  unscaled.optimizer = unscaled.optimizer.inner_optimizer
  _train_managed(unscaled, dataset)
  np.testing.assert_array_equal(unscaled.get_weights()[0], initial)


def test_overflowing_micro_steps_skip_their_whole_update_and_halve_once():
  """Two of the first update's 4 micro-steps overflow float16 at the initial
  scale: the whole update is skipped (the other micro-steps' gradients are
  not applied alone) and the scale halves once, not once per micro-step;
  the next update trains."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2 * BATCH, 8)).astype('f4')
  y = (x @ rng.normal(size=(8,))).astype('f4')
  micro = BATCH // 4
  for overflowing in (1, 3):
    y[overflowing * micro:(overflowing + 1) * micro] *= 1e6
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
  model = _build(5)
  initial = model.get_weights()
  _train_managed(model, dataset, accumulation_steps=4, steps=1)
  assert _scale(model) == 2**14
  for after, before in zip(model.get_weights(), initial):
    np.testing.assert_array_equal(after, before)
  _train_managed(model, dataset.skip(1), accumulation_steps=4, steps=1)
  assert _scale(model) == 2**14
  assert not np.array_equal(model.get_weights()[0], initial[0])


def test_float16_accumulation_equals_the_whole_batch():
  """4 micro-steps of 4 examples, each scaled, then unscaled: the update of
  the 16-example batch (float16 arithmetic: within its rounding). Unscaling
  once or per micro-step is the same sum here; the overflow test above
  tells a per-micro-step scaler apart (it would halve twice)."""
  dataset = _batches(target_scale=1.0)
  whole = _train_managed(_build(5), dataset)
  accumulated = _train_managed(_build(5), dataset, accumulation_steps=4)
  assert _scale(accumulated) == _scale(whole)
  for ours, theirs in zip(accumulated.get_weights(), whole.get_weights()):
    np.testing.assert_allclose(ours, theirs, rtol=2e-2, atol=2e-3)


def _managed_run(root, data, **distribution):
  hparams = distribution.pop('hparams', {})
  task = tt.make_task(root, data, train_steps=6, per_replica_batch_size=8,
                      hparams={'id_log': None, **hparams},
                      accumulation=distribution.pop('accumulation', 1))
  task.distribution.update(distribution)
  result = training.run_managed_training(
      task, tf.distribute.OneDeviceStrategy('/cpu:0'))
  return result, tt.latest_checkpoint_tensors(task.checkpoint_dir)


def test_accumulation_in_float16_equals_the_larger_batch(tmp_path, data):
  big, big_tensors = _managed_run(str(tmp_path / 'big'), data,
                                  precision='mixed_float16')
  small, small_tensors = _managed_run(
      str(tmp_path / 'small'), data, precision='mixed_float16',
      per_replica_batch_size=2, accumulation=4)
  assert big.precision == small.precision == {
      'policy': 'mixed_float16', 'source': 'config', 'loss_scaling': True,
      'reason': "distribution.precision='mixed_float16'"}
  assert small_tensors[ITERATIONS] == big_tensors[ITERATIONS] == 6
  assert small_tensors[LOSS_SCALE] == big_tensors[LOSS_SCALE]
  for name, value in big_tensors.items():
    np.testing.assert_allclose(small_tensors[name], value, rtol=2e-2,
                               atol=2e-3, err_msg=name)
  # The process's policy is back to float32 after the build.
  assert tf.keras.mixed_precision.global_policy().name == 'float32'


def test_the_modules_policy_wins_over_the_config(tmp_path, data):
  result, _ = _managed_run(str(tmp_path), data, precision='mixed_float16',
                           hparams={'dtype_policy': 'mixed_bfloat16'})
  assert result.precision['policy'] == 'mixed_bfloat16'
  assert result.precision['source'] == 'module'
  assert not result.precision['loss_scaling']
  assert "'mixed_float16' not applied" in result.precision['reason']
  assert tf.keras.mixed_precision.global_policy().name == 'float32'


def test_auto_uses_this_machines_native_bfloat16(tmp_path, data):
  # The machine's flags read here, not by the code under test.
  with open('/proc/cpuinfo') as f:
    flags = next(line for line in f if line.startswith('flags')).split()
  native = {'avx512_bf16', 'amx_bf16'} & set(flags)
  result, _ = _managed_run(str(tmp_path), data, precision='auto')
  assert result.precision['policy'] == (
      'mixed_bfloat16' if native else 'float32')
  assert result.precision['source'] == 'auto'
  assert not result.precision['loss_scaling']
  if native:
    assert sorted(native)[0] in result.precision['reason']


@pytest.mark.parametrize('hardware, supported, policy', [
    (precision.Hardware(tpu=True), False, 'mixed_bfloat16'),
    (precision.Hardware(gpu_compute_capabilities=((8, 0), (9, 0))), True,
     'mixed_bfloat16'),
    (precision.Hardware(gpu_compute_capabilities=((7, 5),)), True,
     'mixed_float16'),
    (precision.Hardware(gpu_compute_capabilities=((7, 0),)), False,
     'float32'),
    (precision.Hardware(gpu_compute_capabilities=((8, 6), (7, 0))), True,
     'mixed_float16'),
    (precision.Hardware(gpu_compute_capabilities=((6, 1),)), True,
     'float32'),
    (precision.Hardware(cpu_flags=frozenset({'avx512f', 'avx512_bf16'})),
     True, 'mixed_bfloat16'),
    (precision.Hardware(cpu_flags=frozenset({'amx_bf16'})), True,
     'mixed_bfloat16'),
    (precision.Hardware(cpu_flags=frozenset({'avx2', 'avx512f'})), True,
     'float32'),
])
def test_auto_rules(hardware, supported, policy):
  chosen, reason = precision.choose(hardware, supported)
  assert chosen == policy
  assert hardware.describe() in reason


def test_auto_keeps_float32_for_a_cpu_model_bound_by_its_input():
  bf16_cpu = precision.Hardware(cpu_flags=frozenset({'avx512_bf16'}))
  small = cpu_threads.COMPUTE_BOUND_WEIGHTS - 1
  policy, reason = precision.choose(bf16_cpu, True, model_weights=small)
  assert policy == 'float32' and f'{small:,} weights' in reason
  assert precision.choose(bf16_cpu, True, model_weights=small * 2)[0] == (
      'mixed_bfloat16')
  # GPUs compute in half precision whatever the model's size.
  gpu = precision.Hardware(gpu_compute_capabilities=((8, 0),))
  assert precision.choose(gpu, True, model_weights=10)[0] == 'mixed_bfloat16'


def test_the_executor_counts_the_models_weights():
  from components.testing import id_recording_module  # pylint: disable=g-import-not-at-top
  hidden = id_recording_module.DEFAULT_HPARAMS['hidden_units']
  features = id_recording_module.NUM_FEATURES
  assert user_module.count_weights(id_recording_module, {'id_log': None}) == (
      features * hidden + hidden + hidden + 1)

  class Subclassed:

    @staticmethod
    def build_model(hparams):
      del hparams
      return tf.keras.Sequential([tf.keras.layers.Dense(2)])  # No inputs.

  assert user_module.count_weights(Subclassed, {}) is None


def test_the_executor_counts_only_where_an_auto_option_reads_it():
  from components.trainer import executor  # pylint: disable=g-import-not-at-top
  from components.trainer.config import DistributionConfig  # pylint: disable=g-import-not-at-top
  count = lambda mode, **options: executor.Executor._model_weights(  # pylint: disable=protected-access
      None, 'components.testing.id_recording_module',
      DistributionConfig.from_dict(options), mode, {'id_log': None})
  assert count('managed') == 49  # intra_op_threads='auto' by default.
  assert count('managed', intra_op_threads=1, precision='auto') == 49
  assert count('managed', intra_op_threads=1) is None
  assert count('managed', launcher='in_process') is None
  assert count('run_fn') is None


def test_workers_that_disagree_train_in_float32():
  hardware = lambda: precision.Hardware(cpu_flags=frozenset({'amx_bf16'}))
  assert precision.decide('auto', hardware, True,
                          lambda flag: flag).policy == 'mixed_bfloat16'
  # Every worker votes on each half precision: here one voted otherwise.
  choice = precision.decide('auto', hardware, True, lambda flag: False)
  assert (choice.policy, choice.source) == ('float32', 'auto')
  assert 'not on every worker' in choice.reason


_REQUESTED_FLOAT32 = precision.PrecisionChoice('float32', 'config', '')


def test_a_float16_model_under_a_strategy_without_loss_scaling_fails():
  model = _build(1)
  with pytest.raises(ValueError, match=r"(?s)float16.*parameter_server.*"
                     r"mixed_bfloat16"):
    precision.resolve(model, _REQUESTED_FLOAT32, 'mixed_float16',
                      False, 'parameter_server')


def test_layers_in_float16_under_a_plain_optimizer_get_loss_scaling():
  """A module that sets float16 per layer and compiles a plain optimizer:
  the loop wraps it, as compile would under a global float16 policy."""
  inputs = tf.keras.Input((4,))
  hidden = tf.keras.layers.Dense(4, dtype='mixed_float16')(inputs)
  model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(hidden))
  model.compile('adam', 'mse')
  choice = precision.resolve(model, _REQUESTED_FLOAT32, None, True,
                             'one_device')
  assert choice.policy == 'mixed_float16' and choice.loss_scaling
  assert choice.source == 'module'
  assert isinstance(model.optimizer,
                    tf.keras.mixed_precision.LossScaleOptimizer)


# --- Exact resume with a loss-scale state (real processes, SIGKILL)

RESUME_STEPS = 24


# Step 9's forward pass overflows: the scale halves between the checkpoint
# at step 8 and the kill at step 11, before the checkpoint at 12.
OVERFLOW_STEP = 9


def _float16_task(root, data):
  task = tt.make_task(root, data, train_steps=RESUME_STEPS,
                      per_replica_batch_size=2,
                      fault_tolerance={'save_every_steps': 4},
                      hparams={'step_sleep_seconds': 0.05,
                               'overflow_at_steps': [OVERFLOW_STEP]})
  task.distribution['precision'] = 'mixed_float16'
  return task


@pytest.mark.slow
def test_float16_kill_and_resume_is_bit_exact(tmp_path, data):
  """Killed between the scale's change (step 9) and the next checkpoint
  (12): the resume from 8 replays the overflow. Killed again after 12: the
  resume from 12 starts at the changed scale, which the checkpoint holds."""
  baseline = _float16_task(str(tmp_path / 'baseline'), data)
  assert tt.run_child(baseline, str(tmp_path / 'baseline')) == 0, (
      tt.child_log(str(tmp_path / 'baseline')))
  expected = tt.final_tensors(baseline)
  # Halved once, at the overflow; the good steps counted from the step after.
  assert expected[LOSS_SCALE] == 2**14
  assert expected[GOOD_STEPS] == RESUME_STEPS - OVERFLOW_STEP - 1

  root = str(tmp_path / 'killed')
  task = _float16_task(root, data)
  for step in (11, 14):
    _, code = tt.kill_at_step(task, root, step, signal.SIGKILL)
    assert code == -signal.SIGKILL
  assert tt.run_child(task, root) == 0, tt.child_log(root)
  result = tt.read_result(task)
  assert [(e['event'], e['from_step']) for e in result.resume_events] == [
      ('resumed', 8), ('resumed', 12)]
  tensors = tt.final_tensors(task)
  assert sorted(tensors) == sorted(expected)
  for name, value in expected.items():
    np.testing.assert_array_equal(tensors[name], value, err_msg=name)
  assert result.loop.precision['loss_scaling']
  assert json.dumps(result.loop.precision)


@pytest.mark.slow
def test_parameter_servers_train_bfloat16_and_decline_the_modules_xla(
    tmp_path, data):
  """bfloat16 needs no loss scaling, so parameter servers train in it; the
  module's jit_compile=True is declined with the reason (XLA cannot read
  the ps tasks' variables) instead of failing the training."""
  root = str(tmp_path)
  task = tt.make_task(root, data, strategy='parameter_server', num_workers=2,
                      num_ps=1, train_steps=20, per_replica_batch_size=4,
                      hparams={'id_log': None, 'jit_compile': True},
                      fault_tolerance={'save_every_steps': 10})
  task.distribution['precision'] = 'mixed_bfloat16'
  launch = tt.run_cluster(task, root, strategy='parameter_server',
                          num_workers=2, num_ps=1, production=True)
  assert launch.attempts == 1
  result = tt.read_result(task)
  assert result.steps == 20 and result.loop.exported
  assert result.loop.precision['policy'] == 'mixed_bfloat16'
  assert result.loop.xla['source'] == 'module'
  assert not result.loop.xla['enabled']
  assert 'parameter_server' in result.loop.xla['reason']
