"""OptimizedTransform: the stock Transform plus a tuned input pipeline.

A drop-in for `tfx.components.Transform`: the same arguments, checks,
channels and outputs (the stock constructor builds them), plus the
`tuning` parameter and the `tuned_input_pipeline` output that
HighPerfTrainer reads.
"""

from typing import Any, Dict, Optional, Union

from tfx import types
from tfx.components.transform import component as transform_component
from tfx.dsl.components.base import base_beam_component
from tfx.dsl.components.base import executor_spec
from tfx.proto import transform_pb2
from tfx.types import component_spec
from tfx.types import standard_component_specs

from components import drop_in
from components.transform.config import TuningConfig
from components.transform import executor
from components.transform import spec_keys
from components.types import TunedInputPipeline

DEFAULT_NODE_ID = 'Transform'


class OptimizedTransformSpec(standard_component_specs.TransformSpec):
  """TransformSpec plus the tuning config and the tuned pipeline output."""
  PARAMETERS = {
      **standard_component_specs.TransformSpec.PARAMETERS,
      spec_keys.TUNING_KEY: component_spec.ExecutionParameter(type=str),
      drop_in.COMPONENT_CLASS_KEY: component_spec.ExecutionParameter(
          type=str, optional=True),
  }
  OUTPUTS = {
      **standard_component_specs.TransformSpec.OUTPUTS,
      spec_keys.TUNED_INPUT_PIPELINE_KEY: component_spec.ChannelParameter(
          type=TunedInputPipeline),
  }


class _UpgradeTransformSpec(base_beam_component.BaseBeamComponent):
  """Turns the stock constructor's TransformSpec into OptimizedTransformSpec.

  It sits between `Transform` and `BaseBeamComponent` in OptimizedTransform's
  MRO, so the stock `Transform.__init__` validates the arguments and creates
  the channels exactly as for a stock Transform; only the spec class, the
  tuning parameter and the extra output channel are added here.
  """

  def __init__(self, spec: types.ComponentSpec, **kwargs):
    upgraded = OptimizedTransformSpec(
        **spec.exec_properties, **spec.inputs, **spec.outputs,
        **{spec_keys.TUNING_KEY: self._tuning.to_json(),
           drop_in.COMPONENT_CLASS_KEY: self.component_class(),
           spec_keys.TUNED_INPUT_PIPELINE_KEY: types.Channel(
               type=TunedInputPipeline)})
    super().__init__(spec=upgraded, **kwargs)


class OptimizedTransform(drop_in.StockExecutionType,
                         transform_component.Transform, _UpgradeTransformSpec):
  """Transform that also measures and tunes the trainer's input pipeline.

  Outputs: every stock Transform output (materialized examples written by
  the stock Beam write into `tuning.num_output_shards` files, the same
  records) plus `tuned_input_pipeline` (TunedInputPipeline): `config.json`
  (an `InputPipelineConfig` for `components.data.input_pipeline.
  build_dataset`), `report.md`, `candidates.png` and `fingerprint.json`
  (what it was tuned on, so the next run can reuse it). Its executions are
  recorded in MLMD under the stock Transform's type (see
  `components.drop_in`).
  """
  STOCK_TYPE_NAME = transform_component.Transform.get_class_type()
  SPEC_CLASS = OptimizedTransformSpec
  EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(executor.Executor)

  def __init__(self,
               examples: types.BaseChannel,
               schema: types.BaseChannel,
               module_file: Optional[str] = None,
               preprocessing_fn: Optional[str] = None,
               splits_config: Optional[transform_pb2.SplitsConfig] = None,
               analyzer_cache: Optional[types.BaseChannel] = None,
               materialize: bool = True,
               disable_analyzer_cache: bool = False,
               force_tf_compat_v1: bool = False,
               custom_config: Optional[Dict[str, Any]] = None,
               disable_statistics: bool = False,
               stats_options_updater_fn: Optional[str] = None,
               tuning: Union[None, str, Dict[str, Any], TuningConfig] = None):
    """Same arguments as `tfx.components.Transform`, plus `tuning`.

    Args:
      examples: See `tfx.components.Transform`.
      schema: See `tfx.components.Transform`.
      module_file: See `tfx.components.Transform`.
      preprocessing_fn: See `tfx.components.Transform`.
      splits_config: See `tfx.components.Transform`.
      analyzer_cache: See `tfx.components.Transform`.
      materialize: See `tfx.components.Transform`; without materialized
        examples the tuned pipeline transforms on the fly.
      disable_analyzer_cache: See `tfx.components.Transform`.
      force_tf_compat_v1: See `tfx.components.Transform`.
      custom_config: See `tfx.components.Transform`.
      disable_statistics: See `tfx.components.Transform`.
      stats_options_updater_fn: See `tfx.components.Transform`.
      tuning: `TuningConfig`, or its dict / JSON string.

    Raises:
      ValueError: for a bad tuning config or splits config, naming the value
        and the allowed ones (and everything the stock Transform rejects).
    """
    self._tuning = TuningConfig.parse(tuning).validate_splits(
        list(splits_config.analyze) if splits_config else [],
        list(splits_config.transform) if splits_config else [],
        materialize)
    super().__init__(
        examples=examples,
        schema=schema,
        module_file=module_file,
        preprocessing_fn=preprocessing_fn,
        splits_config=splits_config,
        analyzer_cache=analyzer_cache,
        materialize=materialize,
        disable_analyzer_cache=disable_analyzer_cache,
        force_tf_compat_v1=force_tf_compat_v1,
        custom_config=custom_config,
        disable_statistics=disable_statistics,
        stats_options_updater_fn=stats_options_updater_fn)
    # The stock Transform's node id (`.with_id()` still overrides), so a
    # pipeline that only changes the import keeps its layout, MLMD contexts
    # and cache.
    self.id = DEFAULT_NODE_ID
