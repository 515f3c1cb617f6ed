"""Starts and supervises the processes of a local training cluster.

HighPerfTrainer's `local` launcher runs training in child processes on this
machine: one process for single-worker strategies, N workers with TF_CONFIG on
localhost ports for MultiWorkerMirrored, and ps + worker servers plus a
coordinator for ParameterServer. The supervisor polls them; the first
non-zero exit (or a server that exits at all) stops every process and fails
the run with that process's log tail, or relaunches the whole cluster while
restarts remain. A SIGTERM to the supervisor (a preemption notice) is
forwarded to every process, so that training checkpoints before it stops. No
process outlives `run_supervised`: each child leads its own process group,
which is killed on the way out, and the kernel kills each child if the
supervising thread dies (PR_SET_PDEATHSIG).

While the cluster runs, the chief's progress record is read every few
seconds and logged here (`progress`), so that the component's log shows
training. No TFX or TensorFlow import: the supervisor is plain subprocess
management.
"""

import collections
import ctypes
import dataclasses
import json
import os
import re
import signal
import subprocess
import threading
import time
from typing import (Any, Callable, Dict, Iterable, Iterator, List, Optional,
                    Tuple)

from absl import logging
import portpicker

from components.trainer import progress

_PR_SET_PDEATHSIG = 1
# The C library's symbols (prctl), as linked into this interpreter.
_LIBC = ctypes.CDLL(None, use_errno=True)
# A killed cluster's processes get this long to exit after SIGTERM before
# SIGKILL.
DEFAULT_GRACE_S = 10.0
# A training process's exit status for a failure that no relaunch can cure
# (EX_CONFIG), e.g. another run holds the checkpoint folder's lease: the
# launcher fails at once instead of using up max_restarts.
NOT_RETRYABLE_EXIT_CODE = 78
TAIL_LINES = 40
# What every TensorFlow process prints as it starts, whatever went wrong
# later: kept out of the log tail of a failure.
_TF_STARTUP = re.compile('|'.join([
    r'Unable to register cu(FFT|DNN|BLAS) factory',
    r'oneDNN custom operations are on',
    r'This TensorFlow binary is optimized to use available CPU instructions',
    r'rebuild TensorFlow with the appropriate compiler flags',
    r'TF-TRT Warning: Could not find TensorRT',
    r'Could not find cuda drivers on your machine',
    r'All log messages before absl::InitializeLog\(\) is called',
]))
_PYTHON_WARNING = re.compile(r':\d+: (FutureWarning|DeprecationWarning): ')


@dataclasses.dataclass
class ProcessSpec:
  """One process of a cluster."""
  name: str
  argv: List[str]
  # Extra environment; a None value removes the variable.
  env: Dict[str, Optional[str]] = dataclasses.field(default_factory=dict)
  # Servers (ps / PS workers) run until killed: the cluster is done when every
  # non-server process has exited 0, and a server exiting early is a failure.
  server: bool = False


@dataclasses.dataclass
class ProcessExit:
  """How one process ended, with the end of its log."""
  process: str
  exit_code: Optional[int]
  log_path: str
  log_tail: str
  attempt: int
  time: float


@dataclasses.dataclass
class LaunchResult:
  attempts: int
  restarts: List[ProcessExit]
  wall_s: float
  log_dir: str
  # Launcher 'ray': where each task of the last attempt ran (node id, IP).
  placement: Dict[str, Dict[str, Any]] = dataclasses.field(
      default_factory=dict)

  def to_dict(self):
    return dataclasses.asdict(self)

  def relocated(self, log_dir: str, new_log_dir: str) -> 'LaunchResult':
    """The same result, its log paths under `new_log_dir` (logs uploaded)."""
    def move(path: str) -> str:
      return new_log_dir + path[len(log_dir):] if path.startswith(
          log_dir) else path
    return dataclasses.replace(
        self, log_dir=move(self.log_dir),
        restarts=[dataclasses.replace(r, log_path=move(r.log_path))
                  for r in self.restarts])


class ClusterFailedError(RuntimeError):
  """A training process failed (and no restart was left)."""

  def __init__(self, message: str, failure: ProcessExit,
               restarts: List[ProcessExit]):
    super().__init__(message)
    self.failure = failure
    self.restarts = restarts


class ClusterTimeoutError(ClusterFailedError):
  """Training ran past its time limit."""


class ClusterPreemptedError(ClusterFailedError):
  """A preemption notice (SIGTERM) stopped training at a checkpoint."""


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


def without_startup_noise(lines: Iterable[str]) -> Iterator[str]:
  """`lines` less TensorFlow's start-up messages and Python's Future- and
  DeprecationWarnings (each with the source line printed under it)."""
  warning_source = False
  for line in lines:
    if warning_source and line.startswith((' ', '\t')):
      warning_source = False
      continue
    warning_source = bool(_PYTHON_WARNING.search(line))
    if not warning_source and not _TF_STARTUP.search(line):
      yield line


def read_tail(path: str, lines: int = TAIL_LINES) -> str:
  """The last `lines` lines of a (possibly large) log file, without the
  start-up noise that would fill them (the file keeps everything)."""
  try:
    with open(path, 'rb') as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - 256 * 1024))
      text = f.read().decode('utf-8', errors='replace')
  except FileNotFoundError:
    return ''
  return '\n'.join(collections.deque(
      without_startup_noise(text.splitlines()), maxlen=lines))


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

  def exit_record(self, attempt: int) -> ProcessExit:
    return ProcessExit(self.spec.name, self.popen.poll(), self.log_path,
                       read_tail(self.log_path), attempt, time.time())

  def close(self):
    self._log.close()


def stop_all(running: List[RunningProcess], grace_s: float) -> None:
  """SIGTERM every process group, SIGKILL what is left after `grace_s`."""
  for r in running:
    if r.popen.poll() is None:
      signal_group(r.popen.pid, signal.SIGTERM)
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


def _describe(failure: ProcessExit, running: List[RunningProcess]) -> str:
  others = ', '.join(
      f'{r.spec.name}: ' + ('running' if r.popen.poll() is None else
                            f'exit {r.popen.poll()}')
      for r in running if r.spec.name != failure.process)
  code = failure.exit_code
  how = (f'was killed by signal {-code}' if code is not None and code < 0 else
         f'exited with code {code}')
  return (f'Training process {failure.process!r} {how} (attempt '
          f'{failure.attempt}); other processes: {others or "none"}. '
          f'Log {failure.log_path}, last lines:\n{failure.log_tail}')


class SigtermForwarder:
  """While active, SIGTERM to the supervisor goes on to every process.

  A preemption notice reaches only the executor's process (e.g. PID 1 of a
  pod); the training processes, each in its own session, must get it too to
  checkpoint before they stop. Signal handlers need the main thread; in
  another thread the notice is not forwarded.
  """

  def __init__(self):
    self.received = False
    self.running: List[RunningProcess] = []
    self._previous = None

  def __enter__(self) -> 'SigtermForwarder':
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._forward)
    return self

  def _forward(self, signum, frame):
    del signum, frame
    logging.warning('SIGTERM: forwarding the preemption notice to %s',
                    [r.spec.name for r in self.running])
    self.received = True
    for r in self.running:
      if r.popen.poll() is None:
        signal_group(r.popen.pid, signal.SIGTERM)

  def __exit__(self, *unused_exc_info):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)


class ProgressRelay:
  """Logs the chief's progress record (progress.json) every few seconds.

  The training processes log to their own files; this puts their progress
  into the supervisor's log, the component's own. A record from before this
  attempt started (a previous run's) or one already shown is skipped. It
  reads in a thread of its own, so that a slow read from an object store
  never holds up the supervision.
  """

  def __init__(self, read: Optional[Callable[[], Optional[Dict[str, Any]]]],
               every_s: float, restarts: int):
    self._read = read
    self._every_s = every_s
    self._restarts = restarts
    self._since = time.time()
    self._shown = None
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
    if (not record or 'train_steps' not in record or
        record.get('time', 0) < self._since or
        record['step'] == self._shown):
      return
    self._shown = record['step']
    progress.LOGGER.info('%s', progress.format_line(record, self._restarts))

  def stop(self) -> None:
    """Relays the last record; waits for that read at most one period."""
    if self._thread is not None:
      self._stopping.set()
      self._thread.join(timeout=self._every_s)


def run_supervised(make_processes: Callable[[int], List[ProcessSpec]],
                   log_dir: str,
                   *,
                   timeout_s: float = 0,
                   max_restarts: int = 0,
                   poll_interval_s: float = 0.2,
                   grace_s: float = DEFAULT_GRACE_S,
                   read_progress: Optional[
                       Callable[[], Optional[Dict[str, Any]]]] = None,
                   progress_every_s: float = progress.LINE_EVERY_SECONDS
                  ) -> LaunchResult:
  """Runs a cluster to completion, relaunching it on failure if allowed.

  SIGTERM to the calling process (a preemption notice) is forwarded to the
  training processes, which checkpoint and exit; the run then fails with
  ClusterPreemptedError, without a restart, so that the orchestrator's retry
  resumes from the checkpoint.

  Args:
    make_processes: Builds the cluster for attempt 0, 1, ... (fresh ports).
    log_dir: Gets `attempt-<k>/<process>.log` per process.
    timeout_s: Limit for all attempts together; 0 = none.
    max_restarts: Whole-cluster relaunches allowed after a failure.
    poll_interval_s: How often the processes are polled.
    grace_s: Time between SIGTERM and SIGKILL when stopping processes.
    read_progress: Returns the chief's progress record (progress.json; None
      while there is none); it is logged every `progress_every_s` through
      `progress.LOGGER` while the cluster runs, and once more at the end.
    progress_every_s: How often the progress record is read.

  Returns:
    Attempts made, the failures that caused restarts, wall time.

  Raises:
    ClusterFailedError: A process failed and no restart was left.
    ClusterTimeoutError: The time limit passed.
    ClusterPreemptedError: SIGTERM arrived; the processes have stopped.
  """
  start = time.monotonic()
  restarts: List[ProcessExit] = []
  attempt = 0
  with SigtermForwarder() as forwarder:
    while True:
      attempt_dir = os.path.join(log_dir, f'attempt-{attempt}')
      os.makedirs(attempt_dir, exist_ok=True)
      running: List[RunningProcess] = []
      forwarder.running = running
      try:
        for spec in make_processes(attempt):
          running.append(RunningProcess(
              spec, os.path.join(attempt_dir, f'{spec.name}.log')))
        logging.info('Attempt %d: started %s', attempt,
                     [(r.spec.name, r.popen.pid) for r in running])
        relay = ProgressRelay(read_progress, progress_every_s, len(restarts))
        try:
          outcome, failure = _watch(running, attempt, start, timeout_s,
                                    poll_interval_s, forwarder)
        finally:
          relay.stop()
        if outcome == _DONE:
          return LaunchResult(attempt + 1, restarts,
                              time.monotonic() - start, log_dir)
        message = _describe(failure, running)
      finally:
        stop_all(running, grace_s)
      if outcome == _TIMEOUT:
        raise ClusterTimeoutError(
            f'Training exceeded timeout_s={timeout_s} and was killed. Last '
            f'lines of {failure.process} ({failure.log_path}):\n'
            f'{failure.log_tail}', failure, restarts)
      if outcome == _PREEMPTED:
        raise ClusterPreemptedError(
            'Preempted (SIGTERM): the training processes were told to '
            f'checkpoint and stop; a rerun resumes. {message}', failure,
            restarts)
      if (len(restarts) >= max_restarts or
          failure.exit_code == NOT_RETRYABLE_EXIT_CODE):
        raise ClusterFailedError(message, failure, restarts)
      logging.warning('Restarting the cluster (%d of %d): %s',
                      len(restarts) + 1, max_restarts, message)
      restarts.append(failure)
      attempt += 1


_DONE, _FAILED, _TIMEOUT, _PREEMPTED = 'done', 'failed', 'timeout', 'preempted'


def _watch(running: List[RunningProcess], attempt: int, start: float,
           timeout_s: float, poll_interval_s: float,
           forwarder: SigtermForwarder
          ) -> Tuple[str, Optional[ProcessExit]]:
  """Polls until the cluster is done, fails, times out or was preempted.

  Returns the outcome and the process it is about: the one that failed; on
  timeout a trainer still running; after a preemption notice the first
  trainer, once every trainer has exited.
  """
  while True:
    trainers = [r for r in running if not r.spec.server]
    if forwarder.received:
      if all(r.popen.poll() is not None for r in trainers):
        return _PREEMPTED, trainers[0].exit_record(attempt)
    else:
      for r in running:
        code = r.popen.poll()
        if code is not None and (code != 0 or r.spec.server):
          return _FAILED, r.exit_record(attempt)
      if all(r.popen.poll() == 0 for r in trainers):
        return _DONE, None
    if timeout_s and time.monotonic() - start > timeout_s:
      stuck = next(r for r in trainers if r.popen.poll() is None)
      return _TIMEOUT, stuck.exit_record(attempt)
    time.sleep(poll_interval_s)


def cluster_shape(strategy: str, num_workers: int,
                  num_ps: int) -> Dict[str, int]:
  """TF task type -> task count of `strategy`'s cluster ({}: no cluster)."""
  if strategy == 'multi_worker_mirrored':
    return {'worker': num_workers}
  if strategy == 'parameter_server':
    return {'chief': 1, 'worker': num_workers, 'ps': num_ps}
  return {}


def process_name(task_type: str, index: int) -> str:
  """The name cluster_processes gives a task's process."""
  return 'chief' if task_type == 'chief' else f'{task_type}-{index}'


def cluster_processes(strategy: str, num_workers: int, num_ps: int,
                      argv_for_role: Callable[[str], List[str]],
                      host: str = 'localhost',
                      addresses: Optional[Dict[str, List[str]]] = None
                     ) -> List[ProcessSpec]:
  """The processes (and TF_CONFIGs) of a cluster for `strategy`.

  Args:
    strategy: A concrete strategy name (see config.CONCRETE_STRATEGIES).
    num_workers: Worker processes for the multi-worker strategies.
    num_ps: Parameter servers for `parameter_server`.
    argv_for_role: Command line of a `trainer` (runs the training loop) or a
      `server` (a tf.distribute.Server that joins) process.
    host: Address the servers listen on (free ports picked here).
    addresses: Instead, each task type's `host:port`s, as cluster_shape
      counts them (the Ray launcher's, found on the tasks' nodes).
  """
  shape = cluster_shape(strategy, num_workers, num_ps)
  if addresses is None:
    addresses = {task: _addresses(host, count)
                 for task, count in shape.items()}
  if strategy == 'multi_worker_mirrored':
    cluster = {'worker': addresses['worker']}
    return [
        ProcessSpec(f'worker-{i}', argv_for_role('trainer'),
                    {'TF_CONFIG': _tf_config(cluster, 'worker', i)})
        for i in range(num_workers)
    ]
  if strategy == 'parameter_server':
    cluster = {task: addresses[task] for task in ('chief', 'worker', 'ps')}
    # Recommended for ParameterServerStrategy: a failed RPC to a worker is
    # reported to the coordinator instead of being retried forever.
    grpc = {'GRPC_FAIL_FAST': 'use_caller'}
    servers = [
        ProcessSpec(process_name(task, i), argv_for_role('server'),
                    {'TF_CONFIG': _tf_config(cluster, task, i), **grpc},
                    server=True)
        for task in ('ps', 'worker') for i in range(len(cluster[task]))
    ]
    return servers + [
        ProcessSpec('chief', argv_for_role('trainer'),
                    {'TF_CONFIG': _tf_config(cluster, 'chief', 0), **grpc})
    ]
  # Single-worker strategies: one fresh process that must not inherit a
  # cluster from the environment.
  return [ProcessSpec('trainer', argv_for_role('trainer'), {'TF_CONFIG': None})]


def _addresses(host: str, count: int) -> List[str]:
  return [f'{host}:{portpicker.pick_unused_port()}' for _ in range(count)]


def _tf_config(cluster: Dict[str, List[str]], task_type: str,
               index: int) -> str:
  return json.dumps({'cluster': cluster,
                     'task': {'type': task_type, 'index': index}})
