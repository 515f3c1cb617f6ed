"""The test task's two-worker cluster on Ray, launched as the executor does.

`run_on_ray(task, root)` from a process connected to the cluster (pytest);
`python -m tests.support.ray_training ADDRESS TASK ROOT RESULT` from a driver
process of its own, which connects to ADDRESS first: on the driver's test
host, on no Ray node, with ray:// as a Kubeflow pod's executor does
(kubeflow.runner --ray-address). RESULT gets the launch's attempts and
placement, and the address this process reached the cluster from.
"""

import json
import os
import socket
import sys
from typing import Optional
import urllib.parse

from components.trainer.checkpoint import records as run_records
from components.trainer.checkpoint.config import SupervisionConfig
from components.trainer.cluster import ray_backend
from components.trainer.common.task import TrainingTask

CLUSTER_TIMEOUT_S = 400


def run_on_ray(task: TrainingTask, root: str, cpus: int = 1,
               min_workers: Optional[int] = None, hang_timeout_s: float = 0,
               rescale_check_s: float = 0):
  """The task's cluster on Ray; its logs under the local folder `root`;
  the chief's progress read as the executor reads it (for hang_timeout_s)."""
  argv = [ray_backend.PYTHON, '-m', 'components.testing.trainer_testing',
          ray_backend.TASK_FILE]
  return ray_backend.run_on_ray(
      'multi_worker_mirrored', 2, 0, lambda role: argv, task.to_json(),
      os.path.join(root, 'logs'), placement_strategy='SPREAD',
      resources={'cpus': cpus, 'gpus': 0, 'memory_mb': 0},
      local_paths=task.local_output_dirs(),  # As the executor passes.
      min_workers=min_workers,
      supervision=SupervisionConfig(
          max_restarts=task.fault_tolerance['max_restarts'],
          timeout_s=CLUSTER_TIMEOUT_S, hang_timeout_s=hang_timeout_s,
          rescale_check_s=rescale_check_s, progress_every_s=0.5),
      read_progress=lambda: run_records.read_progress(task.checkpoint_dir))


def _own_address(address: str) -> str:
  """This process's address on the route to the cluster at `address`."""
  location = urllib.parse.urlsplit(
      address if '://' in address else f'//{address}')
  with socket.create_connection((location.hostname, location.port),
                                timeout=10) as connection:
    return connection.getsockname()[0]


def main(address: str, task_path: str, root: str, result_path: str) -> int:
  ray_backend.connect(address)
  try:
    launch = run_on_ray(TrainingTask.load(task_path), root)
  finally:
    ray_backend.disconnect()
  with open(result_path, 'w') as f:
    json.dump({'attempts': launch.attempts, 'placement': launch.placement,
               'driver_address': _own_address(address)}, f)
  return 0


if __name__ == '__main__':
  sys.exit(main(*sys.argv[1:]))
