"""GPipePartitioner: plans GPipe pipeline parallelism for a module's model.

    partitioner = GPipePartitioner(
        module_file='taxi_module.py',
        config={'batch_size': 256, 'num_stages': 2},
        examples=transform.outputs['transformed_examples'],
        transform_graph=transform.outputs['transform_graph'])

Its `partition_plan` output (a PartitionPlan artifact) holds plan.json,
which HighPerfTrainer executes with `components.pipeline_parallel.runner`.
"""

from typing import Any, Dict, Optional, Union

from tfx import types
from tfx.components.util import udf_utils
from tfx.dsl.components.base import base_component
from tfx.dsl.components.base import executor_spec
from tfx.types import component_spec
from tfx.types import standard_artifacts
from tfx.types import standard_component_specs

from components.partitioner import config as config_lib
from components.partitioner import executor
from components.partitioner import spec_keys
from components import types as hpm_types


class GPipePartitionerSpec(types.ComponentSpec):
  """Inputs: sample data; parameters: the module and the config JSON."""
  PARAMETERS = {
      standard_component_specs.MODULE_FILE_KEY:
          component_spec.ExecutionParameter(type=str, optional=True),
      standard_component_specs.MODULE_PATH_KEY:
          component_spec.ExecutionParameter(type=str, optional=True),
      spec_keys.CONFIG_KEY: component_spec.ExecutionParameter(type=str),
  }
  INPUTS = {
      standard_component_specs.TRANSFORM_GRAPH_KEY:
          component_spec.ChannelParameter(
              type=standard_artifacts.TransformGraph, optional=True),
      standard_component_specs.EXAMPLES_KEY: component_spec.ChannelParameter(
          type=standard_artifacts.Examples, optional=True),
  }
  OUTPUTS = {
      spec_keys.PARTITION_PLAN_KEY: component_spec.ChannelParameter(
          type=hpm_types.PartitionPlan),
  }


class GPipePartitioner(base_component.BaseComponent):
  """Profiles the module's model and writes a balanced GPipe plan."""

  SPEC_CLASS = GPipePartitionerSpec
  EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(executor.Executor)

  def __init__(self,
               config: Union[config_lib.PartitionerConfig, Dict[str, Any]],
               module_file: Optional[str] = None,
               module_path: Optional[str] = None,
               examples: Optional[types.BaseChannel] = None,
               transform_graph: Optional[types.BaseChannel] = None):
    """Validates the config and inputs (no I/O, no user code).

    Args:
      config: a PartitionerConfig or its fields as a dict.
      module_file: path of a module defining `build_model(hparams)`.
      module_path: Python module path of such a module (instead).
      examples: transformed examples for the sample batch; without them the
        profile runs on zeros shaped like the model inputs.
      transform_graph: needed with `examples`, to parse them.

    Raises:
      ValueError: bad config (e.g. zero micro-batches, a batch size the
        micro-batches do not divide), or a bad combination of inputs. More
        stages than the model has layers fails when the executor starts.
    """
    if isinstance(config, dict):
      config = config_lib.PartitionerConfig.from_dict(config)
    else:
      config.validate()
    if bool(module_file) == bool(module_path):
      raise ValueError('GPipePartitioner needs exactly one of module_file and '
                       f'module_path, got module_file={module_file!r}, '
                       f'module_path={module_path!r}.')
    if examples is not None and transform_graph is None:
      raise ValueError('examples are transformed examples, parsed with the '
                       'transform_graph; pass transform_graph too.')
    # Too many stages for the model's layers fails when the executor has
    # built the model, before profiling: construction reads no file and runs
    # no user code (a gs:// module must not need storage access here).
    spec = GPipePartitionerSpec(
        module_file=module_file,
        module_path=module_path,
        config=config.to_json(),
        examples=examples,
        transform_graph=transform_graph,
        partition_plan=types.Channel(type=hpm_types.PartitionPlan))
    super().__init__(spec=spec)
    self._batch_size = config.batch_size
    if module_file and udf_utils.should_package_user_modules():
      udf_utils.add_user_module_dependency(
          self, standard_component_specs.MODULE_FILE_KEY,
          standard_component_specs.MODULE_PATH_KEY)

  @property
  def planned_batch_size(self) -> int:
    """The mini-batch its plan will be made for (plan.json's batch_size),
    known at pipeline definition, before there is a plan to read."""
    return self._batch_size
