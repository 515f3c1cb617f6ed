"""The chief's progress, relayed into the supervisor's log and watched for
stalls (`supervisor`'s hang detection). No TensorFlow import.
"""

import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

from components.trainer.common import progress


class ProgressRelay:
  """Logs the chief's progress record (progress.json) every few seconds,
  and says for how long it has not moved.

  The training processes log to their own files; this puts their progress
  into the supervisor's log, the component's own. A record from before this
  attempt started (a previous run's) or one already shown is skipped. It
  reads in a thread of its own, so that a slow read from an object store
  never holds up the supervision.
  """

  def __init__(self, read: Optional[Callable[[], Optional[Dict[str, Any]]]],
               every_s: float, restarts: int,
               workers: Optional[Tuple[int, int]] = None):
    self._read = read
    self._every_s = every_s
    self._restarts = restarts
    self._workers = workers
    self._since = time.time()
    self._shown = None
    # (step, time) of this attempt's newest record, when it was first read,
    # when it was last read unchanged, and whether its clock runs.
    self._newest = None
    self._changed_at = self._confirmed_at = 0.0
    self._clock_runs = False
    self._stopping = threading.Event()
    self._thread = None
    if read is not None:
      self._thread = threading.Thread(target=self._run, daemon=True,
                                      name='hpm-progress-relay')
      self._thread.start()

  def _run(self) -> None:
    while not self._stopping.wait(self._every_s):
      self._relay()
    self._relay()  # Where the attempt ended.

  def _relay(self) -> None:
    record = self._read()
    if not record or record.get('time', 0) < self._since:
      return  # None after a record: unreadable now, which is no evidence.
    self._watch(record)
    if 'train_steps' not in record or record['step'] == self._shown:
      return
    self._shown = record['step']
    progress.LOGGER.info('%s', progress.format_line(record, self._restarts,
                                                    self._workers))

  def _watch(self, record: Dict[str, Any]) -> None:
    now = time.monotonic()
    newest = (record['step'], record.get('time'))
    if newest != self._newest:
      self._newest, self._changed_at = newest, now
    self._confirmed_at = now
    # The clock stops while the chief says it pauses (a checkpoint save, a
    # trace) and once the last step is reached (evaluation and export
    # record no steps).
    self._clock_runs = not record.get(progress.PAUSED) and (
        record['step'] < record.get('train_steps', float('inf')))

  def stalled_s(self) -> Optional[float]:
    """How long this attempt's chief has recorded no new step, as last
    confirmed by a successful read; None before its first record, while it
    pauses (a save, a trace) and after its last step."""
    if self._newest is None or not self._clock_runs:
      return None
    return self._confirmed_at - self._changed_at

  def stop(self) -> None:
    """Relays the last record; waits for that read at most one period."""
    if self._thread is not None:
      self._stopping.set()
      self._thread.join(timeout=self._every_s)
