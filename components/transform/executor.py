"""OptimizedTransform executor: the real Transform, then tune the reader.

Thin, as TFX's: it wires TFX's dicts to `tuning_inputs` (the tuning's plan,
before the Transform, and what it tunes on, after it), runs the stock
Transform with the changes of `components.patches` (the transformed
examples written in bounded shards inside its Beam pipeline and counted, so
re-sharding scales with the runner; the module's wheel unzipped instead of
pip-installed), lets `tuning_step` tune on what it wrote, and writes the
result (`artifact`).
"""

import time
from typing import Any, Dict, List, Optional

from absl import logging
import apache_beam as beam
from tfx import types
from tfx.components.transform import executor_utils
from tfx.types import artifact_utils
from tfx.types import standard_component_specs

from components import patches
from components.patches import transform as transform_patches
from components.transform import artifact as artifact_lib
from components.transform.config import TuningConfig
from components.transform import materialized
from components.transform.model_preparation import ModelPreparation
from components.transform import spec_keys
from components.transform import tuning_inputs
from components.transform import tuning_step


class _StockRun(transform_patches.StockHooks):
  """What one stock Transform run leaves the tuning: its Beam pipelines
  (their counters), and the model step prepared from its preprocessing_fn
  where `prepares_model`."""

  def __init__(self, prepares_model: bool):
    self._prepares_model = prepares_model
    self.pipelines: List[beam.Pipeline] = []
    self.model: Optional[ModelPreparation] = None

  def on_preprocessing_fn(self, fn: Any) -> None:
    if self._prepares_model:
      self.model = ModelPreparation(fn)

  def on_beam_pipeline(self, pipeline: beam.Pipeline) -> None:
    self.pipelines.append(pipeline)


class Executor(transform_patches.TransformExecutorHooks):
  """Runs the stock Transform with sharded output and tunes the reader."""

  def Do(self, input_dict: Dict[str, List[types.Artifact]],
         output_dict: Dict[str, List[types.Artifact]],
         exec_properties: Dict[str, Any]) -> None:
    tuning = TuningConfig.from_json(exec_properties.get(spec_keys.TUNING_KEY))
    tuned = output_dict.get(spec_keys.TUNED_INPUT_PIPELINE_KEY)
    # None (as the stock Transform's outputs, e.g. our executor under the
    # stock component): stock only.
    tuned_artifact = (artifact_utils.get_single_instance(tuned) if tuned
                      else None)
    plan = None if tuned_artifact is None else tuning_inputs.plan(
        tuning, tuned_artifact.uri, input_dict, output_dict, exec_properties,
        self._context and self._context.executor_output_uri)
    # The stock Do replaces a single transformed_examples artifact with one
    # per input Examples artifact (e.g. a span window); done here, on the
    # dict the launcher records, since the stock Do gets a filtered copy.
    executor_utils.MatchNumberOfTransformedExamplesArtifacts(
        input_dict, output_dict)
    start = time.monotonic()
    run = _StockRun(plan is not None and plan.measures_model)
    self._run_stock_sharded(run, tuning, input_dict, output_dict,
                            exec_properties)
    if tuned_artifact is None:
      logging.info('OptimizedTransform: no %s output to write, so the input '
                   'pipeline was not tuned.',
                   spec_keys.TUNED_INPUT_PIPELINE_KEY)
      return
    seconds = time.monotonic() - start
    stock = tuning_step.StockTransform(
        seconds, materialized.examples_written(run.pipelines),
        time.monotonic(), run.model)
    if plan.not_tuned:
      artifact_lib.write_not_tuned(tuned_artifact, plan.not_tuned, seconds)
      return
    artifact_lib.write(tuned_artifact, tuning_step.tune(
        plan, stock, tuning_inputs.transformed_data(
            plan.tuning, input_dict, output_dict, exec_properties,
            stock.examples_written)))

  def _run_stock_sharded(self, run: _StockRun, tuning: TuningConfig,
                         input_dict: Dict[str, List[types.Artifact]],
                         output_dict: Dict[str, List[types.Artifact]],
                         exec_properties: Dict[str, Any]) -> None:
    """The stock Do on the stock outputs and exec properties, writing
    sharded; then the shard indexes of what it materialized."""
    stock_outputs = {k: v for k, v in output_dict.items()
                     if k != spec_keys.TUNED_INPUT_PIPELINE_KEY}
    shards = materialized.shards_by_split(
        input_dict.get(standard_component_specs.EXAMPLES_KEY) or [], tuning)
    with transform_patches.sharded_writes(tuning.num_output_shards, shards), \
        patches.installed(patches.TRANSFORM_EXECUTOR_HOOKS,
                          patches.UNZIPPED_WHEEL_INSTALLS,
                          patches.DIRECT_RUNNER_IN_PROCESS):
      try:
        self.run_stock(
            run, input_dict, stock_outputs,
            {k: v for k, v in exec_properties.items()
             if k != spec_keys.TUNING_KEY})
      except Exception as e:  # pylint: disable=broad-except
        materialized.raise_if_a_location_failed(e, stock_outputs)
        raise
    materialized.write_shard_indexes(output_dict.get(
        standard_component_specs.TRANSFORMED_EXAMPLES_KEY) or [])
