"""The facts of a TF_CONFIG: its workers, its tasks, its chief (pure)."""

import json

import pytest

from components.trainer.common import tf_config as tf_config_lib


def _tf_config(task_type='worker', index=0, **tasks):
  return {'cluster': {k: [f'host{i}:{2222 + i}' for i in range(n)]
                      for k, n in tasks.items()},
          'task': {'type': task_type, 'index': index}}


def test_from_env_reads_this_process_or_a_given_environment(monkeypatch):
  monkeypatch.delenv('TF_CONFIG', raising=False)
  assert tf_config_lib.from_env() == {}
  monkeypatch.setenv('TF_CONFIG', json.dumps(_tf_config(worker=2)))
  assert tf_config_lib.from_env() == _tf_config(worker=2)
  other = {'TF_CONFIG': json.dumps(_tf_config('chief', chief=1, worker=1))}
  assert tf_config_lib.from_env(other)['task']['type'] == 'chief'


@pytest.mark.parametrize('tf_config,workers,tasks', [
    ({}, 1, 0),
    (_tf_config(worker=3), 3, 3),
    # MultiWorkerMirrored's chief trains like a worker.
    (_tf_config(chief=1, worker=2), 3, 3),
    # A parameter-server cluster's chief is its coordinator: its workers
    # train; every task leaves the cluster together.
    (_tf_config('chief', chief=1, worker=2, ps=2), 2, 5),
    # An evaluator evaluates checkpoints beside the training.
    (_tf_config('evaluator', chief=1, worker=1, evaluator=1), 2, 3),
])
def test_workers_train_and_tasks_are_everyone(tf_config, workers, tasks):
  assert tf_config_lib.worker_count(tf_config) == workers
  assert tf_config_lib.task_count(tf_config) == tasks


@pytest.mark.parametrize('tf_config,chief', [
    ({}, True),
    (_tf_config(worker=2), True),
    (_tf_config(index=1, worker=2), False),
    (_tf_config(chief=1, worker=2), False),
    (_tf_config('chief', chief=1, worker=2), True),
    (_tf_config('chief', chief=1, worker=2, ps=1), True),
    (_tf_config('ps', chief=1, worker=2, ps=1), False),
    (_tf_config('evaluator', chief=1, worker=1, evaluator=1), False),
])
def test_the_chief_writes_the_shared_outputs(tf_config, chief):
  assert tf_config_lib.is_chief(tf_config) is chief
