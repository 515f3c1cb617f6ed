"""One supervisor for a training cluster: attempts, outcomes, what comes next.

A backend starts one attempt of the cluster (`local_backend`: child processes on
this machine; `ray_backend`: Ray actors across a Ray cluster's nodes) and
reports each task's state; `supervise` is the one loop that watches an
attempt, judges its outcome and decides what follows: done, relaunch (while
`max_restarts` lasts; a task that exits PREEMPTED_EXIT_CODE stopped at a
checkpoint, so its relaunch resumes and is not counted), or fail with the
error of the outcome (NOT_RETRYABLE_EXIT_CODE at once: the process found a
failure no relaunch can cure, `failures.CLASSES`, and its record leads the
error). A SIGTERM to the
supervisor (a preemption notice) is passed on to every task, which
checkpoints and stops; the run then fails as preempted, so that the
orchestrator's retry resumes. While an attempt runs, the chief's progress
record is logged every few seconds (`progress`), so that the component's log
shows training, and watched for stalls: a collective whose peer hangs or was
cut off blocks without failing, so an attempt whose chief records no new
step for `hang_timeout_s` is judged hung, killed and relaunched like a
failed one. An elastic attempt (Ray, `membership`) may run with fewer workers
than the cluster's full size; every `rescale_check_s` the supervisor asks it
whether the full size fits again, and if so has its tasks checkpoint and
stop (the preemption notice) and relaunches at full size, not counted as a
restart. Every change of the worker count is a recorded membership event.
No TFX, TensorFlow or Ray import.
"""

import dataclasses
import enum
import os
import signal
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Protocol, Tuple

from absl import logging

from components.trainer.checkpoint.config import SupervisionConfig
from components.trainer.common.exit_codes import NOT_RETRYABLE_EXIT_CODE
from components.trainer.common.exit_codes import PREEMPTED_EXIT_CODE
from components.trainer.common import failures
from components.trainer.cluster import log_tail
from components.trainer.common import membership as membership_lib
from components.trainer.cluster import progress_relay


class Outcome(enum.Enum):
  """How an attempt ended."""
  DONE = 'done'
  FAILED = 'failed'
  TIMEOUT = 'timeout'
  PREEMPTED = 'preempted'
  HUNG = 'hung'
  # Stopped at a checkpoint to relaunch at full size.
  RESCALED = 'rescaled'


@dataclasses.dataclass(frozen=True)
class TaskStatus:
  """One task of a running attempt, as its backend sees it."""
  name: str
  server: bool
  running: bool
  # None while running, or where the task was lost with its host (Ray).
  exit_code: Optional[int] = None
  # Added to the log tail, e.g. why Ray lost the task.
  note: str = ''


class Attempt(Protocol):
  """One launch of the cluster, as a backend runs it."""
  # The tasks' names, as their statuses name them.
  names: List[str]
  # Where each task runs (Ray: node id, IP); {} where all run here.
  placement: Dict[str, Dict[str, Any]]
  # Workers of this attempt and of the full-size cluster, and why they
  # differ (an elastic attempt); 0 and 0 for a backend whose attempts always
  # run the full cluster.
  workers: int
  full_workers: int
  membership_reason: str

  def can_grow(self) -> bool:
    """Whether the full-size cluster fits now (only asked while smaller)."""

  def poll(self, wait_s: float) -> List[TaskStatus]:
    """Every task's state, after waiting up to `wait_s` for a change."""

  def pass_on_notice(self) -> None:
    """SIGTERM to every task's process: checkpoint and stop."""

  def stop(self, grace_s: float) -> None:
    """Stops every process (SIGKILL after `grace_s`), frees what it held."""

  def log_path(self, name: str) -> str:
    """The local log file of task `name`, complete once stopped."""


# Starts attempt k (0, 1, ...) logging into the given folder.
StartAttempt = Callable[[int, str], Attempt]
# The chief's progress record (progress.json); None while there is none or
# it cannot be read.
ReadProgress = Callable[[], Optional[Dict[str, Any]]]


# Why an attempt ended in a relaunch: a failure (a restart, counted against
# max_restarts), a preemption (a task exited PREEMPTED_EXIT_CODE) or a
# membership change (stopped at a checkpoint to relaunch at full size).
FAILURE = 'failure'
PREEMPTION = 'preemption'
MEMBERSHIP = 'membership'


@dataclasses.dataclass
class ProcessExit:
  """How one process ended, with the end of its log."""
  process: str
  exit_code: Optional[int]
  log_path: str
  log_tail: str
  attempt: int
  time: float
  cause: str = FAILURE
  # For a failure: its class (`failures.CLASSES`; 'transient' where the
  # process wrote no failure record: it crashed or was lost).
  failure_class: str = ''


def count_by_cause(relaunches: List[ProcessExit]) -> Dict[str, int]:
  """How many relaunches each cause made (every cause, 0 included)."""
  return {cause: sum(1 for r in relaunches if r.cause == cause)
          for cause in (FAILURE, PREEMPTION, MEMBERSHIP)}


@dataclasses.dataclass
class LaunchResult:
  attempts: int
  # Every relaunch and its cause: restarts after failures, relaunches
  # after a preemption or a membership change.
  relaunches: List[ProcessExit]
  wall_s: float
  log_dir: str
  # Launcher 'ray': where each task of the last attempt ran (node id, IP).
  placement: Dict[str, Dict[str, Any]] = dataclasses.field(
      default_factory=dict)
  # An elastic cluster's worker-count changes.
  membership: List[membership_lib.MembershipEvent] = dataclasses.field(
      default_factory=list)

  def to_dict(self):
    return dataclasses.asdict(self)

  def relocated(self, log_dir: str, new_log_dir: str) -> 'LaunchResult':
    """The same result, its log paths under `new_log_dir` (logs uploaded)."""
    def move(path: str) -> str:
      return new_log_dir + path[len(log_dir):] if path.startswith(
          log_dir) else path
    return dataclasses.replace(
        self, log_dir=move(self.log_dir),
        relaunches=[dataclasses.replace(r, log_path=move(r.log_path))
                    for r in self.relaunches])


class ClusterFailedError(RuntimeError):
  """A training process failed (and no restart was left)."""

  def __init__(self, message: str, failure: ProcessExit,
               relaunches: List[ProcessExit]):
    super().__init__(message)
    self.failure = failure
    self.relaunches = relaunches


class ClusterTimeoutError(ClusterFailedError):
  """Training ran past its time limit."""


class ClusterPreemptedError(ClusterFailedError):
  """A preemption notice (SIGTERM) stopped training at a checkpoint."""


class SigtermForwarder:
  """While active, SIGTERM to the supervisor is a notice for every task.

  A preemption notice reaches only the executor's process (e.g. PID 1 of a
  pod); the training processes, each in its own session, must get it too to
  checkpoint before they stop. The handler only records it: the supervision
  loop passes it on (a backend's calls, Ray's, must not be interrupted by
  their own kind). Signal handlers need the main thread; in another thread
  the notice is not forwarded.
  """

  def __init__(self):
    self.received = False
    self.tasks: List[str] = []
    self._previous = None

  def __enter__(self) -> 'SigtermForwarder':
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._forward)
    return self

  def _forward(self, signum, frame):
    del signum, frame
    logging.warning('SIGTERM: forwarding the preemption notice to %s',
                    self.tasks)
    self.received = True

  def __exit__(self, *unused_exc_info):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


def judge(tasks: List[TaskStatus], notified: bool
         ) -> Optional[Tuple[Outcome, TaskStatus]]:
  """The attempt's outcome from its tasks' states, None while it runs on.

  Done when every trainer exited 0; failed at the first task that exited
  non-zero or was lost, or at a server that exited at all (servers run until
  stopped). After a preemption notice, every trainer's exit ends the attempt
  as preempted, whatever its status.
  """
  trainers = [t for t in tasks if not t.server]
  if notified:
    if any(t.running for t in trainers):
      return None
    return Outcome.PREEMPTED, trainers[0]
  for task in tasks:
    if not task.running and (task.exit_code != 0 or task.server):
      return Outcome.FAILED, task
  if any(t.running for t in trainers):
    return None
  return Outcome.DONE, trainers[0]


def _watch(attempt: Attempt, start: float, supervision: SupervisionConfig,
           poll_interval_s: float, forwarder: SigtermForwarder,
           relay: progress_relay.ProgressRelay
          ) -> Tuple[Outcome, TaskStatus, List[TaskStatus]]:
  """Polls until the attempt is done, fails, times out, hangs, was
  preempted or stopped to grow; returns the outcome, the task it is about
  and every task's last state."""
  timeout_s = supervision.timeout_s
  hang_timeout_s = supervision.hang_timeout_s
  rescale_check_s = supervision.rescale_check_s
  notified = rescaling = False
  smaller = 0 < attempt.workers < attempt.full_workers
  next_check = time.monotonic() + rescale_check_s
  while True:
    if forwarder.received and not notified:
      attempt.pass_on_notice()
      notified = True
    if (smaller and not notified and rescale_check_s and
        time.monotonic() >= next_check):
      next_check = time.monotonic() + rescale_check_s
      if attempt.can_grow():
        logging.warning('Room for all %d workers again: the %d running '
                        'checkpoint and stop, the cluster is relaunched at '
                        'full size.', attempt.full_workers, attempt.workers)
        attempt.pass_on_notice()
        notified = rescaling = True
    tasks = attempt.poll(poll_interval_s)
    end = judge(tasks, notified)
    if end:
      if rescaling and all(t.exit_code == PREEMPTED_EXIT_CODE
                           for t in tasks if not t.server):
        return (Outcome.RESCALED,) + end[1:] + (tasks,)
      if rescaling:  # A task failed on its way out: judge it as such.
        end = judge(tasks, False) or end
      return end + (tasks,)
    if timeout_s and time.monotonic() - start > timeout_s:
      stuck = next(t for t in tasks if t.running and not t.server)
      return Outcome.TIMEOUT, stuck, tasks
    stalled = relay.stalled_s()
    if (hang_timeout_s and not notified and stalled is not None and
        stalled > hang_timeout_s):
      chief = next(t for t in tasks if not t.server)
      return Outcome.HUNG, dataclasses.replace(chief, note=(
          f'\nNo new training step for {stalled:.0f} s '
          f'(hang_timeout_s={hang_timeout_s:g}): a process of the attempt '
          'hangs, or its host was cut off.')), tasks


def _describe(failure: ProcessExit, tasks: List[TaskStatus], hung: bool,
              record: Optional[Tuple[failures.FailureClass, str]]) -> str:
  others = ', '.join(
      f'{t.name}: ' + ('running' if t.running else
                       'lost' if t.exit_code is None else f'exit {t.exit_code}')
      for t in tasks if t.name != failure.process)
  code = failure.exit_code
  how = ('recorded no progress (hung) and was killed' if hung else
         'was lost with its host or actor' if code is None else
         f'was killed by signal {-code}' if code < 0 else
         f'exited with code {code}')
  described = (f'Training process {failure.process!r} {how} (attempt '
               f'{failure.attempt}); other processes: {others or "none"}. '
               f'Log {failure.log_path}, last lines:\n{failure.log_tail}')
  # What broke and what to do first, then where it was seen.
  return f'{record[1]}\n{described}' if record else described


def supervise(start_attempt: StartAttempt, log_dir: str,
              supervision: SupervisionConfig = SupervisionConfig(), *,
              read_progress: Optional[ReadProgress] = None,
              poll_interval_s: float = 0.2) -> LaunchResult:
  """Runs a cluster to completion, relaunching it where that can help.

  Args:
    start_attempt: Starts attempt k of the cluster (fresh ports, placement)
      logging into `log_dir/attempt-<k>/<task>.log`.
    log_dir: The attempts' log folders go here.
    supervision: The limits and periods (its fields say each).
    read_progress: Reads the chief's progress record, which is logged every
      `supervision.progress_every_s` through `progress.LOGGER` while the
      cluster runs, and once more at the end. Without it, hangs are not
      detected.
    poll_interval_s: How often the tasks are polled.

  Returns:
    Attempts made, the failures that caused relaunches, wall time.

  Raises:
    ClusterFailedError: A task failed and no restart was left, or it failed
      with NOT_RETRYABLE_EXIT_CODE.
    ClusterTimeoutError: The time limit passed.
    ClusterPreemptedError: SIGTERM arrived; the processes have stopped.
  """
  start = time.monotonic()
  relaunches: List[ProcessExit] = []
  membership: List[membership_lib.MembershipEvent] = []
  index = 0
  workers = 0
  with SigtermForwarder() as forwarder:
    while True:
      attempt_dir = os.path.join(log_dir, f'attempt-{index}')
      os.makedirs(attempt_dir, exist_ok=True)
      attempt = start_attempt(index, attempt_dir)
      workers = membership_lib.record_change(attempt, index, workers,
                                             membership)
      outcome = None
      try:
        forwarder.tasks = attempt.names
        relay = progress_relay.ProgressRelay(
            read_progress, supervision.progress_every_s,
            count_by_cause(relaunches)[FAILURE],
            (attempt.workers, attempt.full_workers)
            if attempt.workers != attempt.full_workers else None)
        try:
          outcome, task, tasks = _watch(attempt, start, supervision,
                                        poll_interval_s, forwarder, relay)
        finally:
          relay.stop()
      finally:
        # Hung processes would not checkpoint in any grace period.
        attempt.stop(0 if outcome is Outcome.HUNG else supervision.grace_s)
      if outcome is Outcome.DONE:
        return LaunchResult(index + 1, relaunches, time.monotonic() - start,
                            log_dir, attempt.placement, membership)
      # Read after stop: a remote task's last lines arrive with it.
      path = attempt.log_path(task.name)
      tail = log_tail.read_tail(path) + task.note
      cause = _cause(outcome, task.exit_code)
      record = failures.read_record(tail) if cause == FAILURE else None
      failure = ProcessExit(
          task.name, task.exit_code, path, tail, index, time.time(), cause,
          (record[0] if record else failures.TRANSIENT).name
          if cause == FAILURE else '')
      _raise_or_log_relaunch(
          outcome, failure,
          _describe(failure, tasks, outcome is Outcome.HUNG, record),
          relaunches, supervision)
      relaunches.append(failure)
      index += 1


def _cause(outcome: Outcome, exit_code: Optional[int]) -> str:
  if outcome is Outcome.RESCALED:
    return MEMBERSHIP
  if outcome is Outcome.PREEMPTED or exit_code == PREEMPTED_EXIT_CODE:
    return PREEMPTION
  return FAILURE


def _raise_or_log_relaunch(outcome: Outcome, failure: ProcessExit,
                           message: str, relaunches: List[ProcessExit],
                           supervision: SupervisionConfig) -> None:
  """The one mapping from an attempt's end to an error, else a relaunch."""
  max_restarts = supervision.max_restarts
  if outcome is Outcome.TIMEOUT:
    raise ClusterTimeoutError(
        f'Training exceeded timeout_s={supervision.timeout_s} and was '
        f'killed. Last lines of {failure.process} ({failure.log_path}):\n'
        f'{failure.log_tail}', failure, relaunches)
  if outcome is Outcome.RESCALED:
    logging.warning('Relaunching at full size; it resumes from its '
                    'checkpoint (not counted against max_restarts=%d).',
                    max_restarts)
    return
  if outcome is Outcome.PREEMPTED:
    raise ClusterPreemptedError(
        'Preempted (SIGTERM): the training processes were told to '
        f'checkpoint and stop; a rerun resumes. {message}', failure,
        relaunches)
  if failure.cause == PREEMPTION:
    logging.warning('Relaunching the preempted cluster; it resumes from its '
                    'checkpoint (not counted against max_restarts=%d): %s',
                    max_restarts, message)
    return
  used = count_by_cause(relaunches)[FAILURE]
  if used >= max_restarts or failure.exit_code == NOT_RETRYABLE_EXIT_CODE:
    raise ClusterFailedError(message, failure, relaunches)
  logging.warning('Restarting the cluster (%d of %d): %s', used + 1,
                  max_restarts, message)
