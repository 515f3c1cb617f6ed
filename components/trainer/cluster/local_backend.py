"""Runs a training cluster as child processes of this one (launcher `local`).

The backend of `supervisor.supervise` for this machine: one process for
single-worker strategies, N workers with TF_CONFIG on localhost ports for
MultiWorkerMirrored, ps + worker servers plus a coordinator for
ParameterServer (see `tf_cluster`). No process outlives `run_supervised`:
each child leads its own process group, which is killed on the way out, and
the kernel kills each child if the supervising thread dies
(PR_SET_PDEATHSIG). No TFX or TensorFlow import: plain subprocess management.
"""

import ctypes
import os
import signal
import subprocess
import time
from typing import Any, Callable, Dict, List, Optional

from absl import logging

from components.trainer.checkpoint.config import SupervisionConfig
from components.trainer.cluster import supervisor
from components.trainer.cluster.tf_cluster import ProcessSpec

_PR_SET_PDEATHSIG = 1
# The C library's symbols (prctl), as linked into this interpreter.
_LIBC = ctypes.CDLL(None, use_errno=True)


def die_with_parent(parent_pid: int) -> Callable[[], None]:
  """preexec_fn: the kernel SIGKILLs the child when the supervisor dies."""

  def preexec():
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # The parent died before prctl.
      os._exit(1)  # pylint: disable=protected-access

  return preexec


def signal_group(pgid: int, sig: int) -> None:
  """Signals a process group; one that is gone already is no error."""
  try:
    os.killpg(pgid, sig)
  except (ProcessLookupError, PermissionError):
    pass


def process_env(overrides: Dict[str, Optional[str]]) -> Dict[str, str]:
  """This process's environment with `overrides` (None removes a variable),
  unbuffered, so that a log is complete up to a crash."""
  env = dict(os.environ, PYTHONUNBUFFERED='1')
  for key, value in overrides.items():
    if value is None:
      env.pop(key, None)
    else:
      env[key] = value
  return env


class RunningProcess:
  """A started process with its log file."""

  def __init__(self, spec: ProcessSpec, log_path: str):
    self.spec = spec
    self.log_path = log_path
    self._log = open(log_path, 'wb')
    try:
      self.popen = subprocess.Popen(
          spec.argv, env=process_env(spec.env), stdin=subprocess.DEVNULL,
          stdout=self._log,
          stderr=subprocess.STDOUT, start_new_session=True,
          preexec_fn=die_with_parent(os.getpid()))
    except BaseException:
      self._log.close()
      raise

  def status(self) -> supervisor.TaskStatus:
    code = self.popen.poll()
    return supervisor.TaskStatus(self.spec.name, self.spec.server,
                                 code is None, code)

  def terminate(self) -> None:
    """Passes a preemption notice on: SIGTERM to the process group."""
    if self.popen.poll() is None:
      signal_group(self.popen.pid, signal.SIGTERM)

  def close(self):
    self._log.close()


def stop_all(running: List[RunningProcess], grace_s: float) -> None:
  """SIGTERM every process group, SIGKILL what is left after `grace_s`."""
  for r in running:
    r.terminate()
  deadline = time.monotonic() + grace_s
  for r in running:
    try:
      r.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      pass
    # Also reaches grandchildren left in the group after the leader exited.
    signal_group(r.popen.pid, signal.SIGKILL)
    r.popen.wait()
    r.close()


class LocalAttempt:
  """One launch of the cluster as child processes (a supervisor.Attempt)."""
  # This machine's cluster always runs at full size.
  workers = full_workers = 0
  membership_reason = ''

  def __init__(self, specs: List[ProcessSpec], attempt: int,
               attempt_dir: str):
    self.names = [spec.name for spec in specs]
    self.placement: Dict[str, Dict[str, Any]] = {}
    self._dir = attempt_dir
    self.running: List[RunningProcess] = []
    try:
      for spec in specs:
        self.running.append(RunningProcess(spec, self.log_path(spec.name)))
    except BaseException:
      stop_all(self.running, 0)
      raise
    logging.info('Attempt %d: started %s', attempt,
                 [(r.spec.name, r.popen.pid) for r in self.running])

  def log_path(self, name: str) -> str:
    return os.path.join(self._dir, f'{name}.log')

  def poll(self, wait_s: float) -> List[supervisor.TaskStatus]:
    """The tasks' states after up to `wait_s`: sooner when the first running
    one exits (a one-process job's end is seen at once, not up to a poll
    later)."""
    running = [r for r in self.running if r.popen.poll() is None]
    if running:
      try:
        running[0].popen.wait(timeout=wait_s)
      except subprocess.TimeoutExpired:
        pass
    return [r.status() for r in self.running]

  def pass_on_notice(self) -> None:
    for r in self.running:
      r.terminate()

  def stop(self, grace_s: float) -> None:
    stop_all(self.running, grace_s)

  def can_grow(self) -> bool:
    return False


def run_supervised(make_processes: Callable[[int], List[ProcessSpec]],
                   log_dir: str,
                   supervision: SupervisionConfig = SupervisionConfig(), *,
                   read_progress: Optional[supervisor.ReadProgress] = None
                  ) -> supervisor.LaunchResult:
  """Runs a cluster of child processes under `supervisor.supervise`.

  Args:
    make_processes: Builds the cluster for attempt 0, 1, ... (fresh ports).
    log_dir: Gets `attempt-<k>/<process>.log` per process.
    supervision, read_progress: As for supervisor.supervise.
  """
  return supervisor.supervise(
      lambda attempt, attempt_dir: LocalAttempt(
          make_processes(attempt), attempt, attempt_dir),
      log_dir, supervision, read_progress=read_progress)
