"""HighPerfTrainer executor: choose a strategy, start the cluster, record.

The executor resolves everything a training process needs into a
`TrainingTask` (files, dirs, configs, the stable checkpoint dir), decides the
strategy (`auto` rules, recorded with the reason on `model_run`), and trains:
in supervised child processes on this machine (launcher `local`), in Ray
actors across a Ray cluster's nodes (launcher `ray`, `cluster.ray_backend`) or
in its own process (launcher `in_process`, and `auto` where an output lives in
this process only, recorded with the reason on `model_run`). It then checks
the exported model and records the training result on `model_run`.
"""

import hashlib
import os
import shutil
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from absl import logging
import tensorflow as tf
from tfx import types
from tfx.components.util import udf_utils
from tfx.dsl.components.base import base_executor
from tfx.dsl.io import fileio
from tfx.types import artifact_utils
from tfx.types import standard_component_specs
from tfx.utils import io_utils

from components import patches
from components import pipeline_layout
from components.records import training_result
from components.records import tuned_input_pipeline
from components import storage
from components.trainer.checkpoint.config import FaultToleranceConfig
from components.trainer.checkpoint import location
from components.trainer.checkpoint import records
from components.trainer.cluster import local_backend
from components.trainer.cluster import supervisor
from components.trainer.cluster import tf_cluster
from components.trainer import config as config_lib
from components.trainer.common import progress
from components.trainer import model_run as model_run_lib
from components.trainer.process import entry
from components.trainer.common.task import TrainingTask
from components.trainer import resolve
from components.trainer import spec_keys
from components.trainer.strategies import choice as strategy_lib
from components.trainer import user_module

CLUSTER_LOG_DIR = 'cluster_logs'
# This node's pipeline name and id where the executor's context has none:
# TFX's Kubeflow V2 entrypoint gives executors no pipeline or node, so
# kubeflow.runner sets these in the compiled task's container env.
PIPELINE_NAME_ENV = 'TFX_HPM_PIPELINE_NAME'
NODE_ID_ENV = 'TFX_HPM_NODE_ID'


def _module_identity(exec_properties: Dict[str, Any]) -> Dict[str, Any]:
  """The user module's name and, for a file, its content hash."""
  identity = {key: exec_properties.get(key) for key in (
      standard_component_specs.MODULE_FILE_KEY,
      standard_component_specs.MODULE_PATH_KEY,
      standard_component_specs.RUN_FN_KEY)}
  module_file = identity[standard_component_specs.MODULE_FILE_KEY]
  if module_file:
    with fileio.open(module_file, 'rb') as f:
      identity['sha256'] = hashlib.sha256(f.read()).hexdigest()
  return identity


def _hparams(fn_args) -> Dict[str, Any]:
  """custom_config['hparams'], overridden by a Tuner's best values."""
  hparams = dict((fn_args.custom_config or {}).get('hparams') or {})
  tuned = fn_args.hyperparameters or {}
  hparams.update(tuned.get('values', tuned))
  return hparams


def check_module_contract(module_file: Optional[str],
                          module_path: Optional[str], run_fn: Optional[str],
                          mode: str) -> str:
  """Returns the training mode; raises if the module lacks its entry point.

  The executor calls it first, before any training (construction runs no
  user code), where a packaged module is importable by name.
  """
  if module_file and not fileio.exists(module_file):
    raise ValueError(f'module_file {module_file!r} does not exist (a module '
                     "installed in the image is named without '.py' or '/', "
                     "e.g. 'pipelines.taxi_module').")
  try:
    module = user_module.load(module_file, module_path, run_fn)
  except ModuleNotFoundError as e:
    name = module_path or run_fn.rpartition('.')[0]
    raise ValueError(f'{name!r} (module_path or run_fn) is not an importable '
                     f'module: {e}') from e
  run_fn_name = run_fn.rpartition('.')[2] if run_fn else 'run_fn'
  return resolve.resolve_mode(
      mode,
      has_build_model=callable(getattr(module, 'build_model', None)),
      has_run_fn=callable(getattr(module, run_fn_name, None)),
      run_fn_given=bool(run_fn),
      module=user_module.describe_module(module_file, module_path, run_fn))


def _check_elastic_mode(config: config_lib.DistributionConfig,
                        mode: str) -> None:
  """An elastic cluster needs managed mode."""
  if config.elastic and mode != 'managed':
    raise ValueError(
        f'min_workers={config.min_workers} < num_workers='
        f'{config.num_workers} needs managed mode: a run_fn reads and '
        'steps on its own, so its update batch and data order cannot be '
        'kept with fewer workers; allowed in run_fn mode: min_workers='
        f'{config.num_workers}.')


def _upload_cluster_logs(local_logs: str, logs: str) -> None:
  """Copies the processes' logs to model_run, warning where it cannot."""
  try:
    storage.upload_tree(local_logs, logs)
  except (OSError, tf.errors.OpError) as upload_error:
    # E.g. the location is full: the training's own error stays the one
    # raised.
    logging.warning('Could not upload the cluster logs to %s: %s', logs,
                    upload_error)


class Executor(base_executor.BaseExecutor):
  """Trains with the configured (or automatically chosen) strategy."""

  def Do(self, input_dict: Dict[str, List[types.Artifact]],
         output_dict: Dict[str, List[types.Artifact]],
         exec_properties: Dict[str, Any]) -> None:
    self._log_startup(input_dict, output_dict, exec_properties)
    # Absent when the executor runs with the stock Trainer's properties: a
    # drop-in then trains with the defaults.
    config = config_lib.DistributionConfig.from_json(
        exec_properties.get(spec_keys.DISTRIBUTION_KEY))
    fault_tolerance = FaultToleranceConfig.from_json(
        exec_properties.get(spec_keys.FAULT_TOLERANCE_KEY))
    model_run = artifact_utils.get_single_instance(
        output_dict[standard_component_specs.MODEL_RUN_KEY])
    # Before anything costly: an unwritable pipeline root (or checkpoint
    # root, below) fails now, naming the path and the storage's error.
    storage.check_writable(model_run.uri, 'model_run output')

    try:
      self._do(input_dict, output_dict, exec_properties, config,
               fault_tolerance, model_run)
    finally:
      # The Ray connection (made when the environment is detected) ends
      # with the component.
      if config.launcher == 'ray':
        from components.trainer.cluster import ray_backend  # pylint: disable=g-import-not-at-top
        ray_backend.disconnect()

  def _do(self, input_dict, output_dict, exec_properties, config,
          fault_tolerance, model_run) -> None:
    began = time.monotonic()
    module_name, wheels = udf_utils.decode_user_module_key(
        exec_properties.get(standard_component_specs.MODULE_PATH_KEY))
    # pip installs from local files only; the wheel may be on gs:// (as stock
    # TFX's import_utils does).
    wheels = [io_utils.ensure_local(wheel) for wheel in wheels]
    # A module packaged as a wheel (the default under LocalDagRunner) is
    # installed once (unzipped when pure); sys.path and PYTHONPATH reach it
    # for every process.
    with patches.installed(patches.UNZIPPED_WHEEL_INSTALLS), \
        udf_utils.TempPipInstallContext(wheels):
      props = dict(exec_properties)
      if module_name:
        props[standard_component_specs.MODULE_PATH_KEY] = module_name
      # First the module's contract and what depends on it (construction
      # runs no user code): a bad module fails before any cluster starts.
      mode = check_module_contract(
          props.get(standard_component_specs.MODULE_FILE_KEY),
          props.get(standard_component_specs.MODULE_PATH_KEY),
          props.get(standard_component_specs.RUN_FN_KEY), config.mode)
      # From the unchanged properties: the wheel path carries the content
      # hash.
      module_identity = _module_identity(exec_properties)
      stock_args = patches.stock_fn_args(input_dict, output_dict, props)
      resolve.check_train_length(mode, stock_args.train_steps or 0,
                                    config.train_epochs)
      _check_elastic_mode(config, mode)
      config, launcher_reason = self._resolve_launcher(
          config, fault_tolerance, stock_args)
      config = self._resolve_strategy(config, input_dict, model_run,
                                      launcher_reason)
      task = self._make_task(input_dict, output_dict, props, config,
                             fault_tolerance, module_identity, mode,
                             stock_args)
      storage.check_writable(task.checkpoint_dir, 'checkpoint directory')
      task.save(os.path.join(task.model_run_dir, tf_cluster.TASK_FILE_NAME))
      launch, result = self._launch(task, config, fault_tolerance, began)
    self._record_outputs(model_run, task, launch, result)

  def _resolve_launcher(self, config: config_lib.DistributionConfig,
                        fault_tolerance: FaultToleranceConfig, stock_args
                       ) -> Tuple[config_lib.DistributionConfig, str]:
    """(config with its launcher, why): `auto` trains in this process where
    an output lives in this process only."""
    config, launcher_reason = resolve.resolve_launcher(config, {
        role: path for role, path in (
            ('model', stock_args.serving_model_dir),
            ('model_run', stock_args.model_run_dir),
            ('checkpoints', self._checkpoint_root(
                fault_tolerance, stock_args.model_run_dir)))
        if storage.is_process_local(path)})
    progress.LOGGER.info('HighPerfTrainer launcher: %s (%s)',
                         config.launcher, launcher_reason)
    return config, launcher_reason

  @staticmethod
  def _resolve_strategy(config: config_lib.DistributionConfig, input_dict,
                        model_run: types.Artifact,
                        launcher_reason: str) -> config_lib.DistributionConfig:
    """The config with its strategy, the decision recorded on model_run."""
    # Launcher 'ray' connects here: an unreachable cluster fails now.
    env = strategy_lib.detect_environment(
        config, has_partition_plan=bool(
            input_dict.get(spec_keys.PARTITION_PLAN_KEY)))
    config, reason = strategy_lib.resolve(config, env)
    progress.LOGGER.info('HighPerfTrainer strategy: %s (%s)',
                         config.strategy, reason)
    model_run_lib.record_decision(model_run, config, reason, env,
                                  launcher_reason)
    return config

  def _launch(self, task: TrainingTask,
              config: config_lib.DistributionConfig,
              fault_tolerance: FaultToleranceConfig, began: float
             ) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Trains; (the launch record, the result the chief wrote)."""
    prepared = time.monotonic()
    launch = self._train(task, config, fault_tolerance)
    # The component's fixed cost around the training processes.
    launch['timing'] = {
        'executor_before_launch_s': round(prepared - began, 3),
        'executor_launch_s': round(time.monotonic() - prepared, 3)}
    training_result.write_launch(task.model_run_dir, launch)
    result = training_result.read(task.model_run_dir)
    if result is None:
      raise RuntimeError(
          'Training finished but wrote no result to '
          f'{training_result.path(task.model_run_dir)}.')
    return launch, result

  def _record_outputs(self, model_run: types.Artifact, task: TrainingTask,
                      launch: Dict[str, Any], result: Dict[str, Any]) -> None:
    """Checks the exported model; records the result on model_run."""
    if not fileio.exists(task.serving_model_dir):
      raise RuntimeError(f'Training finished but wrote no model to '
                         f'{task.serving_model_dir}.')
    model_run_lib.record_result(model_run, result, launch)
    training_result.publish_steady_rate(
        self._pipeline_root(task.model_run_dir), result, task.model_run_dir)
    placement = launch.get('placement')
    if placement:
      model_run_lib.record_placement(model_run, placement)
    logging.info('HighPerfTrainer done: model %s, result %s',
                 task.serving_model_dir, result)

  def _make_task(self, input_dict, output_dict, props, config,
                 fault_tolerance, module_identity, mode,
                 stock_args) -> TrainingTask:
    run_fn_module = (props.get(standard_component_specs.RUN_FN_KEY) or
                     '').rpartition('.')[0]
    tuned = input_dict.get(spec_keys.TUNED_INPUT_PIPELINE_KEY)
    input_pipeline = (tuned_input_pipeline.read(
        artifact_utils.get_single_uri(tuned)).to_dict() if tuned else None)
    partition_plan = input_dict.get(spec_keys.PARTITION_PLAN_KEY)
    hparams = _hparams(stock_args)
    fingerprint = location.training_fingerprint(
        {key: [a.uri for a in artifacts]
         for key, artifacts in sorted(input_dict.items())},
        {'module': module_identity, 'mode': mode, 'hparams': hparams,
         'train_steps': stock_args.train_steps,
         'custom_config': stock_args.custom_config,
         'distribution': config_lib.trajectory(config),
         'input_pipeline': input_pipeline})
    module_file = props.get(standard_component_specs.MODULE_FILE_KEY)
    module_path = (props.get(standard_component_specs.MODULE_PATH_KEY) or
                   run_fn_module or None)
    return TrainingTask(
        module_file=module_file,
        module_path=module_path,
        mode=mode,
        train_files=stock_args.train_files,
        eval_files=stock_args.eval_files,
        transform_output=stock_args.transform_output,
        schema_path=stock_args.schema_path,
        serving_model_dir=stock_args.serving_model_dir,
        model_run_dir=stock_args.model_run_dir,
        train_steps=stock_args.train_steps or 0,
        eval_steps=stock_args.eval_steps or 0,
        hparams=hparams,
        custom_config=stock_args.custom_config or {},
        distribution=config.to_dict(),
        fault_tolerance=fault_tolerance.to_dict(),
        checkpoint_dir=location.stable_checkpoint_dir(
            self._checkpoint_root(fault_tolerance, stock_args.model_run_dir),
            self._pipeline_name(), self._node_id(), fingerprint),
        input_pipeline=input_pipeline,
        partition_plan_uri=(artifact_utils.get_single_uri(partition_plan)
                            if partition_plan else None),
        base_model=stock_args.base_model or None,
        model_weights=self._model_weights(module_file, module_path, config,
                                          mode, hparams),
        executor_io={
            'input_dict': artifact_utils.jsonify_artifact_dict(input_dict),
            'output_dict': artifact_utils.jsonify_artifact_dict(output_dict),
            'exec_properties': props,
        })

  @staticmethod
  def _model_weights(module_file: Optional[str], module_path: Optional[str],
                     config, mode: str, hparams) -> Optional[int]:
    """The module model's weights, where an `auto` option reads them in the
    training process before it builds the model: the op pool of a fresh
    process (`in_process` leaves the executor's alone), `precision`."""
    threads_auto = (config.intra_op_threads == config_lib.AUTO and
                    config.launcher != 'in_process')
    if mode != 'managed' or not (threads_auto or
                                 config.precision == config_lib.AUTO):
      return None
    module = user_module.load(module_file, module_path)
    return user_module.count_weights(module, hparams)

  def _train(self, task: TrainingTask,
             config: config_lib.DistributionConfig,
             fault_tolerance: FaultToleranceConfig
            ) -> Dict[str, Any]:
    """Trains; returns the launch record (the chief wrote the result)."""
    if config.launcher == 'in_process':
      entry.run_in_process(task, config)
      return {'launcher': 'in_process'}
    unshared = {k: v for k, v in task.output_dirs().items()
                if storage.is_process_local(v)}
    if unshared:
      raise ValueError(
          f'launcher={config.launcher!r} trains in child processes, which '
          f'cannot see {unshared}: that filesystem lives in one process. Use '
          "launcher='in_process', or storage that processes share.")
    # Processes read their task and write their logs locally (a log being
    # written cannot live on an object store); the logs are uploaded to
    # model_run when the cluster stops, also when it failed.
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
      if config.launcher == 'ray':
        launch = self._run_on_ray(task, config, fault_tolerance, local_logs,
                                  read_progress)
      else:
        launch = self._run_locally(task_path, config, fault_tolerance,
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
    return {'launcher': config.launcher,
            **launch.relocated(local_logs, logs).to_dict()}

  @staticmethod
  def _run_locally(task_path: str, config: config_lib.DistributionConfig,
                   fault_tolerance: FaultToleranceConfig, local_logs: str,
                   read_progress: Callable[[], Optional[Dict[str, Any]]]
                  ) -> supervisor.LaunchResult:
    """The cluster as child processes of this one, supervised."""

    def argv_for_role(role):
      return [sys.executable, '-m', 'components.trainer.process.entry',
              '--task', task_path, '--role', role]

    return local_backend.run_supervised(
        lambda attempt: tf_cluster.cluster_processes(
            config.strategy, config.num_workers, config.num_ps,
            argv_for_role),
        local_logs,
        timeout_s=fault_tolerance.timeout_s,
        max_restarts=fault_tolerance.max_restarts,
        hang_timeout_s=fault_tolerance.hang_timeout_s,
        read_progress=read_progress)

  @staticmethod
  def _run_on_ray(task: TrainingTask, config: config_lib.DistributionConfig,
                  fault_tolerance: FaultToleranceConfig, local_logs: str,
                  read_progress: Callable[[], Optional[Dict[str, Any]]]
                 ) -> supervisor.LaunchResult:
    """The cluster as Ray actors; each task gets the task file on its node."""
    from components.trainer.cluster import ray_backend  # pylint: disable=g-import-not-at-top

    def argv_for_role(role):
      return [ray_backend.PYTHON, '-m', 'components.trainer.process.entry',
              '--task', ray_backend.TASK_FILE, '--role', role]

    return ray_backend.run_on_ray(
        config.strategy, config.num_workers, config.num_ps, argv_for_role,
        task.to_json(), local_logs,
        placement_strategy=config.ray.placement,
        resources=config.ray.task_resources(),
        local_paths=task.local_output_dirs(),
        min_workers=config.min_workers,
        timeout_s=fault_tolerance.timeout_s,
        max_restarts=fault_tolerance.max_restarts,
        hang_timeout_s=fault_tolerance.hang_timeout_s,
        rescale_check_s=fault_tolerance.rescale_check_s,
        read_progress=read_progress)

  def _pipeline_name(self) -> str:
    info = self._context and self._context.pipeline_info
    if info and info.id:
      return info.id
    return os.environ.get(PIPELINE_NAME_ENV) or 'pipeline'

  def _node_id(self) -> str:
    node = self._context and self._context.pipeline_node
    if node and node.node_info.id:
      return node.node_info.id
    return os.environ.get(NODE_ID_ENV) or 'Trainer'

  def _checkpoint_root(self, fault_tolerance: FaultToleranceConfig,
                       model_run_dir: str) -> str:
    return location.checkpoint_root(fault_tolerance.backup_root,
                                    self._pipeline_root(model_run_dir))

  def _pipeline_root(self, model_run_dir: str) -> str:
    """Found from `model_run_dir`, the model_run artifact's URI, where TFX
    gives no executor output URI."""
    return pipeline_layout.pipeline_root(
        self._context and self._context.executor_output_uri, model_run_dir)
