"""How many cells a consumer needs, by tf.data service's auto-scaler rule.

TF's `AutoScaler` (tensorflow/core/data/service/auto_scaler.cc) asks for
ceil(sum of the consumers' rates / a worker's mean throughput) workers.
Here one training process is the consumer and a cell the worker; a
headroom factor keeps the cells ahead when a cell's rate dips, and a
process never needs more cells than it has partitions (a partition is one
job on one cell).
"""

import dataclasses
import math
from typing import Any, Dict, Optional

HEADROOM = 1.25


@dataclasses.dataclass(frozen=True)
class CellChoice:
  cells: int
  reason: str
  consumer_examples_per_s: Optional[float]
  cell_examples_per_s: Optional[float]
  headroom: float = HEADROOM

  def to_dict(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)


def cells_needed(consumer_examples_per_s: Optional[float],
                 cell_examples_per_s: float, partitions: int,
                 headroom: float = HEADROOM) -> CellChoice:
  """The cells for a consumer of `consumer_examples_per_s` (None: not
  measured yet) fed by cells of `cell_examples_per_s` each, at most
  `partitions`."""
  if partitions < 1:
    raise ValueError(f'partitions={partitions} must be >= 1.')
  for name, value in (('cell_examples_per_s', cell_examples_per_s),
                      ('consumer_examples_per_s', consumer_examples_per_s)):
    if value is not None and not (math.isfinite(value) and value > 0):
      raise ValueError(f'{name}={value!r} must be a finite rate > 0.')
  if consumer_examples_per_s is None:
    return CellChoice(1, 'no consumption rate measured yet (the pipeline '
                      'has no published steady rate): one cell',
                      None, cell_examples_per_s, headroom)
  wanted = math.ceil(consumer_examples_per_s * headroom / cell_examples_per_s)
  cells = max(1, min(wanted, partitions))
  reason = (f'ceil({consumer_examples_per_s:,.0f} x {headroom:g} / '
            f'{cell_examples_per_s:,.0f} examples/s a cell) = {wanted}')
  if wanted > partitions:
    reason += f', bounded by the {partitions} partitions'
  return CellChoice(cells, reason, consumer_examples_per_s,
                    cell_examples_per_s, headroom)
