"""The run records beside the checkpoints: resume events and progress.

`events.json` lists what happened to this training across attempts (resumed,
restarted, preempted, lease taken over, storage retried); `progress.json`
holds the last step reached (to count the steps a crash lost) with the
progress numbers the supervisor logs (`progress.py`). Only the chief writes
them. `read_progress` is the one reader of progress.json.
"""

import threading
import time
from typing import Any, Callable, Dict, List, Optional

from absl import logging
import tensorflow as tf

from components import storage
from components.trainer.checkpoint import location
from components.trainer.common import progress

EVENTS_NAME = 'events.json'
PROGRESS_NAME = 'progress.json'


def _direct(what: str, fn: Callable[..., Any], *args) -> Any:
  del what
  return fn(*args)


def read_progress(directory: str, io: Callable[..., Any] = _direct
                 ) -> Optional[Dict[str, Any]]:
  """The progress marker of a checkpoint folder; None if absent or unreadable
  (the supervisor reads it while the chief may be writing it)."""
  try:
    return io('read progress', storage.read_json,
              location.join(directory, PROGRESS_NAME))
  except (ValueError, tf.errors.OpError):
    return None


class RunRecords:
  """The events and progress marker of one checkpoint folder.

  `io(what, fn, *args)` makes every storage call (the store's, which
  retries transient errors and counts them).
  """

  def __init__(self, directory: str, is_chief: bool,
               io: Callable[..., Any] = _direct):
    self.directory = directory.rstrip('/')
    self._is_chief = is_chief
    self._io = io

  def read_events(self) -> List[Dict[str, Any]]:
    return self._io('read events', storage.read_json,
                    location.join(self.directory, EVENTS_NAME)) or []

  def append_event(self, event: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Adds `event` to the events of this training (chief only); returns all."""
    events = self.read_events() + [event]
    if self._is_chief:
      self._io('write events', storage.write_json,
               location.join(self.directory, EVENTS_NAME), events, True)
    return events

  def read_progress(self) -> Optional[Dict[str, Any]]:
    return read_progress(self.directory, self._io)

  def write_progress(self, step: int,
                     details: Optional[Dict[str, Any]] = None) -> None:
    """Records the last step reached, to count lost steps after a crash, with
    `details` for people watching (components/trainer/common/progress.py)."""
    if self._is_chief:
      self._io('write progress', tf.io.gfile.makedirs, self.directory)
      self._io('write progress', storage.write_json,
               location.join(self.directory, PROGRESS_NAME),
               {**(details or {}), 'step': int(step), 'time': time.time()},
               True)


class ProgressMarker:
  """Records the last step reached, in the background.

  The loop only hands over a number and a small dict, so it never
  waits for storage (a write to an object store takes tens of milliseconds);
  a crash can leave the marker up to `min_interval_seconds` plus one write
  behind, so the lost steps computed from it are a lower bound.
  """

  def __init__(self, run_records: RunRecords,
               min_interval_seconds: float = 1.0):
    self._records = run_records
    self._min_interval_seconds = min_interval_seconds
    self._latest = None  # (step, details), replaced as one.
    self._written = None
    self._wake = threading.Event()
    self._closing = threading.Event()
    self._thread = threading.Thread(target=self._run, name='hpm-progress',
                                    daemon=True)
    self._thread.start()

  def update(self, step: int,
             details: Optional[Dict[str, Any]] = None) -> None:
    """The step reached, with what `details` say about it (none: a save
    records only the step; older details would not match it, but those of
    the same step do, and are kept: the last step's progress line then
    survives the final save, whichever the writer gets to first)."""
    if details is None and self._latest is not None and (
        self._latest[0] == step):
      details = {k: v for k, v in (self._latest[1] or {}).items()
                 if k != progress.PAUSED}
    self._latest = (step, details)
    self._wake.set()

  def pausing(self, step: int, why: str) -> None:
    """At `step`, work that records no step begins (`why`: 'saving',
    'tracing'); the record says so until the next update, and the
    supervisor's hang clock stops meanwhile (a large save to an object store
    may take minutes)."""
    latest = self._latest
    details = dict(latest[1] or {}) if latest and latest[0] == step else {}
    self._latest = (step, {**details, progress.PAUSED: why})
    self._wake.set()

  def _run(self) -> None:
    while True:
      self._wake.wait()
      self._wake.clear()
      # Closing is read before the latest: every update made before close()
      # is then in `latest`, even one that came during a slow write (the
      # save's bare step, then the loop's details of that step).
      closing = self._closing.is_set()
      latest = self._latest
      if latest is not None and latest != self._written:
        step, details = latest
        try:
          self._records.write_progress(step, details)
          self._written = latest
        except (OSError, tf.errors.OpError) as e:
          logging.warning('Could not record progress at step %d: %s', step, e)
      if closing:
        return
      # The pause between writes ends early on close(): waiting it out
      # made every run's end up to a second late.
      self._closing.wait(self._min_interval_seconds)

  def close(self) -> None:
    """Writes the latest step and stops."""
    self._closing.set()
    self._wake.set()
    self._thread.join()
