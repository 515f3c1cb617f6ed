"""The offload group of the trainer's config (`distribution.offload`). No
TensorFlow import, so it validates at construction."""

import dataclasses
from typing import Union

from components.json_config import JsonConfig, check_choice, check_int
from components.json_config import is_int, is_number

AUTO = 'auto'
LAUNCHERS = ('local', 'ray')


@dataclasses.dataclass
class OffloadConfig(JsonConfig):
  """Where the trainer's partitions are produced.

  Attributes:
    cells: tf.data service cells each training process reads its partitions
      from: 0 (the default) reads them itself; `auto` measures one cell and
      the trainer's consumption rate at start (`sizing`).
    launcher: `local` starts each cell as a process on this machine, on the
      cores the training process is not pinned to; `ray` as a Ray actor on a
      node of the Ray cluster with `cpus_per_cell` to spare.
    cpus_per_cell: CPUs a cell reserves (Ray) and its tf.data threads.
    lost_after_s: A cell that hands a waiting consumer nothing for this long,
      or whose process or actor is gone, is lost: its partitions move on.
    max_cell_starts: Cells started to replace lost ones; beyond, partitions
      move to surviving cells, and with none left the trainer reads them.
    measure_s: How long `auto` measures one cell's production rate.
    compress: Whether cells compress what they send (snappy): less network
      traffic for remote cells, but the training process, whose CPU the
      offload is there to spare, pays for the decompression.
  """
  OPTIONS_NAME = 'distribution.offload'
  cells: Union[int, str] = 0
  launcher: str = 'local'
  cpus_per_cell: float = 1.0
  lost_after_s: float = 30.0
  max_cell_starts: int = 2
  measure_s: float = 3.0
  compress: bool = False

  def validate(self) -> 'OffloadConfig':
    if self.cells != AUTO and not is_int(self.cells, minimum=0):
      raise ValueError(f'offload.cells={self.cells!r} must be an integer >= '
                       f'0 or {AUTO!r}.')
    check_choice('offload.launcher', self.launcher, LAUNCHERS)
    for name in ('cpus_per_cell', 'lost_after_s', 'measure_s'):
      value = getattr(self, name)
      if not is_number(value) or value <= 0:
        raise ValueError(f'offload.{name}={value!r} must be a finite number '
                         '> 0.')
    check_int('offload.max_cell_starts', self.max_cell_starts, minimum=0)
    if not isinstance(self.compress, bool):
      raise ValueError(f'offload.compress={self.compress!r} must be true or '
                       'false.')
    return self

  @property
  def enabled(self) -> bool:
    return self.cells != 0
