"""HighPerfTrainer: a drop-in `tfx.components.Trainer` with distribution.

Same inputs, outputs and `module_file` / `run_fn` contract as the stock
Trainer, plus:
- `distribution` (DistributionConfig as a dict): strategy (or `auto`),
  launcher, local cluster size, logical CPU devices, batch sizes, gradient
  accumulation, epochs;
- `fault_tolerance` (checkpoint.config.FaultToleranceConfig as a dict);
- optional `tuned_input_pipeline` (from OptimizedTransform) and
  `partition_plan` (from GPipePartitioner) inputs.
The configs are validated here, at construction. As for the stock Trainer,
construction reads no file and runs no user code (a `gs://` module file
must not need storage access to build a pipeline): the module's contract
(managed mode needs `build_model(hparams)`, run_fn mode `run_fn`) and what
depends on it are checked by the executor before training starts.
"""

import os
import re
from typing import Any, Dict, Optional, Tuple, Union

from absl import logging
from tfx import types
from tfx.components.trainer import component as trainer_component
from tfx.components.util import udf_utils
from tfx.dsl.components.base import base_component
from tfx.dsl.components.base import executor_spec
from tfx.orchestration import data_types
from tfx.proto import trainer_pb2
from tfx.types import component_spec
from tfx.types import standard_artifacts
from tfx.types import standard_component_specs
from tfx.utils import json_utils

from components import drop_in
from components.trainer.checkpoint.config import FaultToleranceConfig
from components.trainer import config as config_lib
from components.trainer import executor
from components.trainer import resolve
from components.trainer import spec_keys
from components import types as hpm_types


DEFAULT_NODE_ID = 'Trainer'
_MODULE_NAME = re.compile(r'[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*')


class HighPerfTrainerSpec(standard_component_specs.TrainerSpec):
  """The stock TrainerSpec plus distribution, fault tolerance and inputs."""
  PARAMETERS = {
      **standard_component_specs.TrainerSpec.PARAMETERS,
      spec_keys.DISTRIBUTION_KEY:
          component_spec.ExecutionParameter(type=str),
      spec_keys.FAULT_TOLERANCE_KEY:
          component_spec.ExecutionParameter(type=str),
      drop_in.COMPONENT_CLASS_KEY:
          component_spec.ExecutionParameter(type=str, optional=True),
  }
  INPUTS = {
      **standard_component_specs.TrainerSpec.INPUTS,
      spec_keys.TUNED_INPUT_PIPELINE_KEY:
          component_spec.ChannelParameter(
              type=hpm_types.TunedInputPipeline, optional=True),
      spec_keys.PARTITION_PLAN_KEY:
          component_spec.ChannelParameter(
              type=hpm_types.PartitionPlan, optional=True),
  }
  OUTPUTS = standard_component_specs.TrainerSpec.OUTPUTS


def _module_source(
    module_file: Union[None, str, data_types.RuntimeParameter]
) -> Tuple[Union[None, str, data_types.RuntimeParameter], Optional[str]]:
  """(module_file, module_path) for the `module_file` argument.

  Besides a file path, `module_file` may name an importable module (e.g. one
  installed in a Kubeflow image); it is then passed on as the stock
  `module_path` execution property, with nothing to package. Told apart by
  the form alone (no I/O): a dotted name without `.py`, `/` or a URI scheme
  names a module. A RuntimeParameter stays a module file.
  """
  if not isinstance(module_file, str):
    return module_file, None
  looks_like_path = (module_file.endswith('.py') or '/' in module_file or
                     os.sep in module_file or '://' in module_file)
  if not looks_like_path and _MODULE_NAME.fullmatch(module_file):
    return None, module_file
  return module_file, None


class HighPerfTrainer(drop_in.StockExecutionType, base_component.BaseComponent):
  """Trains a model with a tf.distribute strategy chosen by configuration.

  Component `outputs`, as the stock Trainer: `model` (SavedModel under
  `Format-Serving`; in managed mode the Keras SavedModel, with
  `serving_default` and `transform_features` signatures) and `model_run`
  (TensorBoard logs, the strategy decision and training result as files and
  custom properties, cluster logs). Its executions are recorded in MLMD
  under the stock Trainer's type (see `components.drop_in`).
  """
  STOCK_TYPE_NAME = trainer_component.Trainer.get_class_type()

  SPEC_CLASS = HighPerfTrainerSpec
  EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

  def __init__(
      self,
      examples: Optional[types.BaseChannel] = None,
      transformed_examples: Optional[types.BaseChannel] = None,
      transform_graph: Optional[types.BaseChannel] = None,
      schema: Optional[types.BaseChannel] = None,
      base_model: Optional[types.BaseChannel] = None,
      hyperparameters: Optional[types.BaseChannel] = None,
      module_file: Optional[Union[str, data_types.RuntimeParameter]] = None,
      run_fn: Optional[Union[str, data_types.RuntimeParameter]] = None,
      train_args: Optional[Union[trainer_pb2.TrainArgs,
                                 data_types.RuntimeParameter]] = None,
      eval_args: Optional[Union[trainer_pb2.EvalArgs,
                                data_types.RuntimeParameter]] = None,
      custom_config: Optional[Union[Dict[str, Any],
                                    data_types.RuntimeParameter]] = None,
      custom_executor_spec: Optional[executor_spec.ExecutorSpec] = None,
      statistics: Optional[types.BaseChannel] = None,
      distribution: Optional[Union[Dict[str, Any],
                                   config_lib.DistributionConfig]] = None,
      fault_tolerance: Optional[Union[Dict[str, Any],
                                      FaultToleranceConfig]] = None,
      tuned_input_pipeline: Optional[types.BaseChannel] = None,
      partition_plan: Optional[types.BaseChannel] = None):
    """Constructs a HighPerfTrainer.

    Args:
      examples: Examples to train and evaluate on (transformed or raw).
      transformed_examples: Deprecated, as in the stock Trainer: `examples`
        that need `transform_graph`.
      transform_graph: Transform output; its feature spec parses the
        examples and its graph goes into the serving signature.
      schema: Schema of the examples (when there is no transform graph).
      base_model: Model to warm-start from: `fn_args.base_model` in run_fn
        mode; managed mode starts a fresh training from its weights.
      hyperparameters: Tuner output; its values override
        `custom_config['hparams']` in managed mode.
      module_file: Module with `build_model(hparams)` (managed mode) and/or
        `run_fn(fn_args)`: a file, or the dotted name of an importable
        module (no `.py`, `/` or scheme). Exactly one of module_file and
        run_fn.
      run_fn: Python path of a `run_fn` (run_fn mode).
      train_args: Splits and num_steps (optimizer updates).
      eval_args: Splits and num_steps (0: one pass in managed mode).
      custom_config: Dict passed to the module (`fn_args.custom_config`).
      custom_executor_spec: Deprecated, as in the stock Trainer: replaces
        the executor (its class must accept our exec properties).
      statistics: ExampleStatistics, as TFX 1.21's Trainer takes them (its
        FnArgs then carry `num_examples` per split); TFX 1.16's Trainer has
        no such input. By keyword: stock 1.21 lists it first, 1.16 not at
        all, so positional arguments follow 1.16's order.
      distribution: DistributionConfig (or its dict).
      fault_tolerance: FaultToleranceConfig (or its dict).
      tuned_input_pipeline: TunedInputPipeline from OptimizedTransform.
      partition_plan: PartitionPlan from GPipePartitioner. The strategy
        must be 'auto' (which then picks one_device: the pipeline places its
        stages) or 'one_device', and the global batch the plan's batch_size
        (checked here when the plan's GPipePartitioner is in this pipeline,
        else when training starts).

    Raises:
      ValueError: A bad config, naming the value and what is allowed (a
        bad module fails when the executor starts, before training).
    """
    _check_stock_arguments(module_file, run_fn, examples,
                           transformed_examples, transform_graph,
                           custom_executor_spec)
    examples = examples or transformed_examples
    config = _distribution_config(distribution, partition_plan)
    fault_config = FaultToleranceConfig.from_dict(fault_tolerance)
    train_args = train_args or trainer_pb2.TrainArgs()
    module_file, module_path = _module_source(module_file)
    # The mode as configured: 'auto' is resolved against the module by the
    # executor, which checks the training length again then.
    resolve.check_train_length(config.mode, _static_num_steps(train_args),
                               config.train_epochs)
    spec = HighPerfTrainerSpec(
        **_statistics_input(statistics),
        examples=examples,
        transform_graph=transform_graph,
        schema=schema,
        base_model=base_model,
        hyperparameters=hyperparameters,
        train_args=train_args,
        eval_args=eval_args or trainer_pb2.EvalArgs(),
        module_file=module_file,
        module_path=module_path,
        run_fn=run_fn,
        custom_config=(custom_config
                       if isinstance(custom_config, data_types.RuntimeParameter)
                       else json_utils.dumps(custom_config)),
        distribution=config.to_json(),
        fault_tolerance=fault_config.to_json(),
        component_class=self.component_class(),
        tuned_input_pipeline=tuned_input_pipeline,
        partition_plan=partition_plan,
        model=types.Channel(type=standard_artifacts.Model),
        model_run=types.Channel(type=standard_artifacts.ModelRun))
    super().__init__(spec=spec, custom_executor_spec=custom_executor_spec)
    # The stock Trainer's node id (`.with_id()` still overrides): a pipeline
    # that only changes the import keeps its pipeline-root layout, MLMD
    # contexts, cache and resolvers.
    self.id = DEFAULT_NODE_ID
    if module_file and udf_utils.should_package_user_modules():
      # As the stock Trainer: the module file travels as a wheel, and
      # `module_path` points into it at run time.
      udf_utils.add_user_module_dependency(
          self, standard_component_specs.MODULE_FILE_KEY,
          standard_component_specs.MODULE_PATH_KEY)


def _check_stock_arguments(module_file, run_fn, examples,
                           transformed_examples, transform_graph,
                           custom_executor_spec) -> None:
  """The stock Trainer's argument checks, and its deprecation warnings."""
  if [bool(module_file), bool(run_fn)].count(True) != 1:
    raise ValueError("Exactly one of 'module_file' or 'run_fn' must be "
                     f'supplied; got module_file={module_file!r}, '
                     f'run_fn={run_fn!r}.')
  if bool(examples) == bool(transformed_examples):
    raise ValueError("Exactly one of 'examples' or 'transformed_examples' "
                     'must be supplied.')
  if transformed_examples and not transform_graph:
    raise ValueError("If 'transformed_examples' is supplied, "
                     "'transform_graph' must be supplied too.")
  for name, value in (('custom_executor_spec', custom_executor_spec),
                      ('transformed_examples', transformed_examples)):
    if value:
      logging.warning('HighPerfTrainer: `%s` is deprecated, as in the '
                      'stock Trainer.', name)


def _statistics_input(
    statistics: Optional[types.BaseChannel]) -> Dict[str, types.BaseChannel]:
  """The `statistics` spec argument where given; a clear error on a TFX whose
  stock Trainer takes none (1.16)."""
  if statistics is None:
    return {}
  if standard_component_specs.STATISTICS_KEY not in HighPerfTrainerSpec.INPUTS:
    raise ValueError(
        "statistics: the installed TFX's stock Trainer takes no statistics "
        '(TFX 1.21 added the input); drop it or install TFX 1.21.')
  return {standard_component_specs.STATISTICS_KEY: statistics}


def _distribution_config(
    distribution: Union[None, Dict[str, Any], config_lib.DistributionConfig],
    partition_plan: Optional[types.BaseChannel]
) -> config_lib.DistributionConfig:
  """The validated config; with a partition plan, checked against it."""
  config = config_lib.DistributionConfig.from_dict(distribution)
  if partition_plan is not None:
    config_lib.check_partition_plan(
        config.strategy, 1, config.gradient_accumulation_steps,
        config.global_batch(1), _planned_batch_size(partition_plan))
  return config


def _static_num_steps(train_args: Any) -> int:
  """`train_args.num_steps` when known before run time, else 0.

  A dict (with RuntimeParameter values) or a RuntimeParameter is resolved
  at run time; the executor checks the training length again then.
  """
  return (train_args.num_steps
          if isinstance(train_args, trainer_pb2.TrainArgs) else 0)


def _planned_batch_size(channel: types.BaseChannel) -> Optional[int]:
  """The plan's batch when the component producing it (a GPipePartitioner of
  this pipeline) says it at construction (components import no other
  component: its `planned_batch_size`, not its class, is the contract)."""
  producer = getattr(channel, 'producer_component', None)
  return getattr(producer, 'planned_batch_size', None)
