"""`distribution.seed`: runs with the same seed end with the same weights.

The model has what a seed must pin down: unseeded initializers and Dropout.
Two runs with one seed end with bit-identical weights and optimizer state
and trained on the same ids per step; another seed gives other weights and
another data order. one_device trains in this process (fast); mirrored on 2
logical CPUs and a 2-worker MultiWorkerMirrored cluster run the production
worker (`components.trainer.process.entry`, op determinism from the config
only).
"""

import random

import numpy as np
import pytest
import tensorflow as tf

from components.trainer.common import cpu_threads
from components.trainer.process import entry
from components.testing import trainer_testing as tt

RANDOM_MODEL = {'seeded_initializers': False, 'dropout': 0.5}
KERNEL = 'model/layer_with_weights-0/kernel/.ATTRIBUTES/VARIABLE_VALUE'


@pytest.fixture
def unseed_afterwards():
  """In-process runs seed this process; later tests get fresh seeds."""
  yield
  tf.random.set_seed(None)
  random.seed()
  np.random.seed()


def _task(root, data, seed, **kwargs):
  return tt.make_task(str(root), data, train_steps=8, seed=seed,
                      hparams=RANDOM_MODEL,
                      fault_tolerance={'save_every_steps': 100}, **kwargs)


def _trained(task):
  return (tt.final_tensors(task),
          tt.ids_by_step(tt.read_id_log(task.hparams['id_log'])))


def _assert_same(first, second):
  (weights, ids), (other_weights, other_ids) = first, second
  assert sorted(weights) == sorted(other_weights)
  for name, value in weights.items():
    np.testing.assert_array_equal(other_weights[name], value, err_msg=name)
  assert ids == other_ids


def _assert_different(first, second):
  (weights, ids), (other_weights, other_ids) = first, second
  assert not np.array_equal(weights[KERNEL], other_weights[KERNEL])
  assert ids != other_ids


def test_one_device_same_seed_same_weights(tmp_path, data, unseed_afterwards):
  del unseed_afterwards
  runs = {}
  for name, seed in (('a', 7), ('b', 7), ('other', 8)):
    task = _task(tmp_path / name, data, seed)
    result = entry.train(task)
    assert result.seed == seed and result.deterministic is False
    assert result.steps == 8
    runs[name] = _trained(task)
  assert KERNEL in runs['a'][0]
  _assert_same(runs['a'], runs['b'])
  _assert_different(runs['a'], runs['other'])


@pytest.mark.slow
def test_mirrored_same_seed_same_weights(tmp_path, data):
  runs = {}
  for name, seed in (('a', 7), ('b', 7), ('other', 8)):
    root = tmp_path / name
    task = _task(root, data, seed, strategy='mirrored',
                 per_replica_batch_size=2, logical_cpu_devices=2,
                 deterministic=True)
    assert tt.run_child(task, str(root), production=True) == 0, (
        tt.child_log(str(root)))
    result = tt.read_result(task)
    assert result.deterministic is True
    # A fresh CPU process: 'auto' left one core to the input pipeline.
    cores = cpu_threads.usable_cores()
    assert result.intra_op_threads['threads'] == max(1, cores - 1)
    runs[name] = _trained(task)
  _assert_same(runs['a'], runs['b'])
  _assert_different(runs['a'], runs['other'])


@pytest.mark.slow
@pytest.mark.extended
def test_multi_worker_mirrored_same_seed_same_weights(tmp_path, data,
                                                      child_env):
  del child_env
  runs = {}
  for name in ('a', 'b'):
    root = tmp_path / name
    task = _task(root, data, 7, strategy='multi_worker_mirrored',
                 num_workers=2, per_replica_batch_size=2, deterministic=True)
    assert tt.run_cluster(task, str(root), production=True).attempts == 1
    result = tt.read_result(task)
    assert result.num_replicas == 2 and result.seed == 7
    runs[name] = _trained(task)
  _assert_same(runs['a'], runs['b'])
