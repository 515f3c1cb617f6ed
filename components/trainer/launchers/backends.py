"""One class per launcher, each with one `run`: trains a task and returns
the launch record (the chief writes the training result).

`for_config` is the one place a launcher is chosen by its name.
"""

import os
import shutil
import sys
import tempfile
from typing import Any, Callable, Dict, List, Type

from absl import logging
import tensorflow as tf

from components import storage
from components.trainer.checkpoint.config import SupervisionConfig
from components.trainer.checkpoint import records
from components.trainer.cluster import local_backend
from components.trainer.cluster import supervisor
from components.trainer.cluster import tf_cluster
from components.trainer import config as config_lib
from components.trainer.common.task import TrainingTask
from components.trainer.launchers import registry
from components.trainer import model_run as model_run_lib
from components.trainer.process import entry

CLUSTER_LOG_DIR = 'cluster_logs'


class Backend:
  """Runs trainings the way its launcher (`spec`) does."""

  spec: registry.LauncherSpec

  def run(self, task: TrainingTask, config: config_lib.DistributionConfig,
          supervision: SupervisionConfig) -> Dict[str, Any]:
    """Trains `task` with the resolved `config`, its processes (if it starts
    any) supervised as `supervision` says; the launch record."""
    raise NotImplementedError

  def close(self) -> None:
    """Ends what the launcher holds for the component (a connection made
    when the environment was detected)."""


class InProcess(Backend):
  """In the executor's process: its TF_CONFIG is the orchestrator's."""

  spec = registry.IN_PROCESS

  def run(self, task, config, supervision):
    entry.run_in_process(task, config)
    return {'launcher': self.spec.name}


class _ChildProcesses(Backend):
  """Processes it starts and supervises: they read their task and write
  their logs locally (a log being written cannot live on an object store);
  the logs go to model_run when the cluster stops, also when it failed."""

  def run(self, task, config, supervision):
    unshared = {k: v for k, v in task.output_dirs().items()
                if storage.is_process_local(v)}
    if unshared:
      raise ValueError(
          f'launcher={self.spec.name!r} trains in child processes, which '
          f'cannot see {unshared}: that filesystem lives in one process. Use '
          f'launcher={registry.IN_PROCESS.name!r}, or storage that processes '
          'share.')
    local_dir = tempfile.mkdtemp(prefix='hpm-launch-')
    task_path = os.path.join(local_dir, tf_cluster.TASK_FILE_NAME)
    task.save(task_path)
    local_logs = os.path.join(local_dir, CLUSTER_LOG_DIR)
    logs = os.path.join(task.model_run_dir, CLUSTER_LOG_DIR)

    def read_progress():
      # The chief's progress marker: the launcher logs it every few
      # seconds, so this component's log shows training as it runs.
      return records.read_progress(task.checkpoint_dir)

    try:
      launch = self._supervise(task, config, supervision, task_path,
                               local_logs, read_progress)
    except supervisor.ClusterFailedError as e:
      # The same error, naming the uploaded logs instead of the local ones.
      error = type(e)(str(e).replace(local_logs, logs), e.failure,
                      e.relaunches)
      model_run_lib.record_failure(task.model_run_dir, error)
      raise error from e
    finally:
      _upload_cluster_logs(local_logs, logs)
      shutil.rmtree(local_dir, ignore_errors=True)
    return {'launcher': self.spec.name,
            **launch.relocated(local_logs, logs).to_dict()}

  def _supervise(self, task: TrainingTask,
                 config: config_lib.DistributionConfig,
                 supervision: SupervisionConfig, task_path: str,
                 local_logs: str, read_progress: supervisor.ReadProgress
                ) -> supervisor.LaunchResult:
    raise NotImplementedError


class Local(_ChildProcesses):
  """The cluster as child processes of this one, supervised."""

  spec = registry.LOCAL

  def _supervise(self, task, config, supervision, task_path, local_logs,
                 read_progress):
    argv_for_role = _entry_argv(sys.executable, task_path)
    return local_backend.run_supervised(
        lambda attempt: tf_cluster.cluster_processes(
            config.strategy, config.num_workers, config.num_ps,
            argv_for_role),
        local_logs, supervision, read_progress=read_progress)


class Ray(_ChildProcesses):
  """The cluster as Ray actors; each task gets the task file on its node."""

  spec = registry.RAY

  def _supervise(self, task, config, supervision, task_path, local_logs,
                 read_progress):
    from components.trainer.cluster import ray_backend  # pylint: disable=g-import-not-at-top
    return ray_backend.run_on_ray(
        config.strategy, config.num_workers, config.num_ps,
        _entry_argv(ray_backend.PYTHON, ray_backend.TASK_FILE),
        task.to_json(), local_logs,
        placement_strategy=config.ray.placement,
        resources=config.ray.task_resources(),
        local_paths=task.local_output_dirs(),
        min_workers=config.min_workers,
        supervision=supervision, read_progress=read_progress)

  def close(self) -> None:
    from components.trainer.cluster import ray_backend  # pylint: disable=g-import-not-at-top
    ray_backend.disconnect()


def _entry_argv(python: str, task_file: str) -> Callable[[str], List[str]]:
  """role -> the command line of a training process of that role."""
  return lambda role: [python, '-m', 'components.trainer.process.entry',
                       '--task', task_file, '--role', role]


_BACKENDS: Dict[str, Type[Backend]] = {
    backend.spec.name: backend for backend in (InProcess, Local, Ray)}


def for_config(config: config_lib.DistributionConfig) -> Backend:
  """The backend of the config's launcher (resolved: not `auto`)."""
  spec = registry.get(config.launcher)
  if spec.name not in _BACKENDS:
    raise NotImplementedError(f'launcher {spec.name!r} is registered but has '
                              'no backend class in launchers.backends.')
  return _BACKENDS[spec.name]()


def _upload_cluster_logs(local_logs: str, logs: str) -> None:
  """Copies the processes' logs to model_run, warning where it cannot."""
  try:
    storage.upload_tree(local_logs, logs)
  except (OSError, tf.errors.OpError) as upload_error:
    # E.g. the location is full: the training's own error stays the one
    # raised.
    logging.warning('Could not upload the cluster logs to %s: %s', logs,
                    upload_error)
