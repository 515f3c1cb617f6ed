"""What a HighPerfTrainer training left in model_run, one writer per file.

`training_result.json`: a `TrainingResult`, what the chief training process
reports of itself and of the task as it resolved it, with the managed loop's
`LoopReport` (steps, rate, resume events, timing), written once by the chief
(`write`). `launch.json`: how the executor ran the processes (launcher,
attempts, relaunches and their causes, membership changes, the executor's
own timing), written once by the executor (`write_launch`). `read` and
`read_launch` are the readers and check the format version; `read` gives the
typed `TrainingResult` back. Fields marked `_mlmd` are what the trainer
records on its ModelRun artifact (`mlmd_properties`). Readers outside
the trainer read the newest training's rate, which the trainer's executor
publishes under the pipeline root (`publish_steady_rate`,
`newest_steady_rate`), instead of searching its folders. No TFX import.
"""

import dataclasses
import json
import math
import os
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import tensorflow as tf

from components import storage

FILE_NAME = 'training_result.json'
LAUNCH_FILE_NAME = 'launch.json'
# Under the pipeline root: the newest managed training's steady rate.
STEADY_RATE_PATH = '_hpm_records/steady_rate.json'
VERSION_KEY = 'format_version'
# 1: the flat result dict. Files written before the version was recorded
# have the same format and no VERSION_KEY.
FORMAT_VERSION = 1


class FormatError(ValueError):
  """A training result this code cannot read."""


def path(model_run_dir: str) -> str:
  return os.path.join(model_run_dir, FILE_NAME)


# Where a field goes on the ModelRun artifact: an int, a finite float, or a
# JSON string (set only where not empty), under the field's name unless
# `name` says another.
_MLMD_KEY = 'mlmd'
INT, FLOAT, JSON, STRING = 'int', 'float', 'json', 'string'


def _mlmd(kind: str, name: str = '', **field_args):
  return dataclasses.field(metadata={_MLMD_KEY: (kind, name)}, **field_args)


MlmdValue = Union[int, float, str]


def _mlmd_properties(record) -> Iterator[Tuple[str, MlmdValue]]:
  """(property, value) of `record`'s `_mlmd` fields that have a value of
  their kind: MLMD's SQLite refuses NaN (an attempt that resumed at its last
  step has no loss), and an empty JSON value says nothing."""
  for field in dataclasses.fields(record):
    if _MLMD_KEY not in field.metadata:
      continue
    kind, name = field.metadata[_MLMD_KEY]
    value = _json_value(getattr(record, field.name))
    name = name or field.name
    if kind == INT and isinstance(value, int) and not isinstance(value, bool):
      yield name, value
    elif kind == FLOAT and isinstance(value, (int, float)) and math.isfinite(
        value):
      yield name, float(value)
    elif kind == JSON and value:
      yield name, json.dumps(value, sort_keys=True)
    elif kind == STRING and isinstance(value, str):
      yield name, value


@dataclasses.dataclass(frozen=True)
class LoopReport:
  """What the managed loop reports of its attempt: the steps and their rate,
  and what it chose, checked and saved on the way (the file's keys)."""
  # The step reached (a preempted attempt's: where it saved), where this
  # attempt started, and how many it ran.
  steps: int
  start_step: int
  steps_this_attempt: int
  # The last call's mean loss; NaN where the attempt ran no step.
  train_loss: float = _mlmd(FLOAT)
  preempted: bool
  # The steady rate: after the first call (which traces), unless that call
  # was all there was (`rate_includes_first_step`).
  examples_per_sec: float = _mlmd(FLOAT)
  rate_includes_first_step: bool
  # Seconds from the loop's start to the first call's end, and the wall
  # clock (time.time) then.
  first_step_s: Optional[float]
  first_step_time: Optional[float]
  # Steps per call: the length chosen (None while 'auto' still measures),
  # and the steps run at each length ('length': steps).
  steps_per_execution: Optional[int] = _mlmd(INT)
  steps_by_call_length: Dict[str, int] = _mlmd(JSON)
  # This attempt's accumulation, and the examples of one optimizer update.
  gradient_accumulation_steps: int
  examples_per_step: int
  # The dtype policy and the XLA setting, who chose them and why.
  precision: Dict[str, Any] = _mlmd(JSON)
  xla: Dict[str, Any] = _mlmd(JSON)
  eval: Dict[str, float]
  exported: bool
  serving_model_dir: Optional[str]
  checkpoint_dir: str
  checkpoints_saved: int
  checkpoint_s: float
  resume_events: List[Dict[str, Any]]
  warm_start: Optional[Dict[str, Any]] = _mlmd(JSON)
  # Each split's shard index, the data order trained in (None: no index,
  # or parameter servers), the input pipeline config the reader ran (the
  # tuned one, its cache as it fit), why the memory cache fell back, and the
  # damaged files' skipped records.
  shard_index: Dict[str, Any]
  data_order: Optional[Dict[str, Any]]
  input_pipeline: Dict[str, Any]
  cache_fallback: Optional[str]
  unreadable_records: List[Dict[str, Any]] = _mlmd(JSON)
  # The GPipe stages' shape; None without a partition plan.
  pipeline_parallel: Optional[Dict[str, Any]]
  # The cells that served the partitions (`offload`): their config, the
  # `auto` choice, each cell's address, every start, loss and move, and
  # where each partition ended; None where the trainer read them itself.
  offload: Optional[Dict[str, Any]] = _mlmd(JSON)
  wall_s: float
  # Seconds of each part outside the steps, so that the component's fixed
  # cost can be told apart.
  timing: Dict[str, Optional[float]]
  # 'auto' only (left out of the file otherwise): each length it chose, and
  # the comparison training ended in.
  steps_per_execution_auto: Optional[List[Dict[str, Any]]] = _mlmd(
      JSON, default=None)
  steps_per_execution_auto_pending: Optional[Dict[str, Any]] = _mlmd(
      JSON, default=None)

  @classmethod
  def of_steps(cls, summary: Mapping[str, Any],
               call_lengths: Mapping[str, Any], *, examples_per_step: int,
               timing: Mapping[str, float], **facts) -> 'LoopReport':
    """The report of the loop's step summary (`driver.StepStats.summary`:
    its steps a second become examples a second), its call lengths
    (`CallSizer.describe`) and the other `facts`; `timing` gains the first
    call's seconds."""
    steps = dict(summary)
    steps_per_sec = steps.pop('steps_per_sec')
    return cls(**steps, **call_lengths,
               examples_per_sec=round(steps_per_sec * examples_per_step, 2),
               examples_per_step=examples_per_step,
               timing={**timing, 'first_call_s': summary['first_step_s']},
               **facts)

  def to_dict(self) -> Dict[str, Any]:
    """The report's keys as JSON values."""
    report = _json_fields(self)
    for key in ('steps_per_execution_auto', 'steps_per_execution_auto_pending'):
      if report[key] is None:
        del report[key]
    return report


@dataclasses.dataclass(frozen=True)
class TrainingResult:
  """training_result.json: what the chief training process reports of
  itself and of the task as it resolved it, and in managed mode the loop's
  report, whose keys the file holds beside these."""
  mode: str = _mlmd(STRING, 'training_mode')  # 'managed' or 'run_fn'.
  # The strategy's registry name ('one_device', 'multi_worker_mirrored').
  strategy: str
  # The step reached; run_fn mode: the train steps it was asked for.
  steps: Optional[int]
  num_replicas: int = _mlmd(INT)
  num_workers: int = _mlmd(INT)
  per_replica_batch_size: int
  global_batch_size: int = _mlmd(INT)
  train_steps: int = _mlmd(INT)
  eval_steps: int
  seed: Optional[int]
  deterministic: bool
  # The op pool the process got, and why (`cpu_threads.configure`).
  intra_op_threads: Dict[str, Any] = _mlmd(JSON)
  # Seconds from the end of the set-up to the end of training (managed:
  # with eval and export).
  train_wall_s: float = _mlmd(FLOAT)
  # The process's fixed cost before training (in the file's `timing`, with
  # the loop's parts): imports (TensorFlow), and the strategy's set-up.
  worker_imports_s: float
  worker_setup_s: float
  # The chief process's peak resident memory, what a machine or pod for
  # this training must hold (None in results written before it was).
  peak_rss_bytes: Optional[int] = _mlmd(INT, default=None)
  loop: Optional[LoopReport] = None

  @property
  def preempted(self) -> bool:
    """Training stopped at a checkpoint after a preemption notice."""
    return bool(self.loop and self.loop.preempted)

  @property
  def resume_events(self) -> List[Dict[str, Any]]:
    """Where training resumed, and what each crash cost (none in run_fn
    mode, which checkpoints itself)."""
    return self.loop.resume_events if self.loop else []

  @property
  def timing(self) -> Dict[str, Optional[float]]:
    """Seconds of each part outside the steps: the process's, the loop's."""
    return {'worker_imports_s': self.worker_imports_s,
            'worker_setup_s': self.worker_setup_s,
            **(self.loop.timing if self.loop else {})}

  def mlmd_properties(self) -> Iterator[Tuple[str, MlmdValue]]:
    """What the ModelRun artifact records of this result: its `_mlmd`
    fields and the loop's, each as its MLMD value."""
    yield from _mlmd_properties(self)
    if self.loop:
      yield from _mlmd_properties(self.loop)

  def to_dict(self) -> Dict[str, Any]:
    """The file's keys (the loop's report's among them) as JSON values."""
    loop = self.loop.to_dict() if self.loop else {}
    own = _json_fields(self, leave_out='loop')
    del own['worker_imports_s'], own['worker_setup_s']
    return {**loop, **own, 'timing': _json_value(self.timing)}

  @classmethod
  def from_dict(cls, values: Mapping[str, Any]) -> 'TrainingResult':
    """The result of the file's keys (`to_dict`'s).

    Raises:
      FormatError: A key of the result is missing, or one is not the
        result's.
    """
    unknown = set(values) - _FILE_KEYS
    if unknown:
      raise FormatError(f'A training result with keys {sorted(unknown)}, '
                        f'which format version {FORMAT_VERSION} does not '
                        'have.')
    timing = dict(values.get('timing') or {})
    process_timing = {name: timing.pop(name, None)
                      for name in ('worker_imports_s', 'worker_setup_s')}
    loop = None
    if values.get('mode') == 'managed':
      loop = LoopReport(**_fields_of(LoopReport, {**values, 'timing': timing}))
    return cls(**_fields_of(cls, {**values, **process_timing},
                            leave_out='loop'), loop=loop)


_FILE_KEYS = frozenset(
    [f.name for f in dataclasses.fields(LoopReport)] +
    [f.name for f in dataclasses.fields(TrainingResult)] + [VERSION_KEY])


def _fields_of(record_type, values: Mapping[str, Any],
               leave_out: str = '') -> Dict[str, Any]:
  """The values of `record_type`'s fields (a field with a default may be
  missing)."""
  fields = [f for f in dataclasses.fields(record_type) if f.name != leave_out]
  missing = [f.name for f in fields if f.name not in values and
             f.default is dataclasses.MISSING]
  if missing:
    raise FormatError(f'A training result without {missing}: not one '
                      f'{record_type.__name__} of format version '
                      f'{FORMAT_VERSION}.')
  return {f.name: values[f.name] for f in fields if f.name in values}


def _json_fields(record, leave_out: str = '') -> Dict[str, Any]:
  """A record's fields (but `leave_out`) as JSON values."""
  return {f.name: _json_value(getattr(record, f.name))
          for f in dataclasses.fields(record) if f.name != leave_out}


def _json_value(value):
  """Numpy and tensor scalars as plain Python, for JSON."""
  if isinstance(value, dict):
    return {k: _json_value(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_json_value(v) for v in value]
  if hasattr(value, 'numpy'):
    value = value.numpy()
  if hasattr(value, 'item'):
    return value.item()
  return value


def write(model_run_dir: str, result: TrainingResult) -> None:
  """Writes `result` with the format version: the file's one writer."""
  storage.write_json(path(model_run_dir),
                     {**result.to_dict(), VERSION_KEY: FORMAT_VERSION})


def write_launch(model_run_dir: str, launch: Dict[str, Any]) -> None:
  """Writes the executor's `launch` record (JSON values)."""
  storage.write_json(os.path.join(model_run_dir, LAUNCH_FILE_NAME),
                     {**launch, VERSION_KEY: FORMAT_VERSION})


def read_launch(model_run_dir: str) -> Optional[Dict[str, Any]]:
  """The launch record of `model_run_dir`; None where there is none."""
  return _read_versioned(os.path.join(model_run_dir, LAUNCH_FILE_NAME))


def read(model_run_dir: str) -> Optional[TrainingResult]:
  """The training result of `model_run_dir`; None where there is none: the
  one reader of the file, for the executor, tests and benchmarks.

  Raises:
    FormatError: Not a JSON object, of another format version, or without
      a key of the result.
  """
  values = _read_versioned(path(model_run_dir))
  return None if values is None else TrainingResult.from_dict(values)


def _read_versioned(file_path: str) -> Optional[Dict[str, Any]]:
  result = storage.read_json(file_path)
  if result is None:
    return None
  version = result.get(VERSION_KEY, 1) if isinstance(result, dict) else None
  if version != FORMAT_VERSION:
    raise FormatError(
        f'{file_path} is not a training result of format version '
        f'{FORMAT_VERSION} (found {VERSION_KEY}={version!r}); it was written '
        'by another tfx-hpm version.')
  return result


@dataclasses.dataclass(frozen=True)
class SteadyRate:
  """A training's steady rate and the batch its input pipeline read."""
  examples_per_sec: float
  # Examples per batch of each replica's input pipeline: the per-replica
  # batch times the gradient-accumulation steps.
  reader_batch: int
  model_run_dir: str


def steady_rate(result: TrainingResult,
                model_run_dir: str) -> Optional[SteadyRate]:
  """The rate of a result that has one (a managed-loop training)."""
  loop = result.loop
  if loop is None or not (math.isfinite(loop.examples_per_sec) and
                          loop.examples_per_sec > 0):
    return None
  replicas = max(result.num_replicas, 1)
  return SteadyRate(float(loop.examples_per_sec),
                    loop.examples_per_step // replicas, model_run_dir)


def publish_steady_rate(pipeline_root: str, rate: SteadyRate) -> None:
  """Makes a managed training's `rate` (`steady_rate`) the pipeline's newest
  (STEADY_RATE_PATH under the pipeline root), for the next
  OptimizedTransform."""
  storage.write_json(os.path.join(pipeline_root, STEADY_RATE_PATH),
                     {**dataclasses.asdict(rate), VERSION_KEY: FORMAT_VERSION})


def newest_steady_rate(pipeline_root: str) -> Optional[SteadyRate]:
  """The rate the pipeline's newest managed training published; None where
  there is none, or where it is of another format."""
  try:
    record = _read_versioned(os.path.join(pipeline_root, STEADY_RATE_PATH))
  except (FormatError, ValueError, tf.errors.OpError):
    return None
  return record and SteadyRate(
      float(record['examples_per_sec']), int(record['reader_batch']),
      record['model_run_dir'])
