"""The trainer's side: partition streams served by a pool of cells, in
place of the local partition streams of `ordered_pipeline`, and the
measurement `auto` sizes the pool with."""

import math
import time
from typing import Any, Callable, Optional

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
  """A training process's cells; `serve` is `build_ordered_dataset`'s.

  With `cells='auto'` the first partition served is first streamed from one
  cell for `measure_s` (`sizing` then adds the cells the consumer's
  `consumer_examples_per_s` needs, at most `partitions`)."""

  def __init__(self, config: OffloadConfig, partitions: int,
               examples_per_batch: int,
               consumer_examples_per_s: Optional[float] = None,
               start_cell: Optional[Callable[[str], Any]] = None):
    self.config = config
    self.choice: Optional[sizing.CellChoice] = None
    self._partitions = partitions
    self._examples_per_batch = examples_per_batch
    self._consumer_examples_per_s = consumer_examples_per_s
    self._sized = config.cells != AUTO
    cells = 1 if config.cells == AUTO else min(config.cells, partitions)
    self.pool = CellPool(
        config, start_cell or (lambda name: launch.start(config, name)),
        cells)
    self.streams = []
    self._spec = None

  def serve(self, partition: int, first: int, batches: int,
            local_stream: LocalStream) -> tf.data.Dataset:
    """Batches [first, first + batches) of `partition`, from its cell."""
    if self._spec is None:  # The same for every partition.
      self._spec = local_stream(first, batches).element_spec
    if not self._sized:
      self._size(local_stream, first, batches)
    stream = self.stream(partition, first, batches, local_stream)
    self.streams.append(stream)
    return stream.dataset()

  def stream(self, partition: int, first: int, batches: int,
             local_stream: LocalStream) -> stream_lib.ServedStream:
    """`partition`'s stream from its cell, its tf.data threads as many as
    `cpus_per_cell`."""
    return stream_lib.ServedStream(
        partition, first, first + batches, local_stream, self._spec,
        self.pool,
        self.config.lost_after_s,
        threads=max(1, math.ceil(self.config.cpus_per_cell)),
        compress=self.config.compress)

  def _size(self, local_stream: LocalStream, first: int, batches: int):
    self._sized = True
    cell_rate = _measure(self, local_stream, first, batches,
                         self._examples_per_batch, self.config.measure_s)
    self.choice = sizing.cells_needed(self._consumer_examples_per_s,
                                      cell_rate, self._partitions)
    self.pool.add_first_cells(self.choice.cells - 1)

  def describe(self):
    return {'config': self.config.to_dict(),
            'choice': self.choice and self.choice.to_dict(),
            'replays_dropped': sum(s.replays_dropped for s in self.streams),
            **self.pool.describe()}

  def close(self) -> None:
    for stream in self.streams:
      stream.close()
    self.pool.close()


def _measure(offload: Offload, sample_stream: LocalStream, first: int,
             batches: int, examples_per_batch: int, measure_s: float
            ) -> float:
  """Examples a second one cell produces of `sample_stream` after its
  first element (the pipeline's start-up)."""
  # As a served partition's stream is, on as many threads.
  probe = offload.stream(_PROBE, first, batches, sample_stream)
  try:
    elements = iter(probe.dataset())
    next(elements)
    began, count = time.monotonic(), 0
    for _ in elements:
      count += 1
      if time.monotonic() - began >= measure_s:
        break
    elapsed = time.monotonic() - began
  finally:
    probe.close()
    offload.pool.forget(_PROBE)
  return max(count, 1) * examples_per_batch / elapsed
