"""GPipePartitioner configuration: one JSON-serializable dataclass.

Validation lives here (no TFX, no TensorFlow) so that the component rejects
bad parameters at construction and the executor, the planner and the tests all
share one definition of what is allowed.
"""

import dataclasses
from typing import Any, Dict, Optional, Union

from components.json_config import JsonConfig, check_json_values, is_int
from components.pipeline_parallel import schedules
from components.records.partition_plan import REMAT_MODES

AUTO = 'auto'
SCHEDULE_OPTIONS = (*schedules.SCHEDULES, AUTO)


@dataclasses.dataclass(frozen=True)
class PartitionerConfig(JsonConfig):
  """What to plan: stage and micro-batch counts, schedule, pipeline copies,
  memory budget, remat.

  Attributes:
    batch_size: training mini-batch size; it is split into
      `data_parallel_replicas` x `num_microbatches` micro-batches of equal
      size, so they must divide it.
    num_stages: pipeline stages, or 'auto' for one per available device
      (divided among the data_parallel_replicas copies).
    num_microbatches: micro-batches per mini-batch, or 'auto': the divisor
      of `batch_size` that, with the schedule, gives the shortest predicted
      step (compute + bubble, from the profile) within the memory budget.
    schedule: the pipeline schedule: 'gpipe' (all forwards, then all
      backwards; M micro-batches in flight per stage), '1f1b'
      (PipeDream-Flush; at most K-s in flight on stage s, the same bubble
      and gradients) or 'auto' (chosen with num_microbatches; equal
      predicted steps go to the lower peak memory).
    data_parallel_replicas: copies R of the K-stage pipeline, on R x K
      devices, each on its own 1/R of the mini-batch, gradients summed
      across the copies before the one update.
    memory_budget_bytes: per-device memory budget; None means unlimited.
    remat: 'always' recomputes every micro-batch's stage activations in the
      backward pass, 'except_last' all but those whose backward directly
      follows their forward on the stage (GPipe: the last micro-batch;
      1F1B: every micro-batch of the last stage), 'never' stores all of
      them.
    offload_activations: keep the stored stage inputs (remat checkpoints) in
      host memory between the forward and the backward pass.
    measure_schedule: after planning, run one traced step of the plan on
      R x K devices in a fresh process (`measure`) and put the measured
      schedule and idle fraction beside the simulated ones in the plan and
      its report.
    profile_repeats: timed repeats per layer; the profile keeps the median.
    hparams: passed to the module's `build_model(hparams)`; must match the
      trainer's, since the plan is checked against the built model.
    sample_split: split of the transformed examples for the sample batch.
  """
  batch_size: int
  num_stages: Union[int, str] = AUTO
  num_microbatches: Union[int, str] = AUTO
  schedule: str = AUTO
  data_parallel_replicas: int = 1
  memory_budget_bytes: Optional[int] = None
  remat: str = 'except_last'
  offload_activations: bool = False
  measure_schedule: bool = False
  profile_repeats: int = 5
  hparams: Dict[str, Any] = dataclasses.field(default_factory=dict)
  sample_split: str = 'train'
  OPTIONS_NAME = 'GPipePartitioner config'

  def validate(self) -> 'PartitionerConfig':
    """Raises ValueError naming the bad value and what is allowed."""
    _check_positive_int_or_auto('num_stages', self.num_stages)
    _check_positive_int_or_auto('num_microbatches', self.num_microbatches)
    if not is_int(self.batch_size) or self.batch_size < 1:
      raise ValueError(
          f'batch_size must be a positive int, got {self.batch_size!r}.')
    if (not is_int(self.data_parallel_replicas) or
        self.data_parallel_replicas < 1):
      raise ValueError('data_parallel_replicas must be a positive int, got '
                       f'{self.data_parallel_replicas!r}.')
    if self.batch_size % self.data_parallel_replicas:
      raise ValueError(
          f'batch_size {self.batch_size} is not divisible by '
          f'data_parallel_replicas {self.data_parallel_replicas}; every copy '
          'of the pipeline gets an equal share.')
    share = self.replica_batch_size
    if is_int(self.num_microbatches) and share % self.num_microbatches:
      raise ValueError(
          f'batch_size {self.batch_size} is not divisible by num_microbatches '
          f'{self.num_microbatches}'
          + (f' x data_parallel_replicas {self.data_parallel_replicas}'
             if self.data_parallel_replicas > 1 else '') +
          '; micro-batches must have equal size. Divisors of '
          f'{share}: {_divisors(share)}.')
    if self.memory_budget_bytes is not None and (
        not is_int(self.memory_budget_bytes) or
        self.memory_budget_bytes <= 0):
      raise ValueError('memory_budget_bytes must be a positive int or None, '
                       f'got {self.memory_budget_bytes!r}.')
    if self.schedule not in SCHEDULE_OPTIONS:
      raise ValueError(f'schedule must be one of {SCHEDULE_OPTIONS}, got '
                       f'{self.schedule!r}.')
    if self.remat not in REMAT_MODES:
      raise ValueError(
          f'remat must be one of {REMAT_MODES}, got {self.remat!r}.')
    if not isinstance(self.offload_activations, bool):
      raise ValueError('offload_activations must be a bool, got '
                       f'{self.offload_activations!r}.')
    if self.offload_activations and self.remat == 'never':
      raise ValueError(
          "offload_activations moves the remat checkpoints to host memory, "
          "so it needs remat 'always' or 'except_last', got remat='never'.")
    if not isinstance(self.measure_schedule, bool):
      raise ValueError('measure_schedule must be a bool, got '
                       f'{self.measure_schedule!r}.')
    if not is_int(self.profile_repeats) or self.profile_repeats < 1:
      raise ValueError('profile_repeats must be a positive int, got '
                       f'{self.profile_repeats!r}.')
    if not isinstance(self.hparams, dict):
      raise ValueError(f'hparams must be a dict, got {self.hparams!r}.')
    check_json_values('hparams', self.hparams)
    if not isinstance(self.sample_split, str) or not self.sample_split:
      raise ValueError('sample_split must be a split name, got '
                       f'{self.sample_split!r}.')
    return self

  def validate_for_model(self, num_layers: int) -> None:
    """Checks the stage count against the model's partitionable layers."""
    if is_int(self.num_stages) and self.num_stages > num_layers:
      raise ValueError(
          f'num_stages {self.num_stages} exceeds the {num_layers} '
          'partitionable layers of the model; every stage needs at least one '
          f'layer, so use num_stages <= {num_layers}.')

  @property
  def replica_batch_size(self) -> int:
    """Examples per copy of the pipeline and mini-batch."""
    return self.batch_size // self.data_parallel_replicas

  def resolve_num_stages(self, available_devices: int, num_layers: int) -> int:
    """Stage count: the configured one, or one per device of a pipeline copy
    (at most one per layer)."""
    self.validate_for_model(num_layers)
    if is_int(self.num_stages):
      return self.num_stages
    return max(1, min(available_devices // self.data_parallel_replicas,
                      num_layers))

  def microbatch_counts(self):
    """The micro-batch counts to plan for: the configured one, or every
    divisor of a pipeline copy's batch ('auto')."""
    if is_int(self.num_microbatches):
      return [self.num_microbatches]
    return _divisors(self.replica_batch_size)

  def schedule_names(self):
    """The schedules to plan for: the configured one, or both ('auto')."""
    return (list(schedules.SCHEDULES) if self.schedule == AUTO else
            [self.schedule])

  @classmethod
  def from_dict(cls, values) -> 'PartitionerConfig':
    """Builds and validates; unknown keys are an error, not ignored."""
    if isinstance(values, dict) and 'batch_size' not in values:
      raise ValueError('config needs batch_size (the training mini-batch '
                       'size).')
    return super().from_dict(values)


def _check_positive_int_or_auto(name: str, value) -> None:
  if value == AUTO:
    return
  if not is_int(value) or value < 1:
    raise ValueError(
        f"{name} must be a positive int or '{AUTO}', got {value!r}.")


def _divisors(n: int):
  return [d for d in range(1, n + 1) if n % d == 0]
