"""OptimizedTransform's tuning as a step: planned before the stock Transform,
run on what it wrote. Records in, records out, so that the executor only
wires TFX's dicts to it (`tuning_inputs`) and writes the result
(`artifact`); no TFX import."""

import dataclasses
import os
import time
from typing import Any, Dict, List, Optional, Tuple

from components.transform.config import TuningConfig
from components.transform import history
from components.transform import model_preparation
from components.transform.model_preparation import ModelPreparation
from components.transform import tuner
from components.transform.results import ConsumerRate, DatasetFn, TuningResult


@dataclasses.dataclass(frozen=True)
class Plan:
  """What the tuning decided before the stock Transform ran."""
  # With `tune_split` resolved, where there is a split to tune on.
  tuning: TuningConfig
  # This execution's TunedInputPipeline folder (earlier ones beside it).
  tuned_uri: str
  # The previous training's rate; None: measure the model, or search.
  consumer: Optional[ConsumerRate] = None
  notes: Tuple[str, ...] = ()
  mismatches: Tuple[str, ...] = ()
  # Why there is nothing to tune on (the artifact then holds the default
  # pipeline), or None.
  not_tuned: Optional[str] = None

  @property
  def measures_model(self) -> bool:
    """Whether the consumer is the module's model step, prepared while the
    stock Transform runs (`ModelPreparation`)."""
    return (self.not_tuned is None and self.tuning.early_stop and
            self.consumer is None)

  @classmethod
  def from_previous_training(cls, tuning: TuningConfig, tuned_uri: str,
                             training: Optional[history.PreviousTraining]
                            ) -> 'Plan':
    """The plan for tuning `tuning.tune_split`, given the previous
    training."""
    batch = tuning.measure_batch_size
    consumer, notes, mismatches = None, [], []
    if training is not None and training.reader_batch != batch:
      mismatches.append(
          f'the previous training ({training.uri}) read batches of '
          f'{training.reader_batch}, the tuning measures at {batch}')
    if tuning.early_stop and training is not None:
      if training.reader_batch == batch:
        consumer = ConsumerRate(
            training.examples_per_sec,
            f"the previous run's training rate, {training.uri}", batch)
      else:
        notes.append('The previous training read another batch: its rate '
                     'was not used for the consumer.')
    return cls(tuning, tuned_uri, consumer, tuple(notes), tuple(mismatches))


@dataclasses.dataclass(frozen=True)
class StockTransform:
  """What the stock Transform's run left for the tuning."""
  seconds: float
  # Transformed-examples output path -> examples (the sharded write's Beam
  # counters).
  examples_written: Dict[str, int]
  # `time.monotonic()` when its outputs were complete: the tuning's budget
  # counts from there.
  finished: float
  # The model step prepared while it ran; None where the plan measures no
  # model, or the module was not loaded.
  model: Optional[ModelPreparation] = None


@dataclasses.dataclass(frozen=True)
class TransformedData:
  """What the tuner reads: the tuned split's files, size and features."""
  feature_spec: Dict[str, Any]
  transform_graph_uri: str
  # Whether the Transform materialized tf.Example TFRecords.
  materialized: bool
  # The tuned split's examples by the sharded write's counter, or None.
  num_examples: Optional[int]
  materialized_patterns: Optional[List[str]]
  raw_patterns: Optional[Dict[str, List[str]]]
  references: Dict[str, DatasetFn]
  # What the tuning is valid for (`history.tuning_key`).
  key: Dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Tuned:
  """What the tuning writes into the TunedInputPipeline (`artifact`)."""
  result: TuningResult
  # What it was tuned on (`history.tuning_key`), for the next run.
  key: Dict[str, Any]
  # The report's rows on the Transform and on the time after it.
  report_rows: Dict[str, str]
  transform_seconds: float
  # `time.monotonic()` the tuning's budget counted from.
  started: float


def tune(plan: Plan, stock: StockTransform,
         data: TransformedData) -> Tuned:
  """Weighs the consumer, finds the previous tuning and tunes on `data`."""
  tuning = plan.tuning
  notes = list(plan.notes)
  consumer: Any = plan.consumer
  waiting = time.monotonic()
  if plan.measures_model:
    consumer, why_not = model_preparation.consumer(
        stock.model, tuning.measure_batch_size, tuning.measure_seconds)
    if why_not:
      notes.append(why_not)
  elif not tuning.early_stop:
    notes.append('early_stop is off: the consumer was not measured.')
  waited_seconds = time.monotonic() - waiting
  previous = _previous_tuning(tuning, plan.tuned_uri, data.key, notes)
  result = tuner.tune(tuner.TuningInputs(
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
      clock_start=stock.finished))
  tuned_seconds = time.monotonic() - stock.finished
  return Tuned(result, data.key, _report_rows(
      tuning, data.materialized, stock, waited_seconds, tuned_seconds),
               stock.seconds, stock.finished)


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


def _report_rows(tuning: TuningConfig, materialized: bool,
                 stock: StockTransform, waited_seconds: float,
                 tuned_seconds: float) -> Dict[str, str]:
  """The report's rows on the Transform and on the time after it."""
  step = stock.model and stock.model.step
  return {
      'stock Transform seconds (inside this step, sharded Beam write '
      'included)': f'{stock.seconds:.1f}',
      'materialized files per split': (
          (f'{tuning.num_output_shards}, more where a shard would exceed '
           f'{tuning.max_shard_mb:g} MB of raw examples'
           if tuning.num_output_shards else 'as the Beam runner wrote them')
          if materialized else 'none'),
      'examples per split (Beam counter)': ', '.join(
          f'{os.path.basename(os.path.dirname(path))}: {n:,}'
          for path, n in sorted(stock.examples_written.items())
      ) or 'not counted',
      'model step prepared while Beam ran (s)': (
          f'{step.prepare_seconds:.1f}' + (
              '; traced again on the real batch' if step.retraced else '')
          if step else 'no'),
      'seconds after the stock Transform': (
          f'{waited_seconds:.2f} waiting for the model step, '
          f'{tuned_seconds - waited_seconds:.2f} measuring and deciding, '
          'then the report (total: the custom property '
          'after_transform_seconds)'),
  }
