"""The TF cluster a strategy needs: its tasks, their roles and TF_CONFIGs.

One description for every backend that starts the cluster (local processes,
Ray actors): `cluster_shape` counts the tasks of each TF task type,
`task_names` names them, and `cluster_processes` gives each its process
(role, argv, TF_CONFIG) once the backend knows where each task listens.
Pure Python: no TFX, TensorFlow or Ray import.
"""

import dataclasses
import json
from typing import Callable, Dict, List, Optional

import portpicker

from components.trainer.strategies import registry

# What a process runs: `trainer` runs the training loop (a worker of
# MultiWorkerMirrored, the parameter-server coordinator, a single-worker
# strategy's one process); `server` runs a tf.distribute.Server that joins.
ROLES = ('trainer', 'server')
# The file a process reads its TrainingTask from (`--task`): each backend
# writes one where its processes run, and the executor keeps one in the
# ModelRun. Here, not beside TrainingTask: every backend imports this module,
# and the process package imports the cluster package, not the reverse.
TASK_FILE_NAME = 'training_task.json'


@dataclasses.dataclass
class ProcessSpec:
  """One process of a cluster."""
  name: str
  argv: List[str]
  # Extra environment; a None value removes the variable.
  env: Dict[str, Optional[str]] = dataclasses.field(default_factory=dict)
  # Servers (ps / PS workers) run until killed: the cluster is done when every
  # non-server process has exited 0, and a server exiting early is a failure.
  server: bool = False


def cluster_shape(strategy: str, num_workers: int,
                  num_ps: int) -> Dict[str, int]:
  """TF task type -> task count of `strategy`'s cluster ({}: no cluster)."""
  return registry.get(strategy).cluster_shape(num_workers, num_ps)


def process_name(task_type: str, index: int) -> str:
  """The name cluster_processes gives a task's process."""
  return 'chief' if task_type == 'chief' else f'{task_type}-{index}'


def task_names(shape: Dict[str, int]) -> List[str]:
  """The process names of a cluster of `shape`; `trainer` for no cluster."""
  return [process_name(task, i) for task, count in shape.items()
          for i in range(count)] or ['trainer']


def cluster_processes(strategy: str, num_workers: int, num_ps: int,
                      argv_for_role: Callable[[str], List[str]],
                      host: str = 'localhost',
                      addresses: Optional[Dict[str, List[str]]] = None
                     ) -> List[ProcessSpec]:
  """The processes (and TF_CONFIGs) of a cluster for `strategy`.

  Args:
    strategy: A registered strategy's name.
    num_workers: Worker processes for the multi-worker strategies.
    num_ps: Parameter servers for `parameter_server`.
    argv_for_role: Command line of a process of each of ROLES.
    host: Address the servers listen on (free ports picked here).
    addresses: Instead, each task type's `host:port`s, as cluster_shape
      counts them (the Ray backend's, found on the tasks' nodes).
  """
  shape = cluster_shape(strategy, num_workers, num_ps)
  if addresses is None:
    addresses = {task: _addresses(host, count)
                 for task, count in shape.items()}
  kind = registry.get(strategy).cluster
  if kind == registry.WORKERS:
    cluster = {'worker': addresses['worker']}
    return [
        ProcessSpec(f'worker-{i}', argv_for_role('trainer'),
                    {'TF_CONFIG': _tf_config(cluster, 'worker', i)})
        for i in range(num_workers)
    ]
  if kind == registry.PARAMETER_SERVERS:
    cluster = {task: addresses[task] for task in ('chief', 'worker', 'ps')}
    # Recommended for ParameterServerStrategy: a failed RPC to a worker is
    # reported to the coordinator instead of being retried forever.
    grpc = {'GRPC_FAIL_FAST': 'use_caller'}
    servers = [
        ProcessSpec(process_name(task, i), argv_for_role('server'),
                    {'TF_CONFIG': _tf_config(cluster, task, i), **grpc},
                    server=True)
        for task in ('ps', 'worker') for i in range(len(cluster[task]))
    ]
    return servers + [
        ProcessSpec('chief', argv_for_role('trainer'),
                    {'TF_CONFIG': _tf_config(cluster, 'chief', 0), **grpc})
    ]
  # Single-worker strategies: one fresh process that must not inherit a
  # cluster from the environment.
  return [ProcessSpec('trainer', argv_for_role('trainer'), {'TF_CONFIG': None})]


def _addresses(host: str, count: int) -> List[str]:
  return [f'{host}:{portpicker.pick_unused_port()}' for _ in range(count)]


def _tf_config(cluster: Dict[str, List[str]], task_type: str,
               index: int) -> str:
  return json.dumps({'cluster': cluster,
                     'task': {'type': task_type, 'index': index}})
