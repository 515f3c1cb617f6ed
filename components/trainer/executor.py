"""HighPerfTrainer executor: choose a strategy, start the cluster, record.

The executor resolves everything a training process needs into a
`TrainingTask` (files, dirs, configs, the stable checkpoint dir), decides the
strategy (`auto` rules, recorded with the reason on `model_run`), and trains
through its launcher's backend (`launchers`): in supervised child processes
on this machine (`local`), in Ray actors across a Ray cluster's nodes (`ray`)
or in its own process (`in_process`, and `auto` where an output lives in
this process only, recorded with the reason on `model_run`). It then checks
the exported model and records the training result on `model_run`.
"""

import hashlib
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from absl import logging
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
from components.trainer.checkpoint.config import SupervisionConfig
from components.trainer.checkpoint import location
from components.trainer.cluster import tf_cluster
from components.trainer import config as config_lib
from components.trainer.common import progress
from components.trainer import model_run as model_run_lib
from components.trainer.common.task import TrainingTask
from components.trainer.launchers import backends
from components.trainer.launchers import registry as launcher_registry
from components.trainer import resolve
from components.trainer import spec_keys
from components.trainer.strategies import choice as strategy_lib
from components.trainer import user_module

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

    self._do(input_dict, output_dict, exec_properties, config,
             fault_tolerance, model_run)

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
      backend = backends.for_config(config)
      try:
        config = self._resolve_strategy(config, input_dict, model_run,
                                        launcher_reason)
        task = self._make_task(input_dict, output_dict, props, config,
                               fault_tolerance, module_identity, mode,
                               stock_args)
        storage.check_writable(task.checkpoint_dir, 'checkpoint directory')
        task.save(os.path.join(task.model_run_dir,
                               tf_cluster.TASK_FILE_NAME))
        launch, result = self._launch(backend, task, config,
                                      fault_tolerance.supervision(), began)
      finally:
        backend.close()
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

  @staticmethod
  def _launch(backend: backends.Backend, task: TrainingTask,
              config: config_lib.DistributionConfig,
              supervision: SupervisionConfig, began: float
             ) -> Tuple[Dict[str, Any], training_result.TrainingResult]:
    """Trains; (the launch record, the result the chief wrote)."""
    prepared = time.monotonic()
    launch = backend.run(task, config, supervision)
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
                      launch: Dict[str, Any],
                      result: training_result.TrainingResult) -> None:
    """Checks the exported model; records the result on model_run."""
    if not fileio.exists(task.serving_model_dir):
      raise RuntimeError(f'Training finished but wrote no model to '
                         f'{task.serving_model_dir}.')
    model_run_lib.record_result(model_run, result, launch)
    rate = training_result.steady_rate(result, task.model_run_dir)
    if rate:  # Else the pipeline's newest rate stays the last training's.
      training_result.publish_steady_rate(
          self._pipeline_root(task.model_run_dir), rate)
    placement = launch.get('placement')
    if placement:
      model_run_lib.record_placement(model_run, placement)
    logging.info('HighPerfTrainer done: model %s, result %s',
                 task.serving_model_dir, result.to_dict())

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
                    launcher_registry.starts_processes(config.launcher))
    if mode != 'managed' or not (threads_auto or
                                 config.precision == config_lib.AUTO):
      return None
    module = user_module.load(module_file, module_path)
    return user_module.count_weights(module, hparams)

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
