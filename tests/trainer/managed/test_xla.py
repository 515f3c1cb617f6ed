"""XLA in the managed loop: the module's `jit_compile` wins, `on` and `off`
train alike, `auto` measures without training and falls back where XLA
cannot compile, and a resume keeps the choice."""

import numpy as np
import pytest
import tensorflow as tf

from components.trainer.common import failures
from components.trainer.managed import training
from components.trainer.managed import xla
from components.testing import trainer_testing as tt

STEPS = 6


def _run(root, data, train_steps=STEPS, id_log=False, **distribution):
  hparams = distribution.pop('hparams', {})
  task = tt.make_task(root, data, train_steps=train_steps,
                      per_replica_batch_size=8,
                      fault_tolerance={'save_every_steps': 3},
                      hparams=hparams if id_log else {'id_log': None,
                                                      **hparams})
  task.distribution.update(distribution)
  result = training.run_managed_training(
      task, tf.distribute.OneDeviceStrategy('/cpu:0'))
  return result, tt.latest_checkpoint_tensors(task.checkpoint_dir)


def test_on_and_off_train_alike(tmp_path, data):
  off, off_tensors = _run(str(tmp_path / 'off'), data, xla='off')
  on, on_tensors = _run(str(tmp_path / 'on'), data, xla='on')
  assert not off.xla['enabled'] and on.xla['enabled']
  assert on.xla['source'] == 'config'
  for name, value in off_tensors.items():
    np.testing.assert_allclose(on_tensors[name], value, rtol=1e-5, atol=1e-6,
                               err_msg=name)


def test_auto_measures_without_training_and_keeps_the_faster(tmp_path, data):
  auto, auto_tensors = _run(str(tmp_path / 'auto'), data, xla='auto')
  choice = auto.xla
  assert choice['source'] == 'auto'
  assert set(choice['seconds_per_step']) == {'on', 'off'}
  # Which one wins is the rule's, tested on a clock that cannot vary
  # (test_measure_keeps_the_faster_and_needs_every_worker).
  assert auto.timing['xla_probe_s'] > 0
  # The probe's steps were undone: the run equals one that never measured.
  _, fixed_tensors = _run(str(tmp_path / 'fixed'), data,
                          xla='on' if choice['enabled'] else 'off')
  assert sorted(auto_tensors) == sorted(fixed_tensors)
  for name, value in fixed_tensors.items():
    np.testing.assert_array_equal(auto_tensors[name], value, err_msg=name)
  # A resume keeps the saved choice instead of measuring again.
  resumed, _ = _run(str(tmp_path / 'auto'), data, train_steps=2 * STEPS,
                    xla='auto')
  assert resumed.resume_events[0]['from_step'] == STEPS
  assert resumed.xla == {**choice, 'source': 'checkpoint'}
  assert 'xla_probe_s' not in resumed.timing


def test_auto_falls_back_where_xla_cannot_compile(tmp_path, data):
  """The id-logging layer is a tf.py_function, which XLA cannot compile."""
  result, tensors = _run(str(tmp_path), data, id_log=True, xla='auto')
  assert not result.xla['enabled']
  assert result.xla['reason'].startswith('XLA cannot compile the step')
  assert 'PyFunc' in result.xla['reason']
  assert tensors['step/.ATTRIBUTES/VARIABLE_VALUE'] == STEPS
  # Every step trained once: the failed probe consumed none of its batches.
  ids = tt.ids_by_step(tt.read_id_log(str(tmp_path / 'ids.jsonl')))
  assert sorted(step for step, _ in ids) == list(range(STEPS))


def test_the_modules_jit_compile_wins(tmp_path, data):
  result, _ = _run(str(tmp_path / 'module_on'), data, xla='off',
                   hparams={'jit_compile': True})
  assert result.xla == {'enabled': True, 'source': 'module',
                        'reason': 'compile(jit_compile=...) in the module',
                        'seconds_per_step': None}
  result, _ = _run(str(tmp_path / 'module_off'), data, xla='auto',
                   hparams={'jit_compile': False})
  assert not result.xla['enabled'] and result.xla['source'] == 'module'


class _Clock:
  """Each setting's call takes a fixed time."""

  def __init__(self, seconds):
    self.now, self.seconds, self.jit = 0.0, seconds, None

  def __call__(self):
    return self.now

  def run(self, jit):
    self.now += self.seconds[jit]


def test_measure_keeps_the_faster_and_needs_every_worker():
  clock = _Clock({True: 0.1, False: 0.2})
  choice = xla.measure(clock.run, lambda flag: flag, clock)
  assert choice.enabled and choice.seconds_per_step == {
      'on': 0.1 / xla.PROBE_STEPS, 'off': 0.2 / xla.PROBE_STEPS}
  assert not xla.measure(clock.run, lambda flag: False, clock).enabled
  slower = _Clock({True: 0.3, False: 0.2})
  assert not xla.measure(slower.run, lambda flag: flag, slower).enabled


def test_a_compile_error_votes_no_and_falls_back():
  votes = []

  def run(jit):
    if jit:
      raise tf.errors.InvalidArgumentError(
          None, None, 'Detected unsupported operations\nmore')

  choice = xla.measure(run, lambda flag: votes.append(flag) or flag)
  assert votes == [False] and not choice.enabled
  assert choice.reason == ('XLA cannot compile the step: Detected '
                           'unsupported operations')


def test_on_where_xla_cannot_compile_fails_naming_the_fix(tmp_path, data):
  """Not retried (a relaunch would fail alike): the failure class says so."""
  with pytest.raises(failures.TrainingConfigError,
                     match=r"XLA cannot compile the training step .*"
                     r"EagerPyFunc.*distribution.xla='auto'") as raised:
    _run(str(tmp_path), data, id_log=True, xla='on')
  assert failures.classify(raised.value) == failures.BAD_CONFIG


@pytest.mark.slow
def test_multi_worker_float16_with_auto_equals_its_choice(tmp_path, data):
  """Two MultiWorkerMirrored workers in float16: both measure, vote, and
  end bit for bit where a run told the chosen setting ends (the probe's
  steps, with their all-reduces and loss-scale updates, were undone)."""
  runs = {}
  for name in ('auto', 'fixed'):
    root = str(tmp_path / name)
    task = tt.make_task(root, data, strategy='multi_worker_mirrored',
                        num_workers=2, train_steps=8,
                        per_replica_batch_size=4, hparams={'id_log': None},
                        fault_tolerance={'save_every_steps': 4})
    setting = 'auto' if name == 'auto' else (
        'on' if runs['auto'][0].xla['enabled'] else 'off')
    task.distribution.update(precision='mixed_float16', xla=setting)
    assert tt.run_cluster(task, root).attempts == 1
    runs[name] = tt.read_result(task).loop, tt.final_tensors(task)
  auto, auto_tensors = runs['auto']
  assert auto.xla['source'] == 'auto' and auto.precision['loss_scaling']
  assert set(auto.xla['seconds_per_step']) == {'on', 'off'}
  for name, value in runs['fixed'][1].items():
    np.testing.assert_array_equal(auto_tensors[name], value, err_msg=name)


class _Runner:
  """A step runner of one traced function, as the managed loop's are."""

  def __init__(self, step):
    self._step = step

  @staticmethod
  def traced_function(k):
    del k
    return 'k_steps'

  def __call__(self, current, k):
    return current + k, self._step(tf.constant(float(current)))


def _named(step):
  return xla.CompileErrorsNamed(
      _Runner(step), xla.XlaChoice(True, 'config', "distribution.xla='on'"))


def test_a_step_xla_cannot_compile_is_a_config_error():
  @tf.function(jit_compile=True)
  def step(x):
    return tf.py_function(lambda v: v, [x], tf.float32)

  with pytest.raises(failures.TrainingConfigError,
                     match=r'XLA cannot compile the training step '
                     r'\(.*unsupported operations.*EagerPyFunc'):
    _named(step)(0, 1)


def test_a_runtime_error_that_mentions_xla_is_not_a_compile_error():
  """Not by the word: a data check whose message names an 'xla_...' feature
  stays the error it is (the old rule made it a config error, never
  retried, naming the wrong fix)."""

  @tf.function
  def step(x):
    with tf.control_dependencies([tf.debugging.assert_less(
        x, 1.0, message='feature xla_score out of range')]):
      return tf.identity(x)

  runner = _named(step)
  with pytest.raises(tf.errors.InvalidArgumentError, match='xla_score'):
    runner(5, 1)
  # After a call that ran, the same function's errors are run-time ones,
  # whatever they say.
  assert runner(0, 1)[0] == 1
  with pytest.raises(tf.errors.InvalidArgumentError, match='xla_score'):
    runner(5, 1)
