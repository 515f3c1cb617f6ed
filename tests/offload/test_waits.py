"""Every wait of a cell's life is bounded: its start, its stop, and a move
of its partitions, which holds up only their own consumers."""

import os
import re
import signal
import sys
import threading

import pytest

from components.offload import launch
from components.offload import pool as pool_lib
from components.offload.config import OffloadConfig

# Processes that stand in for cells: one never prints its address, one
# prints an address and then serves nothing.
SILENT = [sys.executable, '-c', 'import time; time.sleep(600)']
ADDRESS_ONLY = [sys.executable, '-c',
                'import json, os, time; print(json.dumps({"address": '
                '"localhost:1", "pid": os.getpid()}), flush=True); '
                'time.sleep(600)']


def _gone(pid: int) -> bool:
  return not os.path.exists(f'/proc/{pid}')


def test_a_cell_that_never_prints_its_address_fails_its_start_and_is_killed():
  with pytest.raises(launch.CellStartTimeout,
                     match=r'printed no address in 1\.5 s') as failed:
    launch.LocalCell('silent', None, start_timeout_s=1.5, command=SILENT)
  pid = int(re.search(r'pid (\d+)', str(failed.value)).group(1))
  assert _gone(pid)


def test_a_stopped_cell_is_killed_within_the_bound():
  cell = launch.LocalCell('stopped', None, command=ADDRESS_ONLY)
  assert cell.address == 'localhost:1'
  os.kill(cell.pid, signal.SIGSTOP)
  cell.stop()
  assert _gone(cell.pid) and cell.gone() == 'its process is gone (exit -9)'


def test_the_child_pins_itself_to_the_cores_it_is_given():
  # Without preexec_fn (unsafe in a threaded parent): the cell process sets
  # its own affinity from the environment, before TensorFlow loads.
  cpus = {min(os.sched_getaffinity(0))}
  cell = launch.LocalCell('pinned', cpus)
  try:
    assert os.sched_getaffinity(cell.pid) == cpus
  finally:
    cell.stop()


def test_a_move_holds_up_only_the_moving_partitions_consumers():
  """While a lost cell's replacement starts (here: never serves), the
  pool's lock is free: another cell's consumer and the record answer; the
  moving partitions' consumers wait for the move, which ends at the start's
  bound on the surviving cell."""
  release = threading.Event()

  def start(name):
    if name == 'cell-2':  # The replacement.
      release.wait()
      return launch.LocalCell(name, None, start_timeout_s=1, command=SILENT)
    return launch.LocalCell(name, None, command=ADDRESS_ONLY)

  pool = pool_lib.CellPool(OffloadConfig(cells=2, max_cell_starts=1), start,
                           cells=2)
  try:
    assert [pool.cell_of(p)[0] for p in range(4)] == [
        'cell-0', 'cell-1', 'cell-0', 'cell-1']
    lost_cell = pool.cell_of(0)[1]
    os.kill(lost_cell.pid, signal.SIGSTOP)  # Its stop must still end.
    answers = {}

    def ask(key, call):
      thread = threading.Thread(
          target=lambda: answers.__setitem__(key, call()), daemon=True)
      thread.start()
      return thread

    losing = ask('lost', lambda: pool.lost('cell-0', 'test', 0, 7))
    moving_consumer = ask('moving', lambda: pool.cell_of(2)[0])
    other_consumer = ask('other', lambda: pool.cell_of(1)[0])
    record = ask('record', pool.describe)
    other_consumer.join(timeout=30)
    record.join(timeout=30)
    assert answers.get('other') == 'cell-1'
    assert answers['record']['lost'] == {'cell-0': 'test'}
    assert losing.is_alive() and moving_consumer.is_alive()
    release.set()
    losing.join(timeout=60)
    moving_consumer.join(timeout=60)
    assert answers['moving'] == 'cell-1'
    assert pool.cell_of(0)[0] == 'cell-1'
    assert _gone(lost_cell.pid)
    events = pool.describe()['events']
    assert [(e['event'], e.get('cell')) for e in events] == [
        ('started', 'cell-0'), ('started', 'cell-1'), ('lost', 'cell-0'),
        ('start_failed', 'cell-2'), ('moved', 'cell-0')]
    assert 'printed no address in 1 s' in events[3]['why']
    assert events[-1]['to'] == 'cell-1' and events[-1]['partitions'] == [0, 2]
  finally:
    release.set()
    pool.close()
