"""What OptimizedTransform's tuning reads from the stock Transform's dicts,
as `tuning_step`'s records: the plan before the Transform (the split to tune
on, the previous training) and the data after it. Every input the stock
Transform takes is taken; the input pipeline reads gzipped TFRecords,
materialized or raw tf.Example.
"""

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

from absl import logging
import tensorflow as tf
import tensorflow_transform as tft
from tfx import types
from tfx.components.transform import executor_utils
from tfx.components.util import examples_utils
from tfx.types import artifact_utils
from tfx.types import standard_component_specs
from tfx.utils import io_utils
from tfx_bsl.public import tfxio
from tensorflow_metadata.proto.v0 import schema_pb2

from components.data.config import DEFAULT_COMPRESSION
from components.data import input_pipeline
from components import pipeline_layout
from components import storage
from components.transform import artifact as artifact_lib
from components.transform.config import TuningConfig
from components.transform import history
from components.transform import materialized
from components.transform import measurement
from components.transform.results import DatasetFn
from components.transform.tuning_step import Plan, TransformedData

TFRECORDS_GZIP = 'tfrecords_gzip'
TF_EXAMPLE = 'FORMAT_TF_EXAMPLE'


def plan(tuning: TuningConfig, tuned_uri: str,
         input_dict: Dict[str, List[types.Artifact]],
         output_dict: Dict[str, List[types.Artifact]],
         exec_properties: Dict[str, Any],
         executor_output_uri: Optional[str]) -> Plan:
  """The tuning's plan, before the stock Transform: an unwritable output
  fails here, not after it."""
  storage.check_writable(tuned_uri, 'tuned_input_pipeline output')
  split, not_tuned = split_to_tune(tuning, input_dict, output_dict,
                                   exec_properties)
  if not_tuned:
    return Plan(tuning, tuned_uri, not_tuned=not_tuned)
  return Plan.from_previous_training(
      dataclasses.replace(tuning, tune_split=split), tuned_uri,
      history.previous_training(pipeline_layout.pipeline_root(
          executor_output_uri, tuned_uri)))


def split_to_tune(tuning: TuningConfig,
                  input_dict: Dict[str, List[types.Artifact]],
                  output_dict: Dict[str, List[types.Artifact]],
                  exec_properties: Dict[str, Any]
                 ) -> Tuple[Optional[str], Optional[str]]:
  """(split to tune on, None), or (None, why nothing can be tuned).

  Every input the stock Transform takes is taken; the tuner needs one
  transformed split read either from materialized tf.Example TFRecords or
  on the fly from raw tf.Example TFRecords.
  """
  examples = input_dict[standard_component_specs.EXAMPLES_KEY]
  transform = list(executor_utils.ResolveSplitsConfig(
      exec_properties.get(standard_component_specs.SPLITS_CONFIG_KEY),
      examples).transform)
  split = tuning.split_to_tune(transform)
  if split is None:
    return None, (f'no split to tune on: Transform transforms {transform}' +
                  (f', not tune_split={tuning.tune_split!r}'
                   if tuning.tune_split else ''))
  materialized = (bool(output_dict.get(
      standard_component_specs.TRANSFORMED_EXAMPLES_KEY)) and
                  are_tfrecords(examples))
  on_the_fly = are_tfrecords(examples, TF_EXAMPLE)
  if not (materialized or on_the_fly):
    formats = sorted({
        f'{examples_utils.get_file_format(a)}/'
        f'{examples_utils.get_payload_format_string(a)}' for a in examples})
    return None, (
        f'no examples the input pipeline reads: the examples are {formats} '
        '(it reads gzipped TFRecords, materialized or raw tf.Example)' +
        ('' if output_dict.get(
            standard_component_specs.TRANSFORMED_EXAMPLES_KEY)
         else ', and Transform did not materialize'))
  return split, None


def are_tfrecords(examples: List[types.Artifact],
                  payload_format: Optional[str] = None) -> bool:
  """Whether every artifact holds gzipped TFRecords (of `payload_format`)."""
  return all(
      examples_utils.get_file_format(a) == TFRECORDS_GZIP and
      payload_format in (None, examples_utils.get_payload_format_string(a))
      for a in examples)


def split_patterns(artifacts: List[types.Artifact], split: str) -> List[str]:
  """The file patterns of `split` in every artifact."""
  return [io_utils.all_files_pattern(uri)
          for uri in artifact_utils.get_split_uris(artifacts, split)]


def transformed_data(tuning: TuningConfig,
                     input_dict: Dict[str, List[types.Artifact]],
                     output_dict: Dict[str, List[types.Artifact]],
                     exec_properties: Dict[str, Any],
                     examples_written: Dict[str, int]) -> TransformedData:
  """The Transform's inputs and outputs, as the tuner reads them.

  Args:
    examples_written: Transformed-examples output path -> examples (the
      sharded write's Beam counters).
  """
  batch = tuning.measure_batch_size
  splits_config = executor_utils.ResolveSplitsConfig(
      exec_properties.get(standard_component_specs.SPLITS_CONFIG_KEY),
      input_dict[standard_component_specs.EXAMPLES_KEY])
  examples = input_dict[standard_component_specs.EXAMPLES_KEY]
  # From TFRecord inputs, Transform materializes tf.Example TFRecords.
  transformed = (
      output_dict.get(standard_component_specs.TRANSFORMED_EXAMPLES_KEY)
      if are_tfrecords(examples) else None)
  num_examples = (materialized.split_count(examples_written, transformed,
                                           tuning.tune_split)
                  if transformed else None)

  transform_graph_uri = artifact_utils.get_single_uri(
      output_dict[standard_component_specs.TRANSFORM_GRAPH_KEY])
  tft_output = tft.TFTransformOutput(transform_graph_uri)
  feature_spec = tft_output.transformed_feature_spec()
  materialized_patterns = (split_patterns(transformed, tuning.tune_split)
                           if transformed else None)
  raw_patterns = ({split: split_patterns(examples, split)
                   for split in splits_config.transform}
                  if are_tfrecords(examples, TF_EXAMPLE) else None)
  references = ({artifact_lib.STOCK_READER: _stock_reader(
      materialized_patterns, tft_output.transformed_metadata.schema, batch)}
                if materialized_patterns else {})
  key = history.tuning_key(
      feature_spec, num_examples if num_examples is not None else
      _estimated_examples(materialized_patterns or (raw_patterns or {}).get(
          tuning.tune_split)), tuning.tune_split, batch)
  return TransformedData(feature_spec, transform_graph_uri, bool(transformed),
                         num_examples, materialized_patterns, raw_patterns,
                         references, key)


def _estimated_examples(patterns: Optional[List[str]]) -> Optional[int]:
  """Examples in the files (estimated from the first one), None if none.

  Deterministic for the same files, so it tells an unchanged volume too.
  Read as the tuner reads them: the tuning leaves its compression at the
  default.
  """
  try:
    return measurement.estimate_num_examples(
        input_pipeline.list_files(patterns),
        DEFAULT_COMPRESSION) if patterns else None
  except (ValueError, tf.errors.OpError) as e:
    logging.info('Cannot estimate the examples in %s: %s', patterns, e)
    return None


def _stock_reader(patterns: List[str], schema: schema_pb2.Schema,
                  batch_size: int) -> DatasetFn:
  """The reader TFX's `data_accessor.tf_dataset_factory` builds (defaults)."""
  return lambda: tfxio.TFExampleRecord(
      file_pattern=patterns, schema=schema).TensorFlowDataset(
          tfxio.TensorFlowDatasetOptions(batch_size=batch_size))
