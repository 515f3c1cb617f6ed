"""How the tuner times a pipeline: in-graph pulls, windows, the deadline.

Rates are examples/s of steady-state iteration after a short warm-up, over
datasets that repeat, so a small sample measures as well as a large one.
"""

import statistics
import time
from typing import Any, Callable, List, Optional

import tensorflow as tf

from components.data import input_pipeline
from components.transform.results import DatasetFn

# Lets AUTOTUNE settle before timing.
_WARMUP_S = 0.2
# The first measurement (the default pipeline) only has to tell whether the
# reader is a factor (input_bound_ratio) faster than the model: half the
# warm-up and timed seconds. The search re-measures it at full length.
_QUICK = 0.5
_WINDOWS = 3
# Calls a window's batches are pulled in.
_PIECES = 8
# Kept back from the deadline for writing the report (matplotlib included).
_REPORT_RESERVE_S = 1.5


def rows(element) -> int:
  first = tf.nest.flatten(element)[0]
  return int(first.shape[0])


def _rows_tensor(element) -> tf.Tensor:
  """Rows of a batch, in the graph (dense, sparse or ragged first feature)."""
  first = tf.nest.flatten(element)[0]
  if isinstance(first, tf.sparse.SparseTensor):
    return first.dense_shape[0]
  if isinstance(first, tf.RaggedTensor):
    return first.nrows()
  return tf.shape(first, out_type=tf.int64)[0]


def _in_graph_puller(iterator) -> Callable[[int], int]:
  """pull(n): takes n batches inside one tf.function call; returns rows.

  The trainer takes its batches inside its compiled step, so the reader is
  timed the same way: iterating from Python costs tens of microseconds per
  batch, which at a small batch would be most of what is measured.
  """
  @tf.function(autograph=False)
  def pull(n):
    def body(i, rows):
      return i + 1, rows + _rows_tensor(iterator.get_next())
    _, rows = tf.while_loop(lambda i, _: i < n, body,
                            [tf.constant(0), tf.constant(0, tf.int64)])
    return rows

  return lambda n: int(pull(tf.constant(n, tf.int32)))


def measure_rate(make_dataset: DatasetFn, seconds: float,
                 keep_first: Optional[List[Any]] = None,
                 warmup_s: float = _WARMUP_S) -> float:
  """Examples/s of iterating a dataset (repeated) after a warm-up.

  The batches are taken inside a tf.function, as the trainer's step takes
  them. The median of three windows, so that a burst of other work on a
  shared machine in one window does not decide the result. `keep_first`, if
  given, gets the first element appended (a sample batch, at no extra cost).
  """
  iterator = iter(make_dataset().repeat())
  first = next(iterator)  # Tracing and pipeline start-up are not timed.
  if keep_first is not None:
    keep_first.append(first)
  pull = _in_graph_puller(iterator)
  pull(1)  # Traces the puller.
  # Warm-up (AUTOTUNE settles), which also times one batch.
  batches, start = 0, time.perf_counter()
  warm_until = start + min(warmup_s, seconds)
  step = 1
  while time.perf_counter() < warm_until:
    pull(step)
    batches += step
    step = min(2 * step, 64)
  per_batch = (time.perf_counter() - start) / max(batches, 1)
  rates = []
  window_s = seconds / _WINDOWS
  for _ in range(_WINDOWS):
    # Pulled in pieces until the window's time is up: a reader slower than
    # its warm-up (a stream that stalls once its first shard is read) ends
    # the window on time instead of after the batches the warm-up promised.
    piece = max(1, int(window_s / _PIECES / max(per_batch, 1e-7)))
    rows, batches, start = 0, 0, time.perf_counter()
    while time.perf_counter() - start < window_s:
      rows += pull(piece)
      batches += piece
    elapsed = time.perf_counter() - start
    per_batch = elapsed / batches
    rates.append(rows / elapsed)
  return statistics.median(rates)


def dense_bytes(element) -> int:
  total = 0
  for t in tf.nest.flatten(element, expand_composites=True):
    total += t.shape.num_elements() * t.dtype.size
  return total


class Clock:
  """The deadline, and how long one measurement takes on this machine now.

  Each measurement costs more than its timed seconds (building and tracing
  the pipeline, warm-up), and more on a loaded machine; the slowest one so
  far is the estimate used to decide whether another fits the budget.
  """

  def __init__(self, budget_s: float, seconds: float,
               start: Optional[float] = None):
    self.start = time.monotonic() if start is None else start
    self.deadline = self.start + budget_s - _REPORT_RESERVE_S
    self.seconds = seconds
    self.measurement_cost = seconds + _WARMUP_S

  def measure(self, make_dataset: DatasetFn,
              keep_first: Optional[List[Any]] = None,
              quick: bool = False) -> float:
    started = time.monotonic()
    scale = _QUICK if quick else 1.0
    rate = measure_rate(make_dataset, self.seconds * scale, keep_first,
                        _WARMUP_S * scale)
    self.measurement_cost = max(self.measurement_cost,
                                time.monotonic() - started)
    return rate

  def limit(self, budget_s: float) -> None:
    """Brings the deadline forward to `budget_s` after the start."""
    self.deadline = min(self.deadline,
                        self.start + budget_s - _REPORT_RESERVE_S)

  def fits(self, measurements: int) -> bool:
    return self.left() >= measurements * self.measurement_cost

  def left(self) -> float:
    return self.deadline - time.monotonic()

  def elapsed(self) -> float:
    return time.monotonic() - self.start


def records_per_byte(files: List[str], compression: str) -> float:
  """The first file's records per stored byte: what the others' sizes are
  multiplied by where their records were not counted."""
  return input_pipeline.count_records(files[:1], compression) / max(
      tf.io.gfile.stat(files[0]).length, 1)


def estimate_num_examples(files: List[str], compression: str) -> int:
  """Records in `files`, from the first file's records per byte."""
  return round(records_per_byte(files, compression) *
               sum(tf.io.gfile.stat(f).length for f in files))
