"""The PartitionPlan artifact's `plan.json`: written by GPipePartitioner,
read by HighPerfTrainer's pipeline-parallel runtime.

The plan is a JSON object; `PlanRecord` is the typed part of it that the
runtime reads (the partitioner's report reads the rest: costs, predictions,
alternatives). `format_version` is checked: a plan of another version fails
naming both versions. No TensorFlow import (file I/O through
`components.storage` takes it when called).
"""

import dataclasses
import json
import os
from typing import Any, Dict, List, Mapping, Sequence, Tuple, Union

from components.json_config import is_int
from components.pipeline_parallel import schedules

PLAN_FILE = 'plan.json'
# Bump when a field the runtime reads changes meaning; readers refuse others.
PLAN_FORMAT_VERSION = 1
REMAT_MODES = ('always', 'except_last', 'never')


@dataclasses.dataclass(frozen=True)
class PlanRecord:
  """What the pipeline-parallel runtime reads of a plan.

  Attributes:
    num_stages: K, pipeline stages.
    boundaries: K + 1 layer-call indices; stage s runs calls
      boundaries[s]..boundaries[s+1]-1.
    num_microbatches: M, micro-batches per pipeline copy and mini-batch.
    batch_size: the mini-batch the plan was made for.
    remat: 'always', 'except_last' or 'never'.
    offload_activations: stashed stage inputs live in host memory.
    layer_signature: the class names of the model's layer calls, in order:
      the runtime checks the model it builds against them.
    schedule: 'gpipe' or '1f1b' (plans made before the field: 'gpipe').
    data_parallel_replicas: R copies of the pipeline (before the field: 1).
  """
  num_stages: int
  boundaries: Tuple[int, ...]
  num_microbatches: int
  batch_size: int
  remat: str
  offload_activations: bool
  layer_signature: Tuple[str, ...]
  schedule: str = schedules.GPIPE
  data_parallel_replicas: int = 1

  @classmethod
  def from_dict(cls, plan: Union['PlanRecord', Mapping[str, Any]]
                ) -> 'PlanRecord':
    """Checks the format version and the fields the runtime reads."""
    if isinstance(plan, cls):
      return plan
    version = plan.get('format_version')
    if version != PLAN_FORMAT_VERSION:
      raise ValueError(
          f'the partition plan has format_version {version!r}; this runtime '
          f'reads version {PLAN_FORMAT_VERSION}. Make the plan again with '
          'this version of GPipePartitioner.')
    missing = [f.name for f in dataclasses.fields(cls)
               if f.default is dataclasses.MISSING and f.name not in plan]
    if missing:
      raise ValueError(f'the partition plan lacks {missing}.')
    record = cls(
        num_stages=plan['num_stages'],
        boundaries=tuple(plan['boundaries']),
        num_microbatches=plan['num_microbatches'],
        batch_size=plan['batch_size'],
        remat=plan['remat'],
        offload_activations=plan['offload_activations'],
        layer_signature=tuple(plan['layer_signature']),
        schedule=plan.get('schedule', schedules.GPIPE),
        data_parallel_replicas=plan.get('data_parallel_replicas', 1))
    record.validate()
    return record

  def validate(self) -> None:
    """Raises ValueError naming a field this runtime cannot run."""
    if self.schedule not in schedules.SCHEDULES:
      raise ValueError(f'the partition plan has schedule {self.schedule!r}; '
                       f'this runtime runs {schedules.SCHEDULES}.')
    if not is_int(self.data_parallel_replicas, 1):
      raise ValueError('the partition plan has data_parallel_replicas '
                       f'{self.data_parallel_replicas!r}; it must be a '
                       'positive int.')
    for name in ('num_stages', 'num_microbatches', 'batch_size'):
      if not is_int(getattr(self, name), 1):
        raise ValueError(f'the partition plan has {name} '
                         f'{getattr(self, name)!r}; it must be a positive '
                         'int.')
    if (len(self.boundaries) != self.num_stages + 1 or
        list(self.boundaries) != sorted(self.boundaries)):
      raise ValueError(f'the partition plan has boundaries '
                       f'{list(self.boundaries)} for {self.num_stages} '
                       'stages; it needs num_stages + 1 ascending indices.')
    if self.remat not in REMAT_MODES:
      raise ValueError(f'the partition plan has remat {self.remat!r}; this '
                       f'runtime runs {REMAT_MODES}.')

  @property
  def num_devices(self) -> int:
    """A device per stage of each pipeline copy."""
    return self.num_stages * self.data_parallel_replicas

  @property
  def stage_spans(self) -> List[Tuple[int, int]]:
    """(first, end) layer-call indices of each stage."""
    return list(zip(self.boundaries, self.boundaries[1:]))

  def check_layer_signature(self, class_names: Sequence[str]) -> None:
    """Fails unless the plan was made for a model with these layer calls."""
    expected = list(self.layer_signature)
    if list(class_names) != expected:
      raise ValueError(
          f'the partition plan was made for a model with {len(expected)} '
          f'layer calls {expected}, but this model has {len(class_names)}: '
          f'{list(class_names)}. Build the model with the same module and '
          'hparams as the GPipePartitioner.')


def read_dict(plan_dir: str) -> Dict[str, Any]:
  """The whole plan.json of a PartitionPlan artifact, version checked."""
  from components import storage  # pylint: disable=g-import-not-at-top
  path = os.path.join(plan_dir, PLAN_FILE)
  plan = storage.read_json(path)
  if plan is None:
    raise FileNotFoundError(f'no {PLAN_FILE} in the partition plan {plan_dir}.')
  PlanRecord.from_dict(plan)
  return plan


def read(plan_dir: str) -> PlanRecord:
  """The typed plan of a PartitionPlan artifact directory."""
  return PlanRecord.from_dict(read_dict(plan_dir))


def to_json(plan: Dict[str, Any]) -> str:
  """plan.json's text; the plan must read back as a PlanRecord."""
  PlanRecord.from_dict(plan)
  return json.dumps(plan, indent=1)
