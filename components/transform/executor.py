"""OptimizedTransform executor: the real Transform, then re-shard and tune.

1. The stock Transform executor's `Do` produces every stock output.
2. Each materialized split is re-sharded into `num_output_shards` files
   (records and their order unchanged).
3. The tuner measures input pipelines on the tune split within the time
   budget, and the chosen `InputPipelineConfig` is written to
   `<tuned_input_pipeline>/config.json` with `report.md` and
   `candidates.png`; the key numbers become custom properties.
"""

import json
import os
import time
from typing import Any, Dict, List, Optional

from absl import logging
import tensorflow as tf
import tensorflow_transform as tft
from tfx import types
from tfx.components.transform import executor as transform_executor
from tfx.components.transform import executor_utils
from tfx.components.util import examples_utils
from tfx.types import artifact_utils
from tfx.types import standard_component_specs
from tfx.utils import io_utils
from tfx_bsl.public import tfxio
from tensorflow_metadata.proto.v0 import schema_pb2

from components import storage
from components.data import input_pipeline
from components.transform import report
from components.transform import sharding
from components.transform import tuner
from components.transform.config import TuningConfig

TUNING_KEY = 'tuning'
TUNED_INPUT_PIPELINE_KEY = 'tuned_input_pipeline'
CONFIG_FILE = 'config.json'
STOCK_READER = 'stock TFX reader (tfx_bsl TFExampleRecord)'
_TFRECORDS_GZIP = 'tfrecords_gzip'
_TF_EXAMPLE = 'FORMAT_TF_EXAMPLE'


class Executor(transform_executor.Executor):
  """Runs the stock Transform, re-shards its output and tunes the reader."""

  def Do(self, input_dict: Dict[str, List[types.Artifact]],
         output_dict: Dict[str, List[types.Artifact]],
         exec_properties: Dict[str, Any]) -> None:
    tuning = TuningConfig.from_json(exec_properties.get(TUNING_KEY))
    tuned_artifact = artifact_utils.get_single_instance(
        output_dict[TUNED_INPUT_PIPELINE_KEY])
    # Before the Transform runs: an unwritable root fails now, naming it.
    storage.check_writable(tuned_artifact.uri, 'tuned_input_pipeline output')
    start = time.monotonic()
    super().Do(
        input_dict,
        {k: v for k, v in output_dict.items() if k != TUNED_INPUT_PIPELINE_KEY},
        {k: v for k, v in exec_properties.items() if k != TUNING_KEY})
    transform_seconds = time.monotonic() - start
    # The tuning budget counts from here: re-sharding, measuring, report.
    budget_start = time.monotonic()

    splits_config = executor_utils.ResolveSplitsConfig(
        exec_properties.get(standard_component_specs.SPLITS_CONFIG_KEY),
        input_dict[standard_component_specs.EXAMPLES_KEY])
    examples = input_dict[standard_component_specs.EXAMPLES_KEY]
    # From TFRecord inputs, Transform materializes tf.Example TFRecords.
    transformed = (
        output_dict.get(standard_component_specs.TRANSFORMED_EXAMPLES_KEY)
        if _are_tfrecords(examples) else None)
    num_examples = None
    if transformed:
      counts = _reshard(transformed, splits_config.transform,
                        tuning.num_output_shards)
      num_examples = counts.get(tuning.tune_split)
    shard_seconds = time.monotonic() - budget_start

    transform_graph_uri = artifact_utils.get_single_uri(
        output_dict[standard_component_specs.TRANSFORM_GRAPH_KEY])
    tft_output = tft.TFTransformOutput(transform_graph_uri)
    materialized = (_split_patterns(transformed, tuning.tune_split)
                    if transformed else None)
    raw_patterns = ({split: _split_patterns(examples, split)
                     for split in splits_config.transform}
                    if _are_tfrecords(examples, _TF_EXAMPLE) else None)
    references = ({STOCK_READER: _stock_reader(
        materialized, tft_output.transformed_metadata.schema,
        tuning.batch_size)} if materialized else {})
    result = tuner.tune(
        tuning, tft_output.transformed_feature_spec(),
        materialized_patterns=materialized,
        transform_graph_uri=transform_graph_uri,
        raw_file_patterns=raw_patterns,
        num_examples=num_examples,
        references=references,
        clock_start=budget_start)
    tuned_artifact.set_float_custom_property('transform_seconds',
                                             transform_seconds)
    _write_artifact(tuned_artifact, result, {
        'stock Transform seconds (inside this step)':
            f'{transform_seconds:.1f}',
        're-sharding seconds': f'{shard_seconds:.1f}',
        'materialized files per split': (
            str(tuning.num_output_shards or 'as written by Transform')
            if transformed else 'none'),
    })
    logging.info('OptimizedTransform: Transform %.1f s, re-shard %.1f s, '
                 'then tuning until %.1f s; chosen %s', transform_seconds,
                 shard_seconds, time.monotonic() - budget_start,
                 result.config.to_json())


def _are_tfrecords(examples: List[types.Artifact],
                   payload_format: Optional[str] = None) -> bool:
  """Whether every artifact holds gzipped TFRecords (of `payload_format`)."""
  return all(
      examples_utils.get_file_format(a) == _TFRECORDS_GZIP and
      payload_format in (None, examples_utils.get_payload_format_string(a))
      for a in examples)


def _split_patterns(artifacts: List[types.Artifact], split: str) -> List[str]:
  return [io_utils.all_files_pattern(uri)
          for uri in artifact_utils.get_split_uris(artifacts, split)]


def _reshard(transformed: List[types.Artifact], splits: List[str],
             num_shards: int) -> Dict[str, int]:
  """Re-shards every materialized split; returns examples per split."""
  counts = {}
  for split in splits:
    counts[split] = 0
    for uri in artifact_utils.get_split_uris(transformed, split):
      counts[split] += (sharding.reshard(uri, num_shards).num_records
                        if num_shards else input_pipeline.count_records(
                            tf.io.gfile.glob(os.path.join(uri, '*')),
                            'GZIP'))
  return counts


def _stock_reader(patterns: List[str], schema: schema_pb2.Schema,
                  batch_size: int) -> tuner.DatasetFn:
  """The reader TFX's `data_accessor.tf_dataset_factory` builds (defaults)."""
  return lambda: tfxio.TFExampleRecord(
      file_pattern=patterns, schema=schema).TensorFlowDataset(
          tfxio.TensorFlowDatasetOptions(batch_size=batch_size))


def _write_artifact(artifact: types.Artifact, result: tuner.TuningResult,
                    extra: Dict[str, str]) -> None:
  tf.io.gfile.makedirs(artifact.uri)
  with tf.io.gfile.GFile(os.path.join(artifact.uri, CONFIG_FILE), 'w') as f:
    f.write(json.dumps(result.config.to_dict(), sort_keys=True, indent=1))
  report.write_report(result, artifact.uri, extra)
  stock: Optional[tuner.Measurement] = next(
      (r for r in result.references if r.name == STOCK_READER), None)
  artifact.set_float_custom_property('examples_per_sec',
                                     result.chosen.examples_per_sec)
  if stock:
    artifact.set_float_custom_property('stock_examples_per_sec',
                                       stock.examples_per_sec)
    artifact.set_float_custom_property(
        'speedup_vs_stock',
        result.chosen.examples_per_sec / stock.examples_per_sec)
  if result.later_epochs_examples_per_sec:
    artifact.set_float_custom_property('later_epochs_examples_per_sec',
                                       result.later_epochs_examples_per_sec)
  artifact.set_string_custom_property('bottleneck_stage', result.bottleneck)
  artifact.set_string_custom_property('cache', result.config.cache)
  artifact.set_string_custom_property('transform_placement',
                                      result.config.transform_placement)
  artifact.set_int_custom_property('num_candidates', len(result.candidates))
  artifact.set_int_custom_property('num_examples', result.num_examples)
  artifact.set_int_custom_property('cache_bytes', result.cache_bytes)
  artifact.set_float_custom_property('tuning_seconds', result.seconds)
