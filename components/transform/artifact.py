"""The TunedInputPipeline artifact OptimizedTransform writes: the chosen
config (`records.tuned_input_pipeline`), the report and chart, what it was
tuned on (`history`), and the key numbers as custom properties (what MLMD
queries and notebooks read)."""

import os
import time
from typing import Optional

from absl import logging
import tensorflow as tf
from tfx import types

from components.data.config import InputPipelineConfig
from components.records import tuned_input_pipeline
from components.transform import history
from components.transform import report
from components.transform.results import Measurement
from components.transform.tuning_step import Tuned

# The reference the tuned reader is compared with (speedup_vs_stock).
STOCK_READER = 'stock TFX reader (tfx_bsl TFExampleRecord)'
# The `decision` of an artifact that holds the default pipeline.
NOT_TUNED = 'not tuned'


def write(artifact: types.Artifact, tuned: Tuned) -> None:
  """config.json, the report, fingerprint.json (what it was tuned on, for
  the next run) and the key numbers as custom properties."""
  result = tuned.result
  artifact.set_float_custom_property('transform_seconds',
                                     tuned.transform_seconds)
  history.write_fingerprint(artifact.uri, tuned.key, {
      'examples_per_sec': result.chosen.examples_per_sec,
      'decision': result.decision})
  tuned_input_pipeline.write(artifact.uri, result.config)
  report.write_report(result, artifact.uri, tuned.report_rows)
  stock: Optional[Measurement] = next(
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
  if result.consumer is not None:
    artifact.set_float_custom_property('consumer_examples_per_sec',
                                       result.consumer.examples_per_sec)
    artifact.set_string_custom_property('consumer_source',
                                        result.consumer.source)
  if result.input_bound is not None:
    artifact.set_int_custom_property('input_bound', int(result.input_bound))
  artifact.set_string_custom_property('decision', result.decision)
  artifact.set_int_custom_property('batch_size', result.batch_size)
  artifact.set_string_custom_property('batch_mismatch',
                                      result.batch_mismatch or '')
  artifact.set_string_custom_property('bottleneck_stage', result.bottleneck)
  artifact.set_string_custom_property('cache', result.config.cache)
  artifact.set_string_custom_property('transform_placement',
                                      result.config.transform_placement)
  artifact.set_int_custom_property('num_candidates', len(result.candidates))
  artifact.set_int_custom_property('num_examples', result.num_examples)
  artifact.set_int_custom_property('cache_bytes', result.cache_bytes)
  artifact.set_float_custom_property('tuning_seconds', result.seconds)
  after = time.monotonic() - tuned.started
  artifact.set_float_custom_property('after_transform_seconds', after)
  logging.info('OptimizedTransform: Transform %.1f s, then %.1f s (%s); '
               'chosen %s', tuned.transform_seconds, after, result.decision,
               result.config.to_json())


def write_not_tuned(artifact: types.Artifact, reason: str,
                    transform_seconds: float) -> None:
  """The default input pipeline, and why it was not tuned."""
  logging.info('OptimizedTransform: not tuned, %s.', reason)
  config_file = tuned_input_pipeline.write(artifact.uri, InputPipelineConfig())
  with tf.io.gfile.GFile(os.path.join(artifact.uri, report.REPORT_FILE),
                         'w') as f:
    f.write(f'# Input pipeline tuning\n\nNot tuned: {reason}. '
            f'`{os.path.basename(config_file)}` holds the default input '
            'pipeline.\n')
  artifact.set_string_custom_property('decision', f'{NOT_TUNED}: {reason}')
  artifact.set_float_custom_property('transform_seconds', transform_seconds)
