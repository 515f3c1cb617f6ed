"""Partition streams served by tf.data service cells in processes of their
own: the same rows as the local reader, a lost cell's partitions moved on
at the consumer's position, sizing by the auto-scaler rule."""

import os
import signal
import sys

import pytest

from components.offload import sizing
from components.offload.config import OffloadConfig
from components.offload import launch
from components.offload import served
from tests.support import split_cell
from tests.support.partition_rows import BATCH, PARTITIONS
from tests.support.partition_rows import served_rows, update_rows


@pytest.mark.slow
def test_cells_serve_the_rows_of_the_local_reader(shards, local_rows):
  files, order = shards
  offloads = []

  def serve_of(config, partitions, consumer_examples_per_s):
    def make(_):
      offloads.append(served.Offload(config, partitions, BATCH,
                                     consumer_examples_per_s))
      return offloads[-1].serve
    return make

  auto = OffloadConfig(cells='auto', measure_s=1)
  try:
    # `auto`: a consumer faster than any cell, bounded to 2 cells; one of 1
    # example a second, which any cell outruns: 1 cell.
    assert update_rows(files, order, pipelines=1,
                       serve_of=serve_of(auto, 2, 1e9)) == local_rows
    assert update_rows(files, order, pipelines=1,
                       serve_of=serve_of(auto, 2, 1.0)) == local_rows
    assert update_rows(files, order, pipelines=2, start=13, serve_of=serve_of(
        OffloadConfig(cells=1), PARTITIONS, None)) == local_rows[13:]
  finally:
    for offload in offloads:
      offload.close()
  fast, slow = offloads[0].describe(), offloads[1].describe()
  assert fast['choice']['cells'] == 2
  assert 'bounded by the 2 partitions' in fast['choice']['reason']
  assert sorted(fast['cells']) == ['cell-0', 'cell-1']
  assert fast['partitions'] == {'0': 'cell-0', '1': 'cell-1',
                                '2': 'cell-0', '3': 'cell-1'}
  assert not fast['lost']
  # The rule ran on the rate the cell was measured at.
  rate = slow['choice']['cell_examples_per_s']
  assert slow['choice']['reason'] == (
      f'ceil(1 x 1.25 / {rate:,.0f} examples/s a cell) = 1')
  assert sorted(slow['cells']) == ['cell-0']
  assert set(slow['partitions'].values()) == {'cell-0'}


@pytest.mark.slow
def test_a_killed_cell_moves_its_partitions_at_their_positions(
    shards, local_rows):
  """Killed at update 9 (its consumer is up to ~14 updates ahead): its two
  partitions go to a new cell (one start allowed) at their positions."""
  files, order = shards
  offload = served.Offload(
      OffloadConfig(cells=2, lost_after_s=5, max_cell_starts=1), PARTITIONS,
      BATCH)
  cell = offload.pool._cells['cell-0']  # pylint: disable=protected-access

  def kill(update):
    if update == 9:
      os.kill(cell.pid, signal.SIGKILL)

  rows = served_rows(files, order, offload, each=kill)
  assert rows == local_rows
  record = offload.describe()
  assert [(e['event'], e.get('cell')) for e in record['events']] == [
      ('started', 'cell-0'), ('started', 'cell-1'), ('lost', 'cell-0'),
      ('started', 'cell-2'), ('moved', 'cell-0')]
  assert record['events'][-1]['to'] == 'cell-2'
  assert record['partitions'] == {'0': 'cell-2', '1': 'cell-1',
                                  '2': 'cell-2', '3': 'cell-1'}
  assert record['lost']['cell-0'].startswith('its process is gone')


@pytest.mark.slow
def test_with_every_cell_lost_the_trainer_reads_the_rest_itself(
    shards, local_rows):
  files, order = shards
  offload = served.Offload(
      OffloadConfig(cells=1, lost_after_s=5, max_cell_starts=0), PARTITIONS,
      BATCH)
  cell = offload.pool._cells['cell-0']  # pylint: disable=protected-access

  def kill(update):
    if update == 5:
      os.kill(cell.pid, signal.SIGSTOP)  # Silent, not gone: found by time.

  # Closing the offload kills the cell, stopped or not.
  rows = served_rows(files, order, offload, each=kill)
  assert rows == local_rows
  record = offload.describe()
  assert record['lost'] == {'cell-0': 'no element for 5 s'}
  assert set(record['partitions'].values()) == {'local'}
  assert [e['event'] for e in record['events']] == [
      'started', 'lost', 'fallback']


@pytest.mark.slow
def test_a_replayed_job_is_dropped_up_to_the_position_trained(
    shards, local_rows):
  """A cell's worker restarts under the jobs: each job starts again on the
  new worker from its first batch, which the consumer has trained."""
  files, order = shards
  offload = served.Offload(OffloadConfig(cells=1), PARTITIONS, BATCH,
                           start_cell=split_cell.SplitCell)
  cell = offload.pool._cells['cell-0']  # pylint: disable=protected-access

  def restart(update):
    if update == 12:
      cell.restart_worker()

  rows = served_rows(files, order, offload, each=restart)
  assert rows == local_rows
  record = offload.describe()
  assert record['replays_dropped'] > 0
  assert not record['lost']


@pytest.mark.slow
@pytest.mark.parametrize('start_cell, why', [
    # Pinned to a core this machine does not have: the cell exits.
    (lambda name: launch.LocalCell(name, cpus={4096}), 'exited before it '
     'served'),
    # A process that never prints an address: its start times out.
    (lambda name: launch.LocalCell(
        name, None, start_timeout_s=2,
        command=[sys.executable, '-c', 'import time; time.sleep(600)']),
     'printed no address in 2 s')], ids=['exits', 'silent'])
def test_a_cell_that_cannot_start_leaves_its_partitions_to_the_trainer(
    shards, local_rows, start_cell, why):
  files, order = shards
  offload = served.Offload(OffloadConfig(cells=1), PARTITIONS, BATCH,
                           start_cell=start_cell)
  assert served_rows(files, order, offload) == local_rows
  record = offload.describe()
  assert [e['event'] for e in record['events']] == ['start_failed']
  assert why in record['events'][0]['why']
  assert set(record['partitions'].values()) == {'local'}


def test_sizing_follows_the_auto_scaler_rule():
  choice = sizing.cells_needed(1000.0, 300.0, partitions=8)
  assert choice.cells == 5  # ceil(1000 x 1.25 / 300)
  assert sizing.cells_needed(1000.0, 300.0, partitions=3).cells == 3
  assert sizing.cells_needed(100.0, 300.0, partitions=3).cells == 1
  assert sizing.cells_needed(None, 300.0, partitions=3).cells == 1
  with pytest.raises(ValueError, match='consumer_examples_per_s=nan'):
    sizing.cells_needed(float('nan'), 300.0, partitions=3)


def test_offload_config_names_bad_values():
  with pytest.raises(ValueError, match="offload.cells=-1 must be"):
    OffloadConfig(cells=-1).validate()
  with pytest.raises(ValueError, match="offload.launcher='k8s' is not one"):
    OffloadConfig(launcher='k8s').validate()
  with pytest.raises(ValueError, match='offload.lost_after_s=inf'):
    OffloadConfig(lost_after_s=float('inf')).validate()
  with pytest.raises(ValueError, match="offload.compress='yes' must be"):
    OffloadConfig(compress='yes').validate()
  assert OffloadConfig(cells='auto').validate().enabled
  assert not OffloadConfig().validate().enabled
