"""One partition's stream as its consumer reads it: from a cell, exactly.

The cell runs the pipeline the local reader would (`local_stream`), built
at the stream's position and numbered from it. A pump thread moves its
elements into a queue the consumer's own tf.data pipeline dequeues from, so
the hand-over costs the consumer no Python. An element carries its batch's
position, and the consumer takes each position once, in order: a replay (a
job a restarted worker replays from its start) or a position queued again
after a move is dropped, not trained twice. A cell that leaves the queue
empty for `lost_after_s`, or that is gone (`gone()` says why: its process
exited, its actor died or does not answer), is lost: its pump is cancelled
(a tf.data service consumer whose producer died would otherwise retry
forever) and the stream goes on from the same position on the cell the pool
moves it to. With no cell left, the consumer reads the rest from the local
reader itself.
"""

import itertools
import threading
import time
from typing import Any, Callable, Iterator, List, Optional

import tensorflow as tf

from components.offload import pool as pool_lib
from components.patches import tensorflow_internals

# Seconds a new job has for its first element: the cell deserializes the
# pipeline and loads what it captures (a transform graph) first.
FIRST_ELEMENT_S = 120
# Seconds between checks of a stream's cell.
_CHECK_S = 0.5
# Elements queued ahead of the consumer.
_QUEUE_AHEAD = 2
# The numbers of the queue's last element: the stream is whole, or its rest
# is read locally. The consumer pulls nothing after it: a read ahead of a
# queue no one feeds would block, and its iterator's release with it.
_END = -2
_HAND_OVER = -3
_job_ids = itertools.count()


class CellLost(Exception):
  """The cell stopped producing; `str()` says how."""


def _described(error: Exception) -> str:
  """`error` as the record keeps it."""
  return f'{type(error).__name__}: {str(error)[:300]}'


class _Pump:
  """Moves `source()`'s numbered elements from `expected` on into `put`'s
  queue, in a thread; `close` cancels its blocked read of a cell."""

  def __init__(self, source: Callable[[], tf.data.Dataset], expected: int,
               put: Callable[..., tf.Tensor], name: str):
    self.expected = expected
    self.replays_dropped = 0
    self.progressed_at = time.monotonic()
    self.finished = False
    self.error: Optional[Exception] = None
    self._cancel = tensorflow_internals.cancellation_manager()
    self._closed = threading.Event()
    self.stopped = threading.Event()
    self._thread = threading.Thread(target=self._run, args=(source, put),
                                    daemon=True, name=f'offload-pump-{name}')
    self._thread.start()

  def _run(self, source, put):
    try:
      iterator = iter(source().map(put))
      read = tensorflow_internals.cancellable_reader(iterator, self._cancel)
      while not self._closed.is_set():
        number = int(read())
        # The consumer takes only the position it expects: a replay is
        # dropped there, and so is a gap, whose cell this pump loses.
        if number < self.expected:
          self.replays_dropped += 1
        elif number > self.expected:
          raise CellLost(f'it skipped from batch {self.expected} to '
                         f'{number}')
        else:
          self.expected = number + 1
        self.progressed_at = time.monotonic()
    except tf.errors.OutOfRangeError:
      self.finished = True
    except Exception as error:  # pylint: disable=broad-except
      if not self._closed.is_set():
        self.error = error
    finally:
      # Set before the iterator is released: releasing a job whose cell is
      # gone waits on the cell (tens of seconds), in this daemon thread.
      self.stopped.set()

  def close(self) -> None:
    self._closed.set()
    self._cancel.start_cancel()
    # A read that cancelling cannot reach (a registration with its cell gone)
    # is left to end with the process; its thread is a daemon, and what it
    # might still queue the consumer drops as a replay.
    self.stopped.wait(timeout=2 * _CHECK_S)


def from_cell(dataset: tf.data.Dataset, address: str, job_name: str,
               compress: bool = False) -> tf.data.Dataset:
  """`dataset` produced by the cell at `address`, as one job (sent
  uncompressed unless `compress`)."""
  service = f'grpc://{address}'
  dataset_id = tf.data.experimental.service.register_dataset(
      service, dataset, compression='AUTO' if compress else None)
  return tf.data.experimental.service.from_dataset_id(
      tf.data.experimental.service.ShardingPolicy.OFF, service, dataset_id,
      dataset.element_spec, job_name=job_name)


class ServedStream:
  """Batches [first, end) of `partition`, from the cell the pool names.

  `dataset()` is what the consumer reads; a supervising thread, started
  with the stream, keeps its queue fed."""

  def __init__(self, partition: int, first: int, end: int,
               local_stream: Callable[[int, int], tf.data.Dataset],
               spec: Any, pool: pool_lib.CellPool, lost_after_s: float,
               threads: Optional[int] = None, compress: bool = False):
    self.partition, self.first, self.end = partition, first, end
    self._local_stream = local_stream
    self._pool = pool
    self._lost_after_s = lost_after_s
    self._threads = threads
    self._compress = compress
    self._spec = spec
    self._components: List[tf.TensorSpec] = tf.nest.flatten(
        self._spec, expand_composites=True)
    with tf.init_scope(), tf.device('CPU:0'):
      self._queue = tf.queue.FIFOQueue(
          _QUEUE_AHEAD, [tf.int64] + [c.dtype for c in self._components])
    self._expected = first  # The next position no pump has queued.
    self._replays_dropped = 0
    self._pump: Optional[_Pump] = None
    self._local_from: Optional[int] = None
    self._closed = threading.Event()
    pool.cell_of(partition)  # Its cell, in the order the streams are made.
    self._thread = threading.Thread(
        target=self._supervise, daemon=True,
        name=f'offload-stream-{partition}')
    self._thread.start()

  @property
  def replays_dropped(self) -> int:
    pump = self._pump
    return self._replays_dropped + (pump.replays_dropped if pump else 0)

  def dataset(self) -> tf.data.Dataset:
    """The stream's batches, dequeued in the consumer's pipeline; from a
    hand-over on, read by the local reader."""
    spec, components = self._spec, self._components

    def dequeued(_):
      flat = self._queue.dequeue()
      return flat[0], tuple(flat[1:])

    def in_order(expected, element):
      number, flat = element
      # Every producer's element at a position is the same, so any one
      # will do: the rest (a replay, what a cancelled pump still queued, a
      # skipping cell's, the local reader's from before the position the
      # queue reached) is dropped.
      keep = tf.equal(number, expected)
      return expected + tf.cast(keep, tf.int64), (keep, flat)

    def batch(unused_keep, flat):
      flat = [tf.ensure_shape(t, c.shape) for t, c in zip(flat, components)]
      return tf.nest.pack_sequence_as(spec, flat, expand_composites=True)

    queued = (tf.data.Dataset.from_tensors(0).repeat().map(dequeued)
              .take_while(lambda number, flat: number >= 0))
    local = tf.data.Dataset.from_generator(
        self._local_rest, output_signature=(
            tf.TensorSpec([], tf.int64), tuple(components)))
    return (queued.concatenate(local)
            .scan(tf.constant(self.first, tf.int64), in_order)
            .filter(lambda keep, flat: keep).map(batch))

  def _local_rest(self) -> Iterator[Any]:
    """The local reader's numbered batches from the hand-over on: from the
    position the pumps reported, which may be behind what they queued."""
    if self._local_from is not None:
      for number, batch in self._local_stream(
          self._local_from, self.end - self._local_from).enumerate(
              self._local_from):
        yield number, tuple(tf.nest.flatten(batch, expand_composites=True))

  def _numbered(self, position: int) -> tf.data.Dataset:
    dataset = self._local_stream(position, self.end - position).enumerate(
        position)
    if self._threads:
      options = tf.data.Options()
      options.threading.private_threadpool_size = self._threads
      dataset = dataset.with_options(options)
    return dataset

  def _put(self, number, batch) -> tf.Tensor:
    """Queues an element; its number."""
    flat = tf.nest.flatten(batch, expand_composites=True)
    with tf.control_dependencies([self._queue.enqueue([number] + flat)]):
      return tf.identity(number)

  def _supervise(self) -> None:
    try:
      while self._expected < self.end and not self._closed.is_set():
        owner = self._pool.cell_of(self.partition)
        if owner is pool_lib.LOCAL:
          break
        self._serve_from(*owner)
    except Exception as error:  # pylint: disable=broad-except
      # The local reader takes over; what failed is in the record.
      self._pool.read_locally(self.partition, self._expected,
                              _described(error))
    if self._closed.is_set():
      return
    last = _END
    if self._expected < self.end:
      self._local_from, last = self._expected, _HAND_OVER
    try:
      self._queue.enqueue([tf.constant(last, tf.int64)] + [
          tf.zeros([0] * (c.shape.rank or 0), c.dtype)
          for c in self._components])
    except (tf.errors.CancelledError, tf.errors.OutOfRangeError):
      pass  # Closed before its consumer came this far.

  def _serve_from(self, name: str, cell) -> None:
    """Feeds the queue from `cell` until the stream is whole or closed, or
    the cell is lost."""
    position = self._expected
    pump = _Pump(lambda: from_cell(self._numbered(position), cell.address,
                                    f'p{self.partition}-at{position}-'
                                    f'{next(_job_ids)}', self._compress),
                 position, self._put, f'{self.partition}-{position}')
    self._pump = pump
    timeout_s, empty_since, seen = (max(self._lost_after_s, FIRST_ELEMENT_S),
                                    None, pump.progressed_at)
    try:
      while not self._closed.wait(_CHECK_S):
        if pump.finished:
          return
        why = None
        if pump.error is not None:
          why = _described(pump.error)
        elif self._pool.is_lost(name):
          why = 'another partition found it lost'
        else:
          why = cell.gone()
        now = time.monotonic()
        if not why:
          if pump.progressed_at != seen or int(self._queue.size()):
            seen, empty_since = pump.progressed_at, None
            if pump.expected > position:
              timeout_s = self._lost_after_s
          elif empty_since is None:
            empty_since = now
          elif now - empty_since > timeout_s:
            why = f'no element for {timeout_s:g} s'
        if why:
          pump.close()
          self._pool.lost(name, why, self.partition, pump.expected)
          return
    finally:
      pump.close()
      self._expected = max(self._expected, pump.expected)
      self._replays_dropped += pump.replays_dropped
      self._pump = None

  def close(self) -> None:
    """Ends the stream's pump and thread; a consumer still reading fails."""
    self._closed.set()
    self._thread.join(timeout=4 * _CHECK_S)
    self._queue.close(cancel_pending_enqueues=True)
