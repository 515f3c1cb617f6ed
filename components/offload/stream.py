"""One partition's stream as its consumer reads it: from a cell, exactly.

The cell runs the pipeline the local reader would (`local_stream`), built
at the consumer's position and numbered from it, so an element carries its
batch's position: one already trained (a job a restarted worker replays
from its start) is dropped, not trained twice. A cell that hands nothing
for `lost_after_s`, or that is gone (`gone()` says why: its process
exited, its actor died or does not answer), is lost: its fetch is
cancelled (a tf.data service consumer whose producer died would otherwise
retry forever) and the stream goes on from the same position on the cell
the pool moves it to, or from the local reader.
"""

import itertools
import queue
import threading
import time
from typing import Any, Callable, Iterator, Optional

import tensorflow as tf
# pylint: disable=g-direct-tensorflow-import
from tensorflow.python.data.util import structure
from tensorflow.python.eager import cancellation
from tensorflow.python.eager import context
from tensorflow.python.eager import execute
# pylint: enable=g-direct-tensorflow-import

from components.offload import pool as pool_lib

# Seconds a new job has for its first element: the cell deserializes the
# pipeline and loads what it captures (a transform graph) first.
FIRST_ELEMENT_S = 120
# Seconds between checks of a waited-on cell's process.
_CHECK_S = 0.5
# Elements fetched ahead of the consumer from a cell.
_FETCH_AHEAD = 2
_job_ids = itertools.count()


class CellLost(Exception):
  """The cell stopped producing; `str()` says how."""


class _Fetch:
  """The elements of one job on one cell, fetched ahead in a thread whose
  blocked read `close` cancels."""

  def __init__(self, dataset_at: Callable[[], tf.data.Dataset], address: str,
               job_name: str):
    self._queue: 'queue.Queue' = queue.Queue(maxsize=_FETCH_AHEAD)
    self._cancel = cancellation.CancellationManager()
    self._closed = threading.Event()
    self._thread = threading.Thread(
        target=self._run, args=(dataset_at, address, job_name), daemon=True,
        name=f'offload-fetch-{job_name}')
    self._thread.start()

  def _run(self, dataset_at, address, job_name):
    try:
      dataset = dataset_at()
      service = f'grpc://{address}'
      dataset_id = tf.data.experimental.service.register_dataset(
          service, dataset)
      served = tf.data.experimental.service.from_dataset_id(
          tf.data.experimental.service.ShardingPolicy.OFF, service,
          dataset_id, dataset.element_spec, job_name=job_name)
      iterator = iter(served)
      while not self._closed.is_set():
        self._put(self._next(iterator))
    except tf.errors.OutOfRangeError:
      self._put(StopIteration())
    except Exception as error:  # pylint: disable=broad-except
      self._put(error)

  def _next(self, iterator):
    """The iterator's next element, a read `close` cancels.

    The op runs with this fetch's cancellation manager itself: TF's
    `CancellationManager.get_cancelable_function` sets a process-wide
    context while it runs, so every function another thread (the training
    step) started during a blocked read was cancelled with it."""
    spec = iterator.element_spec
    types = structure.get_flat_tensor_types(spec)
    flat = execute.execute_with_cancellation(
        'IteratorGetNext', len(types),
        [iterator._iterator_resource],  # pylint: disable=protected-access
        ('output_types', types,
         'output_shapes', structure.get_flat_tensor_shapes(spec)),
        context.context(), self._cancel)
    return structure.from_compatible_tensor_list(spec, flat)

  def _put(self, item) -> None:
    while not self._closed.is_set():
      try:
        self._queue.put(item, timeout=_CHECK_S)
        return
      except queue.Full:
        continue

  def get(self, timeout_s: float, gone: Callable[[], Optional[str]]):
    """The next element; CellLost after `timeout_s` without one, or when
    `gone` says why the cell is."""
    deadline = time.monotonic() + timeout_s
    while True:
      try:
        item = self._queue.get(timeout=_CHECK_S)
        break
      except queue.Empty:
        why = gone()
        if why:
          raise CellLost(why) from None
        if time.monotonic() > deadline:
          raise CellLost(f'no element for {timeout_s:g} s') from None
    if isinstance(item, StopIteration):
      raise CellLost('its stream ended early')
    if isinstance(item, Exception):
      raise CellLost(f'{type(item).__name__}: {str(item)[:300]}')
    return item

  def close(self) -> None:
    self._closed.set()
    self._cancel.start_cancel()
    # A read that cancelling cannot reach (a registration with its cell gone)
    # is left to end with the process; its thread is a daemon.
    self._thread.join(timeout=2 * _CHECK_S)


class ServedStream:
  """Batches [first, end) of `partition`, from the cell the pool names."""

  def __init__(self, partition: int, first: int, end: int,
               local_stream: Callable[[int, int], tf.data.Dataset],
               pool: pool_lib.CellPool, lost_after_s: float,
               threads: Optional[int] = None):
    self.partition, self.first, self.end = partition, first, end
    self._local_stream = local_stream
    self._pool = pool
    self._lost_after_s = lost_after_s
    self._threads = threads
    self._fetches = set()
    self.replays_dropped = 0

  def _numbered(self, position: int, on_cell: bool) -> tf.data.Dataset:
    dataset = self._local_stream(position, self.end - position).enumerate(
        position)
    if on_cell and self._threads:
      options = tf.data.Options()
      options.threading.private_threadpool_size = self._threads
      dataset = dataset.with_options(options)
    return dataset

  def batches(self) -> Iterator[Any]:
    position = self.first
    while position < self.end:
      owner = self._pool.cell_of(self.partition)
      if owner is pool_lib.LOCAL:
        for _, batch in self._numbered(position, on_cell=False):
          yield batch
        return
      name, cell = owner
      fetch = _Fetch(lambda p=position: self._numbered(p, on_cell=True),
                     cell.address,
                     f'p{self.partition}-at{position}-{next(_job_ids)}')
      self._fetches.add(fetch)

      def gone(name=name, cell=cell):
        if self._pool.is_lost(name):
          return 'another partition found it lost'
        return cell.gone()

      timeout_s = max(self._lost_after_s, FIRST_ELEMENT_S)
      try:
        while position < self.end:
          number, batch = fetch.get(timeout_s, gone)
          timeout_s = self._lost_after_s
          if int(number) < position:
            self.replays_dropped += 1
            continue
          if int(number) > position:
            raise CellLost(f'it skipped from batch {position} to {number}')
          position += 1
          yield batch
      except CellLost as lost:
        self._pool.lost(name, str(lost), self.partition, position)
      finally:
        fetch.close()
        self._fetches.discard(fetch)

  def close(self) -> None:
    """Ends the fetches of a stream its consumer left unfinished."""
    for fetch in list(self._fetches):
      fetch.close()
