"""Gradient accumulation: k micro-steps then one update == one k-times batch.

Both runs read the same examples per update (the dataset is batched by the
examples of a whole update), so any difference comes from the accumulation
arithmetic: the mean of the losses over the big batch, split into k parts.
"""

import numpy as np
import pytest
import tensorflow as tf

from components.trainer.managed import training
from components.testing import trainer_testing as tt

TRAIN_STEPS = 6
# Float32 sums in a different order: equal up to rounding.
RTOL, ATOL = 2e-5, 1e-6
ITERATIONS = 'optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE'
STEP = 'step/.ATTRIBUTES/VARIABLE_VALUE'
LOSS_SCALE = ('optimizer/loss_scale/current_loss_scale/.ATTRIBUTES/'
              'VARIABLE_VALUE')


def _train(root, data, **kwargs):
  task = tt.make_task(root, data, train_steps=TRAIN_STEPS, **kwargs)
  result = training.run_managed_training(
      task, tf.distribute.OneDeviceStrategy('/cpu:0'))
  return result, tt.latest_checkpoint_tensors(task.checkpoint_dir)


def _assert_close(actual, expected, rtol=RTOL, atol=ATOL):
  assert sorted(actual) == sorted(expected)
  for name, value in expected.items():
    np.testing.assert_allclose(actual[name], value, rtol=rtol, atol=atol,
                               err_msg=name)


def test_accumulation_equals_the_larger_batch(tmp_path, data):
  big, big_weights = _train(str(tmp_path / 'big'), data,
                            per_replica_batch_size=8)
  accumulated, accumulated_weights = _train(
      str(tmp_path / 'accumulated'), data, per_replica_batch_size=2,
      accumulation=4)
  assert accumulated.examples_per_step == big.examples_per_step == 8
  assert accumulated.steps == big.steps == TRAIN_STEPS
  # One optimizer update per 4 micro-steps: Adam saw 6 iterations.
  assert accumulated_weights[ITERATIONS] == TRAIN_STEPS
  assert accumulated_weights[STEP] == TRAIN_STEPS
  _assert_close(accumulated_weights, big_weights)
  np.testing.assert_allclose(accumulated.train_loss, big.train_loss,
                             rtol=RTOL)


def test_small_batch_without_accumulation_differs(tmp_path, data):
  """The comparison above can fail: 2-example updates train differently."""
  _, big_weights = _train(str(tmp_path / 'big'), data,
                          per_replica_batch_size=8)
  _, small_weights = _train(str(tmp_path / 'small'), data,
                            per_replica_batch_size=2)
  kernel = 'model/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE'
  assert not np.allclose(small_weights[kernel], big_weights[kernel],
                         rtol=RTOL, atol=ATOL)


# float16: the same sums in half precision, rounded differently per split.
TOLERANCES = {'float32': (RTOL, ATOL), 'mixed_float16': (2e-2, 2e-3)}


@pytest.mark.slow
@pytest.mark.parametrize('precision', sorted(TOLERANCES))
def test_mirrored_accumulation_equals_one_device_large_batch(tmp_path, data,
                                                             precision):
  """2 replicas x 2 examples x 2 micro-steps == 1 replica x 8 examples,
  in float32 and in float16 with loss scaling. In float16 update 3
  overflows on replica 1 only (on the one device, its whole batch): every
  replica skips it alike and the scale halves once, as on one device.

  With the same data partitions (the two replicas' count) the examples of an
  update do not depend on how they are batched, so both runs train on the
  same 8 per update.
  """
  one = tt.make_task(str(tmp_path / 'one'), data, train_steps=TRAIN_STEPS,
                     per_replica_batch_size=8)
  two = tt.make_task(str(tmp_path / 'two'), data, strategy='mirrored',
                     train_steps=TRAIN_STEPS, per_replica_batch_size=2,
                     accumulation=2, logical_cpu_devices=2)
  for task in (one, two):
    task.distribution.update(data_partitions=2, precision=precision)
  if precision == 'mixed_float16':
    one.hparams['overflow_at_steps'] = two.hparams['overflow_at_steps'] = [3]
    two.hparams['overflow_replica'] = 1
  for task in (one, two):
    root = task.model_run_dir.rsplit('/', 1)[0]
    assert tt.run_child(task, root) == 0, tt.child_log(root)
  ids_one = tt.ids_by_step(tt.read_id_log(one.hparams['id_log']))
  ids_two = tt.ids_by_step(tt.read_id_log(two.hparams['id_log']))
  for step in range(TRAIN_STEPS):
    assert sorted(ids_one[(step, 0)]) == sorted(ids_two[(step, 0)] +
                                                ids_two[(step, 1)])
  two_tensors = tt.latest_checkpoint_tensors(two.checkpoint_dir)
  _assert_close(two_tensors, tt.latest_checkpoint_tensors(one.checkpoint_dir),
                *TOLERANCES[precision])
  if precision == 'mixed_float16':
    assert two_tensors[LOSS_SCALE] == 2**14
  assert tt.read_result(two).loop.precision['policy'] == precision
