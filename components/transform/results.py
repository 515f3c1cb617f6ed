"""What the tuner measured and decided: the result types it returns.

`TuningResult` is what the executor writes into the TunedInputPipeline
artifact and its report (`report.py`).
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional, TYPE_CHECKING

from components.data.input_pipeline import InputPipelineConfig

if TYPE_CHECKING:
  import tensorflow as tf  # Only for the DatasetFn annotation.

# Decisions (TuningResult.decision).
SEARCHED = 'searched'
STOPPED_EARLY = 'stopped early: training is not input-bound'
REUSED = 'reused the previous tuning (verified)'
KEPT_DEFAULTS = 'kept the defaults: a search cannot pay for itself'

DatasetFn = Callable[[], 'tf.data.Dataset']


@dataclasses.dataclass
class ConsumerRate:
  """How fast training consumes examples, and where the number comes from."""
  examples_per_sec: float
  source: str
  batch_size: int


# Measures the consumer on one parsed batch (features and label, a dict).
ConsumerFn = Callable[[Dict[str, Any]], ConsumerRate]


@dataclasses.dataclass
class Previous:
  """A previous tuning of the same data, to verify instead of searching."""
  config: InputPipelineConfig
  description: str


@dataclasses.dataclass
class Measurement:
  """One measured pipeline."""
  name: str
  placement: str  # 'materialized' | 'on_the_fly' | 'reference'
  examples_per_sec: float
  changes: Dict[str, Any]  # InputPipelineConfig fields vs the default
  allowed: bool = True
  note: str = ''


@dataclasses.dataclass
class StageRate:
  """Rate of a pipeline prefix, and the cost its last stage adds."""
  path: str  # 'materialized' | 'on_the_fly'
  stage: str  # 'read' | 'parse' | 'transform' | 'batch'
  cumulative_examples_per_sec: float
  stage_examples_per_sec: float
  bytes_per_sec: Optional[float] = None


@dataclasses.dataclass
class TuningResult:
  config: InputPipelineConfig
  chosen: Measurement
  candidates: List[Measurement]
  references: List[Measurement]
  stages: List[StageRate]
  bottleneck: str
  cache_reason: str
  placement_reason: str
  num_examples: int
  cache_bytes: int
  ram_budget_bytes: int
  batch_size: int
  later_epochs_examples_per_sec: Optional[float]
  seconds: float
  notes: List[str]
  # 1-minute load average and cores while measuring: rates from a busy
  # machine are lower and noisier.
  load_average: float = 0.0
  cores: int = 1
  # What the model consumes (None: not measured), and the verdict.
  consumer: Optional[ConsumerRate] = None
  input_bound: Optional[bool] = None
  input_bound_reason: str = ''
  decision: str = SEARCHED
  # Why the measured batch is not the trainer's, or None.
  batch_mismatch: Optional[str] = None
