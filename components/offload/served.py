"""The trainer's side: partition streams served by a pool of cells, as a
drop-in for the local partition stream of `ordered_pipeline`, and the
measurement `auto` sizes the pool with."""

import math
import time
from typing import Callable, Optional

import tensorflow as tf

from components.offload import launch
from components.offload import sizing
from components.offload import stream as stream_lib
from components.offload.config import AUTO, OffloadConfig
from components.offload.pool import CellPool

# The pool's name for the measurement's stream (partitions are >= 0).
_PROBE = -1
LocalStream = Callable[[int, int], tf.data.Dataset]


class Offload:
  """A training process's cells; `serve` is `build_ordered_dataset`'s."""

  def __init__(self, config: OffloadConfig, cells: int,
               choice: Optional[sizing.CellChoice] = None, pool=None):
    self.config = config
    self.choice = choice
    self.pool = pool or CellPool(
        config, lambda name: launch.start(config, name), cells)
    self.streams = []
    self._spec = None

  def serve(self, partition: int, first: int, batches: int,
            local_stream: LocalStream) -> tf.data.Dataset:
    """Batches [first, first + batches) of `partition`, from its cell."""
    if self._spec is None:  # The same for every partition.
      self._spec = local_stream(first, batches).element_spec
    stream = stream_lib.ServedStream(
        partition, first, first + batches, local_stream, self.pool,
        self.config.lost_after_s,
        threads=max(1, math.ceil(self.config.cpus_per_cell)))
    self.streams.append(stream)
    return tf.data.Dataset.from_generator(stream.batches,
                                          output_signature=self._spec)

  def describe(self):
    return {'config': self.config.to_dict(),
            'choice': self.choice and self.choice.to_dict(),
            'replays_dropped': sum(s.replays_dropped for s in self.streams),
            **self.pool.describe()}

  def close(self) -> None:
    self.pool.close()


def start(config: OffloadConfig, partitions: int, examples_per_batch: int,
          consumer_examples_per_s: Optional[float],
          sample_stream: LocalStream, sample_first: int,
          sample_batches: int) -> Offload:
  """The offload `config` asks for; `auto` streams batches [sample_first,
  sample_first + sample_batches) of `sample_stream` (a partition's, from
  where training starts) from the first cell for `config.measure_s` and
  sizes the pool (`sizing`) for `consumer_examples_per_s` (None: unknown)."""
  if config.cells != AUTO:
    return Offload(config, min(config.cells, partitions))
  offload = Offload(config, 1)
  cell_rate = _measure(offload, sample_stream, sample_first, sample_batches,
                       examples_per_batch, config.measure_s)
  choice = sizing.cells_needed(consumer_examples_per_s, cell_rate, partitions)
  for _ in range(choice.cells - 1):
    offload.pool.add_first_cell()
  offload.choice = choice
  return offload


def _measure(offload: Offload, sample_stream: LocalStream, first: int,
             batches: int, examples_per_batch: int, measure_s: float
            ) -> float:
  """Examples a second one cell produces of `sample_stream` after its
  first element (the pipeline's start-up)."""
  probe = stream_lib.ServedStream(_PROBE, first, first + batches,
                                  sample_stream, offload.pool,
                                  offload.config.lost_after_s)
  batches = probe.batches()
  try:
    next(batches)
    began, count = time.monotonic(), 0
    for _ in batches:
      count += 1
      if time.monotonic() - began >= measure_s:
        break
    elapsed = time.monotonic() - began
  finally:
    batches.close()
    offload.pool.forget(_PROBE)
  return max(count, 1) * examples_per_batch / elapsed
