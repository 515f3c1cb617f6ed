"""The data order read by tf.data (small synthetic shards, counted reads)."""

import dataclasses
import os

import pytest
import tensorflow as tf

from components.data import input_pipeline
from components.data import ordered_pipeline
from components.data import shard_index
from components.data.config import InputPipelineConfig
from components.data.data_order import DataOrder
from tests.support import transform_data

NUM_EXAMPLES = 1000
NUM_FILES = 7  # 142 or 143 rows each.
BATCH = 8  # Rows of a partition batch (a micro-batch).
PARTITIONS = 4
# 250 rows a partition, 31.25 batches an epoch: 70 updates cross two epoch
# ends, and batches straddle them.
UPDATES = 70


@pytest.fixture(scope='module')
def shards(tmp_path_factory):
  patterns = transform_data.write_split(
      str(tmp_path_factory.mktemp('data')), NUM_EXAMPLES, NUM_FILES)
  files = input_pipeline.list_files(patterns)
  index = shard_index.build(os.path.dirname(files[0]), files, 'GZIP')
  return files, tuple(s.records for s in index.shards)


def _order(counts, **changes):
  return DataOrder(**{**dict(seed=3, partitions=PARTITIONS, batch=BATCH,
                             window=4 * BATCH, shard_records=counts),
                      **changes})


def _updates(files, order, pipelines=1, replicas_per_pipeline=1, start=0,
             updates=UPDATES, config=None, counter=None):
  """Each update's row ids, its pipelines' replica batches joined in
  pipeline (then replica) order."""
  per_pipeline = []
  for pipeline_id in range(pipelines):
    context = tf.distribute.InputContext(
        num_input_pipelines=pipelines, input_pipeline_id=pipeline_id,
        num_replicas_in_sync=pipelines * replicas_per_pipeline)
    dataset = ordered_pipeline.build_ordered_dataset(
        files, transform_data.FEATURE_SPEC, 'label', order, config,
        input_context=context, start_update=start, updates=updates,
        read_counter=counter)
    batches = [list(f['id'].numpy()) for f, _ in dataset]
    # A step takes one batch per local replica.
    per_pipeline.append([
        sum(batches[i:i + replicas_per_pipeline], [])
        for i in range(0, len(batches), replicas_per_pipeline)])
  return [sum(step, []) for step in zip(*per_pipeline)]


def test_every_update_trains_the_same_rows_at_any_worker_count(shards):
  """W workers of one replica (accumulating 4/W micro-batches), and two
  replicas per worker: the same rows, in partition order, every update."""
  files, counts = shards
  order = _order(counts)
  one = _updates(files, order)
  assert len(one) == UPDATES
  assert all(len(rows) == PARTITIONS * BATCH for rows in one)
  for pipelines, replicas in ((2, 1), (4, 1), (2, 2)):
    assert _updates(files, order, pipelines, replicas) == one, (
        pipelines, replicas)
  # An epoch (31 updates) trains distinct rows, shuffled within windows.
  epoch = [i for rows in one[:31] for i in rows]
  assert len(set(epoch)) == len(epoch)
  assert one[0] != sorted(one[0])
  assert one[:31] != one[32:63]  # The next epoch's order differs.


@pytest.mark.parametrize('start', [1, 20, 31, 56])
def test_a_resume_at_any_worker_count_trains_what_the_run_did(shards, start):
  """Mid-epoch, at an epoch's end, in the next epoch: exact, and another
  worker count from the position is exact too."""
  files, counts = shards
  order = _order(counts)
  one = _updates(files, order)
  assert _updates(files, order, start=start, updates=UPDATES - start) == (
      one[start:])
  assert _updates(files, order, pipelines=2, start=start,
                  updates=UPDATES - start) == one[start:]


def test_a_resume_reads_one_shard_and_one_window_not_the_epoch(shards):
  """Records decompressed to resume deep in an epoch: at most the rest of
  one shard before the position per partition and one window, where
  skipping batches reads the epoch up to the position."""
  files, counts = shards
  order = _order(counts)
  start = 29  # 232 of a partition's 250 rows.
  counter = tf.Variable(0, dtype=tf.int64)
  resumed = _updates(files, order, start=start, updates=1, counter=counter)
  assert resumed == _updates(files, order)[start:start + 1]
  # Each partition reads from its resume point to the end of its batch
  # (within the read batch of its last shard).
  bound = sum(order.records_to_resume(p, start) for p in range(PARTITIONS))
  read_batch = input_pipeline.read_batch_size(InputPipelineConfig(), BATCH)
  assert counter.numpy() <= bound + PARTITIONS * (BATCH + read_batch)
  assert bound <= PARTITIONS * (max(counts) + order.window)
  # What the position is in rows: the reading skipping would do.
  assert counter.numpy() < start * BATCH * PARTITIONS / 2


@pytest.mark.parametrize('cache', ['memory', 'disk'])
def test_a_cache_serves_the_same_batches_and_resumes(shards, tmp_path, cache):
  """With a cache every epoch has epoch 0's shard order; the cached run is
  the uncached run of that order, from the start and resumed."""
  files, counts = shards
  config = InputPipelineConfig(cache=cache, cache_dir=str(tmp_path))
  # Batches of 10: an epoch is 25 updates.
  order = _order(counts, batch=10, window=40, fixed_shard_order=True)
  uncached = _updates(files, order, updates=60)
  assert _updates(files, order, config=config, updates=60) == uncached
  assert _updates(files, order, config=config, start=40,
                  updates=20) == uncached[40:]
  epochs = [[i for rows in uncached[k * 25:(k + 1) * 25] for i in rows]
            for k in range(2)]
  assert epochs[0] != epochs[1]
  assert sorted(epochs[0]) == sorted(epochs[1])  # The same rows.


def test_damaged_tails_are_left_out_by_the_counts(shards):
  """A shard counted short (`skip_unreadable_records`' readable prefix) is
  read only up to that count."""
  files, counts = shards
  short = (counts[0] // 2,) + counts[1:]
  rows = {i for update in _updates(files, _order(short), updates=30)
          for i in update}
  assert not rows & set(range(short[0], counts[0]))
  config = dataclasses.replace(InputPipelineConfig(), read_batch_size=16)
  assert _updates(files, _order(short), updates=5, config=config) == (
      _updates(files, _order(short), updates=5))


@pytest.mark.parametrize('read_ahead', [2, 5])
def test_reading_ahead_trains_the_same_rows_and_resumes(shards, read_ahead):
  """K shards read at once hand their records on in the order's sequence:
  the same rows every update at W = 1, 2, 4, resumed at several positions,
  and a resume reads at most one shard a partition plus the K read ahead."""
  files, counts = shards
  order = _order(counts)
  one = _updates(files, order)
  config = InputPipelineConfig(read_ahead_shards=read_ahead)
  for pipelines in (1, 2, 4):
    assert _updates(files, order, pipelines, config=config) == one, pipelines
  for start in (1, 31, 56):
    assert _updates(files, order, pipelines=2, start=start,
                    updates=UPDATES - start, config=config) == one[start:]
  start = 29
  counter = tf.Variable(0, dtype=tf.int64)
  resumed = _updates(files, order, start=start, updates=1, config=config,
                     counter=counter)
  assert resumed == one[start:start + 1]
  bound = sum(order.records_to_resume(p, start) for p in range(PARTITIONS))
  assert counter.numpy() <= bound + PARTITIONS * read_ahead * max(counts)
  assert counter.numpy() < start * BATCH * PARTITIONS
