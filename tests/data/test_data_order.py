"""The data order's arithmetic (pure Python, no data read)."""

import pytest

from components.data import data_order
from components.data.data_order import DataOrder

# Unequal shards, so partitions and windows straddle shard ends.
SHARDS = (70, 130, 90, 110, 100, 60, 140)


def _order(**changes):
  values = dict(seed=5, partitions=4, batch=8, window=32,
                shard_records=SHARDS)
  values.update(changes)
  return DataOrder(**values)


def _rows(order, epoch, partition, from_row=0):
  """The (shard, record) pairs a partition's segments name, in order."""
  return [(s.shard, s.skip + k)
          for s in order.segments(epoch, partition, from_row)
          for k in range(s.take)]


def test_partitions_split_the_shard_ordered_epoch_evenly():
  order = _order()
  length = order.rows_per_partition
  assert length == sum(SHARDS) // 4
  for epoch in range(3):
    stream = [(shard, k) for shard in order.shard_order(epoch)
              for k in range(SHARDS[shard])]
    parts = [_rows(order, epoch, p) for p in range(4)]
    assert all(len(part) == length for part in parts)
    # End to end, the partitions are the epoch's first 4 x length rows.
    assert [row for part in parts for row in part] == stream[:4 * length]
  assert order.shard_order(0) != order.shard_order(1)
  assert sorted(order.shard_order(1)) == list(range(len(SHARDS)))
  assert order.shard_order(1) == _order().shard_order(1)  # Deterministic.
  assert order.shard_order(1) != _order(seed=6).shard_order(1)
  fixed = _order(fixed_shard_order=True)
  assert fixed.shard_order(3) == fixed.shard_order(0) == order.shard_order(0)


def test_a_resume_position_is_arithmetic():
  order = _order()
  length = order.rows_per_partition  # 175: batches straddle epochs.
  for batches in (0, 1, 10, 21, 22, 77):
    start = order.start(batches)
    row = batches * order.batch
    assert start.epoch == row // length
    assert start.window_row + start.drop == row % length
    assert start.window_row % order.window == 0 and start.drop < order.window
    # The segments from the window's row are the tail of the full ones.
    for partition in range(4):
      full = _rows(order, start.epoch, partition)
      assert _rows(order, start.epoch, partition,
                   start.window_row) == full[start.window_row:]
      # At most the rest of one shard is skipped, plus one window dropped.
      skipped = order.records_to_resume(partition, batches)
      assert skipped <= max(SHARDS) + order.window
  unwindowed = _order(window=0).start(10)
  assert (unwindowed.window_row, unwindowed.drop) == (80, 0)


def test_owned_partitions_are_contiguous_and_cover_all():
  for pipelines in (1, 2, 4):
    owned = [list(data_order.owned_partitions(4, pipelines, i))
             for i in range(pipelines)]
    assert [p for part in owned for p in part] == [0, 1, 2, 3]
  with pytest.raises(ValueError, match='4 partitions cannot be shared evenly '
                     'by 3 input pipelines'):
    data_order.owned_partitions(4, 3, 0)


def test_a_checkpoint_from_another_order_is_named():
  order = _order()
  data_order.check_resumable(order.state(), _order().state(), '/ckpt')
  with pytest.raises(ValueError, match=(
      r'/ckpt were trained in another data order: index_fingerprint .* then, '
      r".* now, partitions 4 then, 2 now")):
    data_order.check_resumable(
        order.state(), _order(partitions=2, shard_records=SHARDS[:-1]).state(),
        '/ckpt')


@pytest.mark.parametrize('changes,message', [
    ({'partitions': 0}, 'partitions=0 must be >= 1'),
    ({'batch': 0}, 'batch=0 must be >= 1'),
    ({'window': -1}, 'window=-1 must be >= 0'),
    ({'shard_records': (2, 1)}, '3 rows cannot fill 4 partitions'),
])
def test_bad_orders_are_named(changes, message):
  with pytest.raises(ValueError, match=message):
    _order(**changes)
  with pytest.raises(ValueError, match=r'partition=4 is not in \[0, 4\)'):
    _order().segments(0, 4)
