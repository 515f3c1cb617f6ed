"""The lease: which run may save, prune and delete in a checkpoint folder.

Only the holder of the folder's lease saves, prunes or deletes there, so two
runs of the same training (same pipeline, node and fingerprint) cannot delete
each other's checkpoints; see `CheckpointLease` for what that guarantees on
stores without an atomic create-if-absent.
"""

import os
import socket
import threading
import time
from typing import Any, Callable, Dict, Optional
import uuid

from absl import logging
import tensorflow as tf

from components import storage
from components.trainer.checkpoint.config import LEASE_MODES
from components.trainer.checkpoint import location

LEASE_NAME = 'LEASE.json'
# A lease whose heartbeat is older than this many intervals is taken over.
LEASE_STALE_HEARTBEATS = 3


class LeaseHeldError(RuntimeError):
  """Another live run holds the checkpoint folder's lease."""


class LeaseLostError(RuntimeError):
  """This run's lease was taken over: it must not prune or delete."""


def _pid_alive(pid: Any) -> bool:
  if not isinstance(pid, int) or pid <= 0:
    return False
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # Another user's process: alive.
  return True


_SAME_RUN = 'held by an earlier attempt of this run'


def _describe(holder: Dict[str, Any]) -> str:
  return (f"run {holder.get('run_id')!r} (pid {holder.get('pid')} on "
          f"{holder.get('host')})")


class CheckpointLease:
  """The right to save, prune and delete in one checkpoint folder.

  The lease is a JSON object in the folder naming its holder (host, pid, run
  id, a token per acquisition) with a heartbeat time that a background thread
  refreshes. A lease is free when absent, unreadable, stale (heartbeat older
  than LEASE_STALE_HEARTBEATS intervals, by this host's clock: hosts'
  clocks must agree to well within that), held by a dead process on this
  host, or held by an earlier attempt of the same run: a launcher restart or
  executor retry gets the same run id (the model_run URI), while another
  execution of the same training gets another one and must wait or fail.

  Not every store can create an object only if it is absent (tf.io.gfile
  cannot ask GCS for it), so acquiring writes the lease and reads it back.
  The race accepted: two runs that find the lease free at the same moment
  may both read back their own write before the other's lands. The object
  then names one of them; the other finds the other token at its next check,
  which comes before every prune or delete and at every heartbeat, and stops
  there. The same holds for a holder that stalled past the stale time and
  comes back (its heartbeat reads before it writes). So a deletion can only
  slip through in the moment between one such check and the deletion it
  guards.
  """

  def __init__(self, directory: str, run_id: str, heartbeat_seconds: float,
               io: Callable[..., Any]):
    self.path = location.join(directory, LEASE_NAME)
    self.holder = {'run_id': run_id, 'host': socket.gethostname(),
                   'pid': os.getpid(), 'token': uuid.uuid4().hex}
    self._heartbeat_seconds = float(heartbeat_seconds)
    self._io = io
    # The heartbeat and the checks run in two threads; on a store that
    # replaces an object by delete + write (ram://) a check between the two
    # would find no lease.
    self._lock = threading.Lock()
    self._acquired = None
    self._stop = threading.Event()
    self._thread = None
    self.lost: Optional[str] = None

  @property
  def stale_after_seconds(self) -> float:
    return LEASE_STALE_HEARTBEATS * self._heartbeat_seconds

  def read(self) -> Optional[Dict[str, Any]]:
    """The lease object; {} where it cannot be parsed; None where absent."""
    try:
      lease = self._io('read lease', storage.read_json, self.path)
    except ValueError:
      return {}
    return lease if lease is None or isinstance(lease, dict) else {}

  def _write(self) -> None:
    with self._lock:
      self._io('write lease', storage.write_json, self.path, {
          **self.holder, 'acquired': self._acquired,
          'heartbeat': time.time(),
          'heartbeat_seconds': self._heartbeat_seconds}, True)

  def _free_because(self, lease: Optional[Dict[str, Any]]) -> Optional[str]:
    """Why `lease` may be taken, or None where a live run holds it."""
    if lease is None:
      return 'free'
    if not lease.get('token'):
      return 'unreadable lease'
    if lease.get('run_id') == self.holder['run_id']:
      return _SAME_RUN
    if lease.get('host') == self.holder['host'] and not _pid_alive(
        lease.get('pid')):
      return f"its holder (pid {lease.get('pid')}) is gone"
    age = time.time() - float(lease.get('heartbeat') or 0)
    stale = LEASE_STALE_HEARTBEATS * float(
        lease.get('heartbeat_seconds') or self._heartbeat_seconds)
    if age > stale:
      return f'its heartbeat is {age:.0f} s old (stale after {stale:.0f} s)'
    return None

  def _held_message(self, lease: Dict[str, Any], mode: str,
                    waited: float) -> str:
    age = time.time() - float(lease.get('heartbeat') or 0)
    what = (f'still holds it after {waited:.0f} s of waiting '
            '(lease_timeout_s)' if mode == 'wait' else 'holds it')
    return (f'Another run is training into the checkpoint folder '
            f'{self.path.rsplit("/", 1)[0]}: {_describe(lease)} {what}, '
            f'heartbeat {age:.0f} s ago. Two runs of the same training (same '
            'pipeline, node and fingerprint) would prune each other\'s '
            'checkpoints. Let it finish or stop it, or set '
            "fault_tolerance.lease='wait'; a lease whose heartbeat is older "
            f'than {self.stale_after_seconds:.0f} s, or whose holder died on '
            'this host, is taken over.')

  def acquire(self, mode: str, timeout_seconds: float
             ) -> Optional[Dict[str, Any]]:
    """Takes the lease (waiting per `mode`); returns the event to record.

    Raises LeaseHeldError where a live run holds it (at once for 'fail',
    after `timeout_seconds` for 'wait').
    """
    if mode not in LEASE_MODES:
      raise ValueError(f'lease={mode!r} must be one of {LEASE_MODES}.')
    began = time.monotonic()
    first_holder = None
    while True:
      current = self.read()
      reason = self._free_because(current)
      waited = time.monotonic() - began
      if reason is None:
        if mode == 'fail' or waited >= timeout_seconds:
          raise LeaseHeldError(self._held_message(current, mode, waited))
        if not first_holder:
          logging.warning('Waiting for the checkpoint lease held by %s (up '
                          'to %.0f s).', _describe(current), timeout_seconds)
        first_holder = first_holder or current
        time.sleep(min(self._heartbeat_seconds, timeout_seconds - waited))
        continue
      self._acquired = time.time()
      self._write()
      if (self.read() or {}).get('token') != self.holder['token']:
        continue  # Another run's write landed after ours: look again.
      self._thread = threading.Thread(target=self._beat, name='hpm-lease',
                                      daemon=True)
      self._thread.start()
      logging.info('Holding the checkpoint lease %s (%s).', self.path, reason)
      if reason == _SAME_RUN:
        return None  # A restart of this run: its 'resumed' event says so.
      if reason != 'free':
        return {'event': 'lease_taken_over', 'reason': reason,
                'previous_holder': current, 'waited_seconds': round(waited, 3),
                'time': time.time()}
      if first_holder:
        return {'event': 'lease_waited', 'previous_holder': first_holder,
                'waited_seconds': round(waited, 3), 'time': time.time()}
      return None

  def _beat(self) -> None:
    while not self._stop.wait(self._heartbeat_seconds):
      try:
        if not self._check():
          return
        self._write()
      except (tf.errors.OpError, OSError) as e:
        logging.warning('Could not refresh the checkpoint lease %s: %s',
                        self.path, e)

  def _check(self) -> bool:
    """Whether the lease still names us (else records who has it)."""
    with self._lock:
      current = self.read()
    if current and current.get('token') == self.holder['token']:
      return True
    self.lost = ('the lease was taken over by ' + _describe(current)
                 if current else 'the lease object disappeared')
    logging.error('Lost the checkpoint lease %s: %s.', self.path, self.lost)
    return False

  def ensure_held(self) -> None:
    """Raises LeaseLostError unless the lease still names this run."""
    if self._acquired is None:
      raise RuntimeError(f'The checkpoint lease {self.path} was never '
                         'acquired (call acquire first).')
    if self.lost or not self._check():
      raise LeaseLostError(
          f'This run no longer holds the checkpoint lease {self.path}: '
          f'{self.lost}. It stops rather than prune or delete checkpoints '
          'another run now owns (its heartbeats failed for longer than '
          f'{self.stale_after_seconds:.0f} s?).')

  def stop(self) -> None:
    self._stop.set()
    if self._thread:
      self._thread.join()

  def release(self) -> None:
    """Stops the heartbeat and removes the lease where it still names us."""
    self.stop()
    if self._acquired is None:
      return
    try:
      if (self.read() or {}).get('token') == self.holder['token']:
        self._io('remove lease', tf.io.gfile.remove, self.path)
    except (tf.errors.OpError, OSError) as e:
      logging.warning('Could not remove the checkpoint lease %s (it goes '
                      'stale in %.0f s): %s', self.path,
                      self.stale_after_seconds, e)
