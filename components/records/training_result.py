"""What a HighPerfTrainer training left in model_run, one writer per file.

`training_result.json`: the training's numbers (steps, rate, batch,
replicas, resume events, timing), written once by the chief training process
(`write`). `launch.json`: how the executor ran the processes (launcher,
attempts, relaunches and their causes, membership changes, the executor's
own timing), written once by the executor (`write_launch`). `read` and
`read_launch` are the readers and check the format version. Readers outside
the trainer read the newest training's rate, which the trainer's executor
publishes under the pipeline root (`publish_steady_rate`,
`newest_steady_rate`), instead of searching its folders. No TFX import.
"""

import dataclasses
import os
from typing import Any, Dict, Optional

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


def write(model_run_dir: str, result: Dict[str, Any]) -> None:
  """Writes `result` (JSON values) with the format version."""
  storage.write_json(path(model_run_dir),
                     {**result, VERSION_KEY: FORMAT_VERSION})


def write_launch(model_run_dir: str, launch: Dict[str, Any]) -> None:
  """Writes the executor's `launch` record (JSON values)."""
  storage.write_json(os.path.join(model_run_dir, LAUNCH_FILE_NAME),
                     {**launch, VERSION_KEY: FORMAT_VERSION})


def read_launch(model_run_dir: str) -> Optional[Dict[str, Any]]:
  """The launch record of `model_run_dir`; None where there is none."""
  return _read_versioned(os.path.join(model_run_dir, LAUNCH_FILE_NAME))


def read(model_run_dir: str) -> Optional[Dict[str, Any]]:
  """The training result of `model_run_dir`; None where there is none.

  Raises:
    FormatError: Not a JSON object, or of another format version.
  """
  return _read_versioned(path(model_run_dir))


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


def steady_rate(result: Dict[str, Any],
                model_run_dir: str) -> Optional[SteadyRate]:
  """The rate of a result that has one (a managed-loop training)."""
  rate = result.get('examples_per_sec')
  batch = result.get('global_batch_size')
  if not (isinstance(rate, (int, float)) and rate > 0 and
          isinstance(batch, int)):
    return None
  per_step = result.get('examples_per_step') or batch * int(
      result.get('gradient_accumulation_steps') or 1)
  replicas = max(int(result.get('num_replicas') or 1), 1)
  return SteadyRate(float(rate), int(per_step) // replicas, model_run_dir)


def publish_steady_rate(pipeline_root: str, result: Dict[str, Any],
                        model_run_dir: str) -> None:
  """Makes a managed training's rate the pipeline's newest (STEADY_RATE_PATH
  under the pipeline root), for the next OptimizedTransform; a result
  without a steady rate leaves the last one."""
  rate = steady_rate(result, model_run_dir)
  if rate:
    storage.write_json(os.path.join(pipeline_root, STEADY_RATE_PATH),
                       {**dataclasses.asdict(rate),
                        VERSION_KEY: FORMAT_VERSION})


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
