"""OptimizedTransform executor: the real Transform, then tune the reader.

1. The stock Transform executor's `Do` produces every stock output; its
   transformed-examples write (`TransformProcessor._EncodeAndWrite`, the
   stock hook) writes `num_output_shards` files per split inside the Beam
   pipeline and counts the examples (a Beam counter), so re-sharding scales
   with the runner and costs no pass over the data afterwards.
   The module's wheel is unzipped instead of pip-installed, three times per
   step (`components.user_wheels`). Both changes to TFX live in
   `components.patches`.
2. While Beam runs, a thread builds the module's model (`build_model`) and
   traces its training step, so that the consumer's rate costs only its
   timed seconds afterwards.
3. The tuner measures the default reader and the consumer at the trainer's
   batch: not input-bound, it stops with the defaults; else it verifies this
   node's previous tuning when the data is unchanged, or searches. The
   chosen `InputPipelineConfig` is written to
   `<tuned_input_pipeline>/config.json` (`components.records`) with
   `report.md`, `candidates.png` and `fingerprint.json` (what it was tuned
   on, for the next run); the key numbers become custom properties
   (`artifact`).
"""

import dataclasses
import functools
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from absl import logging
import apache_beam as beam
import tensorflow as tf
import tensorflow_transform as tft
from tfx import types
from tfx.components.transform import executor_utils
from tfx.types import artifact_utils
from tfx.types import standard_component_specs
from tfx_bsl.public import tfxio
from tensorflow_metadata.proto.v0 import schema_pb2

from components.data.config import DEFAULT_COMPRESSION
from components.data import input_pipeline
from components import patches
from components import pipeline_layout
from components.patches import transform as transform_patches
from components import storage
from components.transform import artifact as artifact_lib
from components.transform.config import TuningConfig
from components.transform import consumer as consumer_lib
from components.transform import history
from components.transform import materialized
from components.transform import measurement
from components.transform import report
from components.transform import spec_keys
from components.transform import tuner
from components.transform import tuning_inputs

# Longest wait for the model-preparing thread after Beam finished.
_PREPARE_JOIN_S = 120.0


@dataclasses.dataclass
class _Plan:
  """What the executor decided before the stock Transform ran."""
  tuning: TuningConfig
  # None: the output dict has no tuned_input_pipeline (as the stock
  # Transform's, e.g. our executor under the stock component): stock only.
  tuned_artifact: Optional[types.Artifact]
  # The previous training's rate; None: measure the model, or search.
  consumer: Optional[tuner.ConsumerRate] = None
  notes: List[str] = dataclasses.field(default_factory=list)
  mismatches: List[str] = dataclasses.field(default_factory=list)
  # Why there is nothing to tune on (the artifact then holds the default
  # pipeline), or None.
  not_tuned: Optional[str] = None


class _Background:
  """Runs a function in a thread; `result()` joins it and re-raises."""

  def __init__(self, fn: Callable[[], Any]):
    self._value = None
    self._error: Optional[BaseException] = None

    def target():
      try:
        self._value = fn()
      except Exception as e:  # pylint: disable=broad-except
        self._error = e

    self._thread = threading.Thread(target=target, daemon=True,
                                    name='tfx_hpm_prepare')
    self._thread.start()

  def result(self, timeout: float):
    self._thread.join(timeout)
    if self._thread.is_alive():
      raise TimeoutError(f'still running after {timeout:.0f} s')
    if self._error is not None:
      raise self._error
    return self._value


def _user_function(fn: Callable[..., Any]) -> Callable[..., Any]:
  """The module-level function behind a (custom-config bound) callable."""
  while isinstance(fn, functools.partial):
    fn = fn.func
  return getattr(fn, '__wrapped__', fn)


class Executor(transform_patches.TransformExecutorHooks):
  """Runs the stock Transform with sharded output and tunes the reader."""

  def on_preprocessing_fn(self, fn: Callable[..., Any]) -> None:
    """Finds the module's model for the consumer."""
    if getattr(self, '_wants_model', False):
      self._start_model_step(getattr(_user_function(fn), '__globals__', {}))

  def _start_model_step(self, module: Dict[str, Any]) -> None:
    """Starts building and tracing the module's training step in a thread."""
    build_model, label_key = module.get('build_model'), module.get(
        'LABEL_KEY')
    name = module.get('__name__', 'the module')
    if not callable(build_model) or not isinstance(label_key, str):
      self._model_note = (
          f'{name} defines no build_model(hparams) and LABEL_KEY, so the '
          'consumer was not measured; searching as before.')
      return
    step = consumer_lib.ModelStep(build_model, label_key)
    self._model_step = step

    def prepare():
      step.prepare()
      report.warm_up()  # Imports matplotlib meanwhile, too.
      return step
    self._model_prepare = _Background(prepare)

  def on_beam_pipeline(self, pipeline: beam.Pipeline) -> None:
    """Keeps the stock pipeline, to read its counters after it ran."""
    self._pipelines.append(pipeline)

  def Do(self, input_dict: Dict[str, List[types.Artifact]],
         output_dict: Dict[str, List[types.Artifact]],
         exec_properties: Dict[str, Any]) -> None:
    plan = self._plan(input_dict, output_dict, exec_properties)
    # The stock Do replaces a single transformed_examples artifact with one
    # per input Examples artifact (e.g. a span window); done here, on the
    # dict the launcher records, since the stock Do gets a filtered copy.
    executor_utils.MatchNumberOfTransformedExamplesArtifacts(
        input_dict, output_dict)
    start = time.monotonic()
    stock_outputs = {k: v for k, v in output_dict.items()
                     if k != spec_keys.TUNED_INPUT_PIPELINE_KEY}
    tuning = plan.tuning
    shards = materialized.shards_by_split(
        input_dict.get(standard_component_specs.EXAMPLES_KEY) or [], tuning)
    with transform_patches.sharded_writes(tuning.num_output_shards, shards), \
        patches.installed(patches.TRANSFORM_EXECUTOR_HOOKS,
                          patches.UNZIPPED_WHEEL_INSTALLS,
                          patches.DIRECT_RUNNER_IN_PROCESS):
      try:
        super().Do(
            input_dict, stock_outputs,
            {k: v for k, v in exec_properties.items()
             if k != spec_keys.TUNING_KEY})
      except Exception as e:  # pylint: disable=broad-except
        materialized.raise_if_a_location_failed(e, stock_outputs)
        raise
    materialized.write_shard_indexes(output_dict.get(
        standard_component_specs.TRANSFORMED_EXAMPLES_KEY) or [])
    if plan.tuned_artifact is None:
      logging.info('OptimizedTransform: no %s output to write, so the input '
                   'pipeline was not tuned.',
                   spec_keys.TUNED_INPUT_PIPELINE_KEY)
      return
    self._tune_after_transform(plan, input_dict, output_dict,
                               exec_properties, time.monotonic() - start,
                               materialized.examples_written(self._pipelines))

  def _plan(self, input_dict: Dict[str, List[types.Artifact]],
            output_dict: Dict[str, List[types.Artifact]],
            exec_properties: Dict[str, Any]) -> _Plan:
    """Checks the output and reads the history before the stock Transform.

    An unwritable output fails here, not after the Transform; also resets
    the state that the stock run fills (its Beam pipelines, the model step
    prepared meanwhile), and resolves the split to tune on.
    """
    tuning = TuningConfig.from_json(exec_properties.get(spec_keys.TUNING_KEY))
    self._pipelines: List[Any] = []
    self._model_step: Optional[consumer_lib.ModelStep] = None
    self._model_prepare: Optional[_Background] = None
    self._model_note = ''
    self._wants_model = False
    if not output_dict.get(spec_keys.TUNED_INPUT_PIPELINE_KEY):
      return _Plan(tuning, None)
    tuned_artifact = artifact_utils.get_single_instance(
        output_dict[spec_keys.TUNED_INPUT_PIPELINE_KEY])
    storage.check_writable(tuned_artifact.uri, 'tuned_input_pipeline output')
    split, not_tuned = tuning_inputs.split_to_tune(
        tuning, input_dict, output_dict, exec_properties)
    if not_tuned:
      return _Plan(tuning, tuned_artifact, not_tuned=not_tuned)
    tuning = dataclasses.replace(tuning, tune_split=split)
    batch = tuning.measure_batch_size
    plan = _Plan(tuning, tuned_artifact)
    training = history.previous_training(pipeline_layout.pipeline_root(
        self._context and self._context.executor_output_uri,
        tuned_artifact.uri))
    if training is not None and training.reader_batch != batch:
      plan.mismatches.append(
          f'the previous training ({training.uri}) read batches of '
          f'{training.reader_batch}, the tuning measures at {batch}')
    if tuning.early_stop and training is not None:
      if training.reader_batch == batch:
        plan.consumer = tuner.ConsumerRate(
            training.examples_per_sec,
            f"the previous run's training rate, {training.uri}", batch)
      else:
        plan.notes.append('The previous training read another batch: its '
                          'rate was not used for the consumer.')
    self._wants_model = tuning.early_stop and plan.consumer is None
    return plan

  def _tune_after_transform(self, plan: _Plan,
                            input_dict: Dict[str, List[types.Artifact]],
                            output_dict: Dict[str, List[types.Artifact]],
                            exec_properties: Dict[str, Any],
                            transform_seconds: float,
                            examples_written: Dict[str, int]) -> None:
    """Measures, tunes and writes the artifact, from the Transform's outputs.

    Args:
      examples_written: Transformed-examples output path -> examples (the
        sharded write's Beam counters).
    """
    tuning, tuned_artifact = plan.tuning, plan.tuned_artifact
    if plan.not_tuned:
      artifact_lib.write_not_tuned(tuned_artifact, plan.not_tuned,
                                   transform_seconds)
      return
    notes = plan.notes
    consumer: Any = plan.consumer
    # The tuning budget counts from here.
    budget_start = time.monotonic()
    if self._wants_model:
      consumer = self._consumer(tuning.measure_batch_size,
                                tuning.measure_seconds, notes)
    elif not tuning.early_stop:
      notes.append('early_stop is off: the consumer was not measured.')
    waited_seconds = time.monotonic() - budget_start

    data = _tuning_data(tuning, input_dict, output_dict, exec_properties,
                        examples_written)
    previous = _previous_tuning(tuning, tuned_artifact.uri, data.key, notes)
    result = tuner.tune(
        tuning, data.feature_spec,
        materialized_patterns=data.materialized_patterns,
        transform_graph_uri=data.transform_graph_uri,
        raw_file_patterns=data.raw_patterns,
        num_examples=data.num_examples,
        references=data.references,
        consumer=consumer,
        previous=previous,
        notes=notes,
        batch_mismatches=plan.mismatches,
        clock_start=budget_start)
    tuned_seconds = time.monotonic() - budget_start
    tuned_artifact.set_float_custom_property('transform_seconds',
                                             transform_seconds)
    history.write_fingerprint(tuned_artifact.uri, data.key, {
        'examples_per_sec': result.chosen.examples_per_sec,
        'decision': result.decision})
    artifact_lib.write(tuned_artifact, result, self._report_context(
        tuning, bool(data.transformed), examples_written, transform_seconds,
        waited_seconds, tuned_seconds))
    after = time.monotonic() - budget_start
    tuned_artifact.set_float_custom_property('after_transform_seconds', after)
    logging.info('OptimizedTransform: Transform %.1f s, then %.1f s (%s); '
                 'chosen %s', transform_seconds, after, result.decision,
                 result.config.to_json())

  def _report_context(self, tuning: TuningConfig, has_materialized: bool,
                      examples_written: Dict[str, int],
                      transform_seconds: float, waited_seconds: float,
                      tuned_seconds: float) -> Dict[str, str]:
    """The report's rows on the Transform and on the time after it."""
    return {
        'stock Transform seconds (inside this step, sharded Beam write '
        'included)': f'{transform_seconds:.1f}',
        'materialized files per split': (
            (f'{tuning.num_output_shards}, more where a shard would exceed '
             f'{tuning.max_shard_mb:g} MB of raw examples'
             if tuning.num_output_shards else 'as the Beam runner wrote them')
            if has_materialized else 'none'),
        'examples per split (Beam counter)': ', '.join(
            f'{os.path.basename(os.path.dirname(path))}: {n:,}'
            for path, n in sorted(examples_written.items())
        ) or 'not counted',
        'model step prepared while Beam ran (s)': (
            f'{self._model_step.prepare_seconds:.1f}' + (
                '; traced again on the real batch'
                if self._model_step.retraced else '')
            if self._model_step else 'no'),
        'seconds after the stock Transform': (
            f'{waited_seconds:.2f} waiting for the model step, '
            f'{tuned_seconds - waited_seconds:.2f} measuring and deciding, '
            'then the report (total: the custom property '
            'after_transform_seconds)'),
    }

  def _consumer(self, batch: int, seconds: float,
                notes: List[str]) -> Optional[tuner.ConsumerFn]:
    """The measuring function of the prepared model step, or None (noted)."""
    if self._model_prepare is None:
      notes.append(self._model_note or 'The module was not loaded, so the '
                   'consumer was not measured; searching as before.')
      return None
    try:
      step = self._model_prepare.result(_PREPARE_JOIN_S)
    except Exception as e:  # pylint: disable=broad-except
      notes.append(f'Building the model for the consumer failed '
                   f'({type(e).__name__}: {e}); searching as before.')
      return None

    def measure(sample):
      rate = step.rate(sample, seconds)
      return tuner.ConsumerRate(
          rate, 'the model\'s training step (build_model, default hparams, '
          'one device)', batch)
    return measure



@dataclasses.dataclass
class _TuningData:
  """What the tuner reads: the tuned split's files, size and features."""
  feature_spec: Dict[str, Any]
  transform_graph_uri: str
  # The materialized tf.Example TFRecords, or None (not TFRecord inputs).
  transformed: Optional[List[types.Artifact]]
  # The tuned split's examples by the sharded write's counter, or None.
  num_examples: Optional[int]
  materialized_patterns: Optional[List[str]]
  raw_patterns: Optional[Dict[str, List[str]]]
  references: Dict[str, tuner.DatasetFn]
  # What the tuning is valid for (`history.tuning_key`).
  key: Dict[str, Any]


def _tuning_data(tuning: TuningConfig,
                 input_dict: Dict[str, List[types.Artifact]],
                 output_dict: Dict[str, List[types.Artifact]],
                 exec_properties: Dict[str, Any],
                 examples_written: Dict[str, int]) -> _TuningData:
  """The Transform's inputs and outputs, as the tuner reads them."""
  batch = tuning.measure_batch_size
  splits_config = executor_utils.ResolveSplitsConfig(
      exec_properties.get(standard_component_specs.SPLITS_CONFIG_KEY),
      input_dict[standard_component_specs.EXAMPLES_KEY])
  examples = input_dict[standard_component_specs.EXAMPLES_KEY]
  # From TFRecord inputs, Transform materializes tf.Example TFRecords.
  transformed = (
      output_dict.get(standard_component_specs.TRANSFORMED_EXAMPLES_KEY)
      if tuning_inputs.are_tfrecords(examples) else None)
  num_examples = (materialized.split_count(examples_written, transformed,
                                           tuning.tune_split)
                  if transformed else None)

  transform_graph_uri = artifact_utils.get_single_uri(
      output_dict[standard_component_specs.TRANSFORM_GRAPH_KEY])
  tft_output = tft.TFTransformOutput(transform_graph_uri)
  feature_spec = tft_output.transformed_feature_spec()
  materialized_patterns = (
      tuning_inputs.split_patterns(transformed, tuning.tune_split)
      if transformed else None)
  raw_patterns = ({split: tuning_inputs.split_patterns(examples, split)
                   for split in splits_config.transform}
                  if tuning_inputs.are_tfrecords(
                      examples, tuning_inputs.TF_EXAMPLE) else None)
  references = ({artifact_lib.STOCK_READER: _stock_reader(
      materialized_patterns, tft_output.transformed_metadata.schema, batch)}
                if materialized_patterns else {})
  key = history.tuning_key(
      feature_spec, num_examples if num_examples is not None else
      _estimated_examples(materialized_patterns or (raw_patterns or {}).get(
          tuning.tune_split)), tuning.tune_split, batch)
  return _TuningData(feature_spec, transform_graph_uri, transformed,
                     num_examples, materialized_patterns, raw_patterns,
                     references, key)


def _previous_tuning(tuning: TuningConfig, tuned_uri: str,
                     key: Dict[str, Any],
                     notes: List[str]) -> Optional[tuner.Previous]:
  """This node's previous tuning where `reuse` is on and it still holds;
  why it does not, in `notes`."""
  if not tuning.reuse:
    return None
  found = history.previous_tuning(tuned_uri, key)
  if found is not None and found.config is not None:
    return tuner.Previous(found.config, found.reason)
  if found is not None:
    notes.append(f'Previous tuning {found.reason}.')
  return None


def _estimated_examples(patterns: Optional[List[str]]) -> Optional[int]:
  """Examples in the files (estimated from the first one), None if none.

  Deterministic for the same files, so it tells an unchanged volume too.
  Read as the tuner reads them: this executor leaves its compression at the
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
                  batch_size: int) -> tuner.DatasetFn:
  """The reader TFX's `data_accessor.tf_dataset_factory` builds (defaults)."""
  return lambda: tfxio.TFExampleRecord(
      file_pattern=patterns, schema=schema).TensorFlowDataset(
          tfxio.TensorFlowDatasetOptions(batch_size=batch_size))
