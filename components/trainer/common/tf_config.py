"""A process's TF_CONFIG, and what every layer reads from it.

One rule for each fact: `from_env` reads it, `tasks_of` counts a task type,
`worker_count` the processes that train, `task_count` every task of the
cluster, `is_chief` whether this process writes the shared outputs. An
orchestrator's TF_CONFIG (launcher `in_process`) and the ones
`cluster.tf_cluster` writes are read alike. Pure Python.
"""

import json
import os
from typing import Any, Dict, Mapping, Optional


def from_env(environ: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
  """The TF_CONFIG (cluster and task) in `environ`, this process's
  environment by default; {} if unset."""
  environ = os.environ if environ is None else environ
  return json.loads(environ.get('TF_CONFIG') or '{}')


def tasks_of(tf_config: Dict[str, Any], task_type: str) -> int:
  """The tasks of `task_type` ('worker', 'chief', 'ps', ...) in the
  cluster; 0 without a cluster."""
  return len((tf_config.get('cluster') or {}).get(task_type) or [])


def worker_count(tf_config: Dict[str, Any]) -> int:
  """The processes that run training steps, each on its own input pipeline:
  the workers, and the chief unless it is a parameter-server coordinator
  (whose workers step and read for it); 1 without a cluster.

  What an elastic attempt's accumulation and the data accessor's sharding
  divide by; `task_count` is the other count, of every task.
  """
  coordinator = tasks_of(tf_config, 'ps') > 0
  chief = 0 if coordinator else tasks_of(tf_config, 'chief')
  return max(1, tasks_of(tf_config, 'worker') + chief)


def task_count(tf_config: Dict[str, Any]) -> int:
  """Every task of the cluster, ps and evaluator ones included: the
  processes that leave TensorFlow's coordination service together at exit
  (unlike `worker_count`, which counts those that train); 0 without one."""
  return sum(len(tasks or []) for tasks in
             (tf_config.get('cluster') or {}).values())


def is_chief(tf_config: Dict[str, Any]) -> bool:
  """Whether this process writes the shared outputs (model, results,
  checkpoints' records): no cluster, a `chief` task, or worker 0 of a
  cluster without a chief; never a ps or evaluator task."""
  if not tf_config.get('cluster'):
    return True
  task = tf_config.get('task') or {}
  if task.get('type') == 'chief':
    return True
  return (task.get('type') == 'worker' and task.get('index') == 0 and
          not tasks_of(tf_config, 'chief'))
