"""GPipePartitioner executor: profile the module's model, plan, report.

Steps: build the model with the module's `build_model(hparams)`; resolve the
stage count ('auto': one per device visible here); profile every layer call
on a micro-batch of transformed examples (or of zeros shaped like the model
inputs when no examples are wired in), at two micro-batch sizes when the
micro-batch count is 'auto'; solve the partition for every candidate
micro-batch count and schedule and keep the fastest predicted one that fits
the budget; with measure_schedule, run one traced step of the plan in a
fresh process; write plan.json, profile.json (the profile the plan was made
from), report.md and the charts into the PartitionPlan artifact, with the key
numbers as custom properties.
"""

import json
import os
import tempfile
from typing import Any, Dict, List

from absl import logging
import tensorflow as tf
import tensorflow_transform as tft
from tfx import types
from tfx.components.util import udf_utils
from tfx.dsl.components.base import base_executor
from tfx.dsl.io import fileio
from tfx.types import artifact_utils
from tfx.types import standard_component_specs

from components.partitioner import config as config_lib
from components.partitioner import measure
from components.partitioner import plan as plan_lib
from components.partitioner import profiling
from components.partitioner import report
from components.partitioner import spec_keys
from components.pipeline_parallel import graph as graph_lib
from components.records import partition_plan

BUILD_MODEL_FN = 'build_model'


def available_devices() -> int:
  """Devices a plan with num_stages='auto' may use: GPUs, else CPUs."""
  return (len(tf.config.list_logical_devices('GPU')) or
          len(tf.config.list_logical_devices('CPU')))


def sample_features(model: tf.keras.Model, batch_size: int,
                    examples: List[types.Artifact], split: str,
                    transform_graph_uri: str):
  """One batch of transformed features, or zeros if there are no examples."""
  if not examples:
    return tf.nest.map_structure(
        lambda kt: tf.zeros([batch_size] + kt.shape[1:].as_list(), kt.dtype),
        model.input)
  split_uri = artifact_utils.get_split_uri(examples, split)
  files = sorted(fileio.glob(os.path.join(split_uri, '*')))
  if not files:
    raise ValueError(f'no transformed examples in split {split!r} at '
                     f'{split_uri}.')
  feature_spec = tft.TFTransformOutput(
      transform_graph_uri).transformed_feature_spec()
  compression = 'GZIP' if files[0].endswith('.gz') else ''
  records = tf.data.TFRecordDataset(files, compression_type=compression)
  # Repeating fills the batch even from a tiny split.
  for serialized in records.repeat().batch(batch_size).take(1):
    return tf.io.parse_example(serialized, feature_spec)
  raise ValueError(f'the transformed examples at {split_uri} are empty.')


class Executor(base_executor.BaseExecutor):
  """Writes a GPipe partition plan for the module's model."""

  def Do(self, input_dict: Dict[str, List[types.Artifact]],
         output_dict: Dict[str, List[types.Artifact]],
         exec_properties: Dict[str, Any]) -> None:
    self._log_startup(input_dict, output_dict, exec_properties)
    config = config_lib.PartitionerConfig.from_json(
        exec_properties[spec_keys.CONFIG_KEY])
    build_model = udf_utils.get_fn(exec_properties, BUILD_MODEL_FN)
    model = build_model(config.hparams)
    num_layers = graph_lib.LayerGraph(model).num_calls
    num_stages = config.resolve_num_stages(available_devices(), num_layers)
    counts = config.microbatch_counts()
    plan, profile = plan_lib.choose_plan(
        profile_microbatches(model, config, input_dict), num_stages,
        config.batch_size, counts, config.schedule_names(), config.remat,
        config.offload_activations, config.memory_budget_bytes,
        config.data_parallel_replicas)
    plan['config'] = json.loads(config.to_json())
    if config.measure_schedule:
      plan['measured'] = measure.run(model, plan)

    output = artifact_utils.get_single_instance(
        output_dict[spec_keys.PARTITION_PLAN_KEY])
    write_plan(plan, profile, output.uri)
    record_plan(output, plan)
    logging.info('Pipeline plan: %s, boundaries %s, predicted step %.6f s.',
                 plan['schedule'], plan['boundaries'],
                 plan['predicted']['step_seconds'])


def profile_microbatches(model: tf.keras.Model,
                         config: config_lib.PartitionerConfig,
                         input_dict: Dict[str, List[types.Artifact]]
                        ) -> List[plan_lib.ModelProfile]:
  """The model's layers profiled at each micro-batch size the plan needs.

  One measured size for a fixed M; for 'auto' the smallest and the largest
  micro-batch, between which times are interpolated.
  """
  counts = config.microbatch_counts()
  sizes = sorted({config.replica_batch_size // max(counts),
                  config.replica_batch_size // min(counts)})
  examples = input_dict.get(standard_component_specs.EXAMPLES_KEY) or []
  transform_graph = input_dict.get(
      standard_component_specs.TRANSFORM_GRAPH_KEY) or []
  return [
      profiling.profile_model(
          model, sample_features(
              model, size, examples, config.sample_split,
              transform_graph[0].uri if transform_graph else ''),
          config.profile_repeats) for size in sizes]


def record_plan(output: types.Artifact, plan: Dict[str, Any]) -> None:
  """The plan's key numbers as custom properties of its artifact."""
  predicted = plan['predicted']
  output.set_int_custom_property('num_stages', plan['num_stages'])
  output.set_int_custom_property('num_microbatches',
                                 plan['num_microbatches'])
  output.set_string_custom_property('schedule', plan['schedule'])
  output.set_int_custom_property('data_parallel_replicas',
                                 plan['data_parallel_replicas'])
  output.set_string_custom_property('boundaries',
                                    json.dumps(plan['boundaries']))
  output.set_float_custom_property('predicted_step_seconds',
                                   predicted['step_seconds'])
  output.set_float_custom_property('slowest_stage_seconds',
                                   predicted['slowest_stage_seconds'])
  output.set_float_custom_property('bubble_fraction',
                                   predicted['bubble_fraction'])
  output.set_int_custom_property('peak_memory_bytes',
                                 predicted['peak_memory_bytes'])
  if 'measured' in plan:
    output.set_float_custom_property('measured_idle_fraction',
                                     plan['measured']['idle_fraction'])


def write_plan(plan: Dict[str, Any], profile: plan_lib.ModelProfile,
               output_uri: str) -> None:
  """plan.json, profile.json, report.md and PNGs into `output_uri`."""
  fileio.makedirs(output_uri)
  with tempfile.TemporaryDirectory() as local_dir:
    with open(os.path.join(local_dir, partition_plan.PLAN_FILE), 'w') as f:
      f.write(partition_plan.to_json(plan))
    with open(os.path.join(local_dir, plan_lib.PROFILE_FILE), 'w') as f:
      f.write(profile.to_json())
    report.write_report(plan, profile, local_dir)
    for name in sorted(os.listdir(local_dir)):
      fileio.copy(os.path.join(local_dir, name),
                  os.path.join(output_uri, name), overwrite=True)
