"""The PartitionPlan artifact's format, shared by its writer and its reader.

GPipePartitioner writes `plan.json`; HighPerfTrainer's pipeline-parallel
runtime reads it and checks that the model it builds is the one the plan was
made for. No TensorFlow import.
"""

from typing import Any, Dict, Sequence

from components.pipeline_parallel import schedules

PLAN_FILE = 'plan.json'


def check_layer_signature(plan: Dict[str, Any],
                          class_names: Sequence[str]) -> None:
  """Fails unless the plan was made for a model with these layer calls."""
  expected = plan['layer_signature']
  if list(class_names) != list(expected):
    raise ValueError(
        f'the partition plan was made for a model with {len(expected)} layer '
        f'calls {expected}, but this model has {len(class_names)}: '
        f'{list(class_names)}. Build the model with the same module and '
        'hparams as the GPipePartitioner.')


def plan_schedule(plan: Dict[str, Any]) -> str:
  """The plan's schedule; plans written before it was a field are GPipe."""
  schedule = plan.get('schedule', schedules.GPIPE)
  if schedule not in schedules.SCHEDULES:
    raise ValueError(f'the partition plan has schedule {schedule!r}; this '
                     f'runtime runs {schedules.SCHEDULES}.')
  return schedule


def plan_replicas(plan: Dict[str, Any]) -> int:
  """Copies of the pipeline that split each mini-batch (data x pipeline)."""
  replicas = plan.get('data_parallel_replicas', 1)
  if not isinstance(replicas, int) or isinstance(replicas, bool) or (
      replicas < 1):
    raise ValueError('the partition plan has data_parallel_replicas '
                     f'{replicas!r}; it must be a positive int.')
  return replicas


def num_devices(plan: Dict[str, Any]) -> int:
  """Devices the plan runs on: a device per stage of each pipeline copy."""
  return plan['num_stages'] * plan_replicas(plan)
