"""The training data order as arithmetic over the shard index.

Every epoch the shards are put in a seeded order and their rows, end to end,
are cut into `partitions` equal slices (the last `rows % partitions` rows of
the epoch are left out). A partition's rows are shuffled inside windows of
`window` rows (seeded by epoch, partition and window) and then cut into
batches of `batch` rows; its epochs follow each other, so its batch j is rows
[j * batch, (j + 1) * batch) of its endless row stream. Optimizer update j
trains the j-th batch of every partition, so the order does not depend on how
many workers read it: a worker reads only the partitions it owns.

Where batch j lies, and what must be read to resume there (at most one shard
per partition, skipped to the row, and one window), is arithmetic over the
per-shard record counts: nothing is counted or read to find a position. A
partition's stream is a pure function of (index, seed, partition, position),
so any process can produce it. Pure Python: no TensorFlow.
"""

import dataclasses
import hashlib
import json
from typing import Dict, List, Tuple

ORDER_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Segment:
  """Records [skip, skip + take) of shard `shard` (its place in the index)."""
  shard: int
  skip: int
  take: int


@dataclasses.dataclass(frozen=True)
class Start:
  """Where a partition's stream resumes: `epoch`, the window that holds the
  row (read from `window_row`, its first row), and the rows of that window
  to drop after shuffling it."""
  epoch: int
  window_row: int
  drop: int


@dataclasses.dataclass(frozen=True)
class DataOrder:
  """One training's data order (see the module doc).

  `shard_records`: each shard's records, in index order; `window`: rows
  shuffled together in a partition (0: none); `fixed_shard_order`: every
  epoch has epoch 0's shard order (a cache replays its first pass).
  """
  seed: int
  partitions: int
  batch: int
  window: int
  shard_records: Tuple[int, ...]
  fixed_shard_order: bool = False

  def __post_init__(self):
    for name in ('partitions', 'batch'):
      if getattr(self, name) < 1:
        raise ValueError(f'{name}={getattr(self, name)} must be >= 1.')
    if self.window < 0:
      raise ValueError(f'window={self.window} must be >= 0.')
    if self.rows_per_partition < 1:
      raise ValueError(
          f'{sum(self.shard_records)} rows cannot fill {self.partitions} '
          'partitions of at least one row each: too few examples for the '
          'update batch.')

  @property
  def rows_per_partition(self) -> int:
    """Rows of one partition in one epoch."""
    return sum(self.shard_records) // self.partitions

  def fingerprint(self) -> str:
    """Of the shard counts: a different index is a different order."""
    counts = json.dumps(list(self.shard_records)).encode()
    return hashlib.sha256(counts).hexdigest()[:16]

  def state(self) -> Dict[str, object]:
    """The order, saved with each checkpoint: with the checkpoint's step
    (the updates done) and the index, these fix every later batch."""
    return {'order_version': ORDER_VERSION, 'seed': self.seed,
            'partitions': self.partitions, 'batch': self.batch,
            'window': self.window, 'fixed_shard_order': self.fixed_shard_order,
            'index_fingerprint': self.fingerprint()}

  def shard_order(self, epoch: int) -> List[int]:
    """The shards (places in the index) in epoch `epoch`'s order."""
    epoch = 0 if self.fixed_shard_order else epoch
    return sorted(range(len(self.shard_records)), key=lambda shard: (
        hashlib.sha256(f'{self.seed}:{epoch}:{shard}'.encode()).digest()))

  def start(self, batches: int) -> Start:
    """Where a partition's stream is after `batches` batches."""
    epoch, row = divmod(batches * self.batch, self.rows_per_partition)
    window_row = row - row % self.window if self.window else row
    return Start(epoch, window_row, row - window_row)

  def segments(self, epoch: int, partition: int,
               from_row: int = 0) -> List[Segment]:
    """The records of `partition`'s rows [from_row, end) of `epoch`."""
    if not 0 <= partition < self.partitions:
      raise ValueError(f'partition={partition} is not in '
                       f'[0, {self.partitions}).')
    length = self.rows_per_partition
    begin = partition * length + from_row
    end = (partition + 1) * length
    found, shard_start = [], 0
    for shard in self.shard_order(epoch):
      shard_end = shard_start + self.shard_records[shard]
      low, high = max(begin, shard_start), min(end, shard_end)
      if low < high:
        found.append(Segment(shard, low - shard_start, high - low))
      shard_start = shard_end
      if shard_start >= end:
        break
    return found

  def records_to_resume(self, partition: int, batches: int) -> int:
    """Records read before `partition`'s batch `batches` can be cut: those
    skipped in its first shard, and the rows of the window before it."""
    start = self.start(batches)
    segments = self.segments(start.epoch, partition, start.window_row)
    return (segments[0].skip if segments else 0) + start.drop


def owned_partitions(partitions: int, num_pipelines: int,
                     pipeline_id: int) -> range:
  """The partitions input pipeline `pipeline_id` of `num_pipelines` reads:
  a contiguous run, so that its replicas' batches are in partition order."""
  if partitions % num_pipelines:
    raise ValueError(f'{partitions} partitions cannot be shared evenly by '
                     f'{num_pipelines} input pipelines.')
  share = partitions // num_pipelines
  return range(pipeline_id * share, (pipeline_id + 1) * share)


def check_resumable(recorded: Dict[str, object], current: Dict[str, object],
                    where: str) -> None:
  """Raises ValueError when a checkpoint's order (`recorded`, its `state`)
  is not the order this training reads (`current`)."""
  changed = sorted(key for key in current
                   if recorded.get(key) != current[key])
  if changed:
    raise ValueError(
        f'The checkpoints in {where} were trained in another data order: '
        + ', '.join(f'{key} {recorded.get(key)!r} then, {current[key]!r} now'
                    for key in changed)
        + '. Resuming would not train the rows an uninterrupted run trains; '
        'restore the data (or the config) they were trained with, or train '
        'from scratch in a new checkpoint location.')

