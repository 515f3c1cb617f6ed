"""Which cell produces each partition, and what happened to the cells.

Partitions go to the first cells in turn as their consumers ask. A lost
cell is stopped and its partitions move, each at the position its consumer
reached: to a new cell while `max_cell_starts` allows, else to the
surviving cell with the fewest, else to the trainer's own reader. Every
start, loss and move is an event of the record (`describe`), which the
trainer puts on `model_run`. Cells start and stop outside the pool's lock
(each within its launcher's bound): while a lost cell's partitions move,
their consumers wait for the move, every other stream goes on.
"""

import concurrent.futures
import itertools
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set

from absl import logging

from components.offload.config import OffloadConfig

LOCAL = None  # A partition the trainer reads itself.
# Seconds a consumer waits for its partition's move: a cell's stop and a new
# one's start, each bounded by its launcher (launch.START_TIMEOUT_S plus
# launch.STOP_TIMEOUT_S and margin; pool imports no launcher).
_MOVE_TIMEOUT_S = 300


class CellPool:
  """The cells of one training process and their partitions."""

  def __init__(self, config: OffloadConfig, start_cell: Callable[[str], Any],
               cells: int):
    self._config = config
    self._start_cell = start_cell
    self._lock = threading.Lock()
    self._moved = threading.Condition(self._lock)
    self._moving: Set[int] = set()
    self._cells: Dict[str, Any] = {}
    self._lost: Dict[str, str] = {}
    self._owner: Dict[int, Optional[str]] = {}
    self._starts = 0
    self._names = itertools.count()
    self.events: List[Dict[str, Any]] = []
    self._first_cells = self._started(self._start(cells))

  def _start(self, count: int) -> Dict[str, Any]:
    """Starts `count` cells at once, outside the lock: each cell or the
    error its start raised, by name."""
    with self._lock:
      names = [f'cell-{next(self._names)}' for _ in range(count)]
    with concurrent.futures.ThreadPoolExecutor(max(count, 1)) as threads:
      starting = {name: threads.submit(self._start_cell, name)
                  for name in names}
    return {name: future.exception() or future.result()
            for name, future in starting.items()}

  def _started(self, starts: Dict[str, Any]) -> List[str]:
    """Takes `_start`'s cells into the pool; one that failed to start is an
    event, and the partitions it would have served go to the others (or to
    the trainer)."""
    with self._lock:
      started = []
      for name, cell in starts.items():
        if isinstance(cell, BaseException):
          self._event('start_failed', cell=name, why=str(cell)[:300])
          logging.warning('Offload cell %s did not start: %s', name, cell)
          continue
        self._cells[name] = cell
        self._event('started', cell=name, address=cell.address,
                    pid=cell.pid)
        started.append(name)
      return started

  def _event(self, event: str, **facts) -> None:
    self.events.append({'event': event, 'time': round(time.time(), 3),
                        **facts})

  def cell_of(self, partition: int):
    """The cell producing `partition` (LOCAL: the trainer reads it); a
    partition asked for the first time goes to the next first cell in turn.
    A moving partition's consumer waits for the move, which its launcher's
    start and stop bounds."""
    with self._lock:
      if not self._moved.wait_for(lambda: partition not in self._moving,
                                  timeout=_MOVE_TIMEOUT_S):
        raise RuntimeError(f'partition {partition} did not move in '
                           f'{_MOVE_TIMEOUT_S} s')
      if partition not in self._owner:
        alive = [n for n in self._first_cells if n not in self._lost]
        self._owner[partition] = (alive[len(self._owner) % len(alive)]
                                  if alive else LOCAL)
      name = self._owner[partition]
      return LOCAL if name is None else (name, self._cells[name])

  def add_first_cells(self, count: int) -> None:
    """`count` more cells that partitions asked for later go to in turn."""
    started = self._started(self._start(count))
    with self._lock:
      self._first_cells += started

  def forget(self, partition: int) -> None:
    """`partition` no longer counts (a measurement's stream)."""
    with self._lock:
      self._owner.pop(partition, None)

  def is_lost(self, name: str) -> bool:
    with self._lock:
      return name in self._lost

  def lost(self, name: str, why: str, partition: int, position: int) -> None:
    """`name` is lost (seen by `partition`'s consumer at `position`); its
    partitions move. Later reports of the same cell only move theirs."""
    with self._lock:
      if name in self._lost:
        return
      self._lost[name] = why
      self._event('lost', cell=name, why=why, partition=partition,
                  position=position)
      logging.warning('Offload cell %s is lost (%s); moving its partitions.',
                      name, why)
      moving = sorted(p for p, owner in self._owner.items() if owner == name)
      self._moving.update(moving)
      start = self._starts < self._config.max_cell_starts
      if start:
        self._starts += 1
    started: List[str] = []
    try:
      self._cells[name].stop()
      started = self._started(self._start(1)) if start else []
    finally:
      with self._lock:
        target = started[0] if started else self._least_loaded()
        for moved in moving:
          self._owner[moved] = target
        self._moving.difference_update(moving)
        self._moved.notify_all()
        self._event('fallback' if target is LOCAL else 'moved', cell=name,
                    to=target, partitions=moving)

  def read_locally(self, partition: int, position: int, why: str) -> None:
    """`partition`'s stream failed outside any cell: the trainer reads it
    from `position` on."""
    with self._lock:
      self._owner[partition] = LOCAL
      self._event('fallback', partitions=[partition], position=position,
                  why=why)
      logging.warning('Offload of partition %d failed (%s); the trainer '
                      'reads it from batch %d.', partition, why, position)

  def _least_loaded(self) -> Optional[str]:
    """The surviving cell with the fewest partitions (LOCAL: none is left).
    Called with the lock held."""
    alive = [n for n in self._cells if n not in self._lost]
    if not alive:
      return LOCAL
    load = {n: sum(1 for owner in self._owner.values() if owner == n)
            for n in alive}
    return min(alive, key=lambda n: (load[n], n))

  def describe(self) -> Dict[str, Any]:
    with self._lock:
      return {'cells': {n: c.address for n, c in self._cells.items()},
              'lost': dict(self._lost),
              'partitions': {str(p): o or 'local'
                             for p, o in sorted(self._owner.items())},
              'events': list(self.events)}

  def close(self) -> None:
    with self._lock:
      running = [cell for name, cell in self._cells.items()
                 if name not in self._lost]
    for cell in running:
      cell.stop()
