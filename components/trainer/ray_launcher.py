"""Runs a training cluster's tasks as Ray actors across a Ray cluster's nodes.

HighPerfTrainer's `ray` launcher: TensorFlow's gRPC runtime still trains
(MultiWorkerMirrored all-reduce, ParameterServer); Ray places, starts,
watches and restarts the processes. Each attempt reserves a placement group
(one bundle per TF task, SPREAD or PACK), starts one actor per task in its
bundle, asks each actor for its node's IP and a free port there, builds the
TF_CONFIGs from them (launcher.cluster_processes) and has every actor run the
same worker process the local launcher runs. The parameter-server
coordinator (chief) stays where the local launcher runs it: a child process
of the driver (the executor). Supervision is Ray's: ray.wait
on the actors' `run` calls; a process that fails, or an actor or node that
dies (RayActorError), tears the attempt down (placement group included) and
the cluster is relaunched on the nodes that remain, up to max_restarts;
training resumes from the last checkpoint as with the local launcher. The
actors echo their process's output (Ray forwards it to the driver's log,
prefixed with the task) and the driver pulls it into
`log_dir/attempt-<k>/<task>.log` while they run.

No TFX or TensorFlow import.
"""

import logging as py_logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from absl import logging
import portpicker
import ray
import ray.util.client
from ray.util import scheduling_strategies

from components.trainer import launcher
from components.trainer import progress

# Placeholders in a task's argv that the actor replaces on its node: its
# Python interpreter and its local copy of the training task file.
PYTHON = '<python>'
TASK_FILE = '<task-file>'
# The driver's environment variables every task gets (the rest is its
# node's): the import path of the suite and of the user module.
FORWARDED_ENV = ('PYTHONPATH', 'TF_USE_LEGACY_KERAS', 'TF_CPP_MIN_LOG_LEVEL')
CONNECT_TIMEOUT_S = 10.0
# How long a placement group may wait for its resources.
PLACEMENT_TIMEOUT_S = 120.0
# How long the driver waits for an actor to answer a log pull.
LOG_PULL_TIMEOUT_S = 10.0
_DONE, _FAILED, _TIMEOUT, _PREEMPTED = ('done', 'failed', 'timeout',
                                       'preempted')


# This process's SIGTERM handler before ray.init replaced it (in a driver's
# main thread, with one that exits); None: not replaced.
_sigterm_before_ray = None


class RayUnreachableError(ConnectionError):
  """No Ray cluster answers at the configured address."""


class PlacementError(RuntimeError):
  """The Ray cluster cannot hold the training cluster."""


class StorageNotSharedError(ValueError):
  """Outputs on local paths while the tasks run on several hosts."""


def resolve_address(address: str) -> str:
  """ray_address, else RAY_ADDRESS, else `auto` (the node's own cluster)."""
  return address or os.environ.get('RAY_ADDRESS') or 'auto'


def _check_reachable(address: str) -> None:
  """A `host:port` (or ray://) address must accept a TCP connection.

  Fails in CONNECT_TIMEOUT_S instead of Ray's own, much longer, retries.
  """
  if address == 'auto':
    return
  host, _, port = address.split('://')[-1].rpartition(':')
  try:
    socket.create_connection((host, int(port)), CONNECT_TIMEOUT_S).close()
  except (OSError, ValueError) as e:
    raise RayUnreachableError(
        f'No Ray cluster answers at ray_address={address!r} '
        f'({type(e).__name__}: {e}). Start one (`ray start --head`), or set '
        "ray_address / RAY_ADDRESS to its head's host:port.") from e


def connect(address: str) -> str:
  """Connects this process to the Ray cluster (once); returns the address."""
  address = resolve_address(address)
  if ray.is_initialized():
    return address
  _check_reachable(address)
  global _sigterm_before_ray
  if threading.current_thread() is threading.main_thread():
    _sigterm_before_ray = signal.getsignal(signal.SIGTERM)
  try:
    ray.init(address=address, log_to_driver=True,
             logging_level=py_logging.WARNING)
  except (ConnectionError, RuntimeError) as e:
    raise RayUnreachableError(
        f'Cannot connect to the Ray cluster at ray_address={address!r}: '
        f'{e}') from e
  return address


def disconnect() -> None:
  """Leaves the Ray cluster; the SIGTERM handler ray.init replaced (its
  own exits the process) is this process's own again."""
  global _sigterm_before_ray
  ray.shutdown()
  if _sigterm_before_ray is not None:
    signal.signal(signal.SIGTERM, _sigterm_before_ray)
    _sigterm_before_ray = None


def alive_nodes() -> List[Dict[str, Any]]:
  return [node for node in ray.nodes() if node['Alive']]


def node_ips() -> Dict[str, str]:
  """Node id -> the address Ray reaches the node at.

  Inside an actor, ray.util.get_node_ip_address() guesses from the default
  route instead, which need not be the address the node was started with.
  """
  return {node['NodeID']: node['NodeManagerAddress'] for node in ray.nodes()}


def _driver_ip() -> str:
  """Where the nodes reach this process (the coordinator's host)."""
  if ray.util.client.ray.is_connected():
    # Ray Client: this process is on no node; the default route's address.
    return ray.util.get_node_ip_address()
  return node_ips()[ray.get_runtime_context().get_node_id()]


def check_shared_storage(placement: Dict[str, Dict[str, Any]],
                         local_paths: Dict[str, str]) -> None:
  """Local paths are only shared by tasks that run on one host."""
  hosts = sorted({where['node_ip'] for where in placement.values()})
  if len(hosts) > 1 and local_paths:
    raise StorageNotSharedError(
        f'The Ray cluster placed the training tasks on {len(hosts)} hosts '
        f'{hosts}, but {local_paths} are local paths that the other hosts '
        'cannot see. Put the pipeline root (or fault_tolerance.backup_root) '
        'on storage every node reaches (gs://, s3://, hdfs://), or use '
        "ray_placement='PACK' on a node large enough for all tasks.")


class _TaskActor:
  """One TF task on its node: its address there, then its process."""

  def __init__(self, name: str):
    self._name = name
    self._log = bytearray()
    self._lock = threading.Lock()
    self._popen: Optional[subprocess.Popen] = None
    self._dir = tempfile.mkdtemp(prefix='hpm-ray-task-')

  def __repr__(self):
    # Ray prefixes the actor's forwarded output with this.
    return self._name

  def where(self) -> Dict[str, Any]:
    return {'node_id': ray.get_runtime_context().get_node_id(),
            'port': portpicker.pick_unused_port(), 'actor_pid': os.getpid()}

  def run(self, argv: List[str], env: Dict[str, Optional[str]],
          task_json: str) -> int:
    """Runs the task's process to its end; returns its exit code."""
    task_path = os.path.join(self._dir, 'training_task.json')
    with open(task_path, 'w') as f:
      f.write(task_json)
    argv = [sys.executable if a == PYTHON else task_path if a == TASK_FILE
            else a for a in argv]
    # Its own process group (stopped as one), killed by the kernel if this
    # actor dies.
    self._popen = subprocess.Popen(
        argv, env=launcher.process_env(env), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=launcher.die_with_parent(os.getpid()))
    for line in self._popen.stdout:
      with self._lock:
        self._log += line
      sys.stdout.write(line.decode('utf-8', errors='replace'))
      sys.stdout.flush()
    return self._popen.wait()

  def read_log(self, offset: int) -> bytes:
    with self._lock:
      return bytes(self._log[offset:])

  def terminate(self) -> None:
    """Passes a preemption notice on: SIGTERM to the process group."""
    if self._popen is not None and self._popen.poll() is None:
      launcher.signal_group(self._popen.pid, signal.SIGTERM)

  def stop(self, grace_s: float) -> None:
    """SIGTERM the process group, SIGKILL it after `grace_s`."""
    if self._popen is None:
      return
    if self._popen.poll() is None:
      launcher.signal_group(self._popen.pid, signal.SIGTERM)
      try:
        self._popen.wait(timeout=grace_s)
      except subprocess.TimeoutExpired:
        pass
    launcher.signal_group(self._popen.pid, signal.SIGKILL)
    self._popen.wait()


# Threaded, so that log pulls and stop run while `run` blocks.
_RemoteTaskActor = ray.remote(max_concurrency=4, max_restarts=0)(_TaskActor)


def _bundle(resources: Dict[str, float]) -> Dict[str, float]:
  bundle = {'CPU': resources['cpus'], 'GPU': resources['gpus'],
            'memory': int(resources['memory_mb'] * 2**20)}
  return {key: value for key, value in bundle.items() if value}


class _Attempt:
  """One launch of the cluster: placement group, actors, processes."""

  def __init__(self, names: List[str], resources: Dict[str, float],
               placement_strategy: str, attempt: int, attempt_dir: str):
    self.names = names
    self.attempt = attempt
    self.attempt_dir = attempt_dir
    self.placement: Dict[str, Dict[str, Any]] = {}
    self.errors: Dict[str, str] = {}
    self._resources = resources
    self._offsets = {name: 0 for name in names}
    self._dead = set()
    bundle = _bundle(resources)
    self.group = ray.util.placement_group([bundle] * len(names),
                                          strategy=placement_strategy)
    ready, _ = ray.wait([self.group.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
      ray.util.remove_placement_group(self.group)
      raise PlacementError(
          f'The Ray cluster cannot place {len(names)} tasks of {bundle} each '
          f'(ray_resources, strategy {placement_strategy}) within '
          f'{PLACEMENT_TIMEOUT_S:g} s; available: '
          f'{ray.available_resources()}. Lower num_workers / num_ps or '
          'ray_resources, or add nodes.')
    self.actors = {
        name: _RemoteTaskActor.options(
            num_cpus=resources['cpus'], num_gpus=resources['gpus'],
            memory=int(resources['memory_mb'] * 2**20) or None,
            scheduling_strategy=(
                scheduling_strategies.PlacementGroupSchedulingStrategy(
                    self.group, placement_group_bundle_index=i))
        ).remote(name)
        for i, name in enumerate(names)}
    self.refs: Dict[Any, str] = {}
    # The parameter-server coordinator, a child of this process as with the
    # local launcher.
    self.local: Dict[str, launcher.RunningProcess] = {}

  def locate(self) -> Dict[str, Dict[str, Any]]:
    """Each task's node and a free port there, with the node's IP."""
    wheres = ray.get([self.actors[n].where.remote() for n in self.names])
    ips = node_ips()
    self.placement = {name: {**where, 'node_ip': ips[where['node_id']]}
                      for name, where in zip(self.names, wheres)}
    return self.placement

  def start(self, specs: List[launcher.ProcessSpec], task_json: str,
            local_task_path: str) -> None:
    for spec in specs:
      if spec.name in self.actors:
        self.refs[self.actors[spec.name].run.remote(
            spec.argv, spec.env, task_json)] = spec.name
        continue
      argv = [sys.executable if a == PYTHON else
              local_task_path if a == TASK_FILE else a for a in spec.argv]
      self.local[spec.name] = launcher.RunningProcess(
          launcher.ProcessSpec(spec.name, argv, spec.env, spec.server),
          self.log_path(spec.name))

  def log_path(self, name: str) -> str:
    return os.path.join(self.attempt_dir, f'{name}.log')

  def pull_logs(self) -> None:
    """Appends what each live actor's process printed since the last pull."""
    names = [n for n in self.names if n not in self._dead]
    refs = {self.actors[n].read_log.remote(self._offsets[n]): n for n in names}
    ready, _ = ray.wait(list(refs), num_returns=len(refs),
                        timeout=LOG_PULL_TIMEOUT_S)
    for ref in ready:
      name = refs[ref]
      try:
        chunk = ray.get(ref)
      except ray.exceptions.RayError:
        self._dead.add(name)
        continue
      with open(self.log_path(name), 'ab') as f:
        f.write(chunk)
      self._offsets[name] += len(chunk)

  def exit_record(self, name: str,
                  code: Optional[int]) -> launcher.ProcessExit:
    tail = launcher.read_tail(self.log_path(name))
    if name in self.errors:
      tail += f'\n[Ray] {self.errors[name]}'
    return launcher.ProcessExit(name, code, self.log_path(name), tail,
                                self.attempt, time.time())

  def terminate(self) -> None:
    """SIGTERM to every task's process, the coordinator's included."""
    for name in self.names:
      if name not in self._dead:
        self.actors[name].terminate.remote()
    for process in self.local.values():
      if process.popen.poll() is None:
        launcher.signal_group(process.popen.pid, signal.SIGTERM)

  def stop(self, grace_s: float) -> None:
    """Stops every process, keeps the last of its log, frees the nodes."""
    launcher.stop_all(list(self.local.values()), grace_s)
    alive = [n for n in self.names if n not in self._dead]
    ray.wait([self.actors[n].stop.remote(grace_s) for n in alive],
             num_returns=len(alive), timeout=grace_s + LOG_PULL_TIMEOUT_S)
    self.pull_logs()
    for actor in self.actors.values():
      ray.kill(actor)
    ray.util.remove_placement_group(self.group)


def _watch(attempt: _Attempt, servers: set, start: float, timeout_s: float,
           poll_interval_s: float, forwarder: launcher.SigtermForwarder
          ) -> Tuple[str, Optional[launcher.ProcessExit]]:
  """Waits on the actors' runs until done, a failure, the time limit, or,
  after SIGTERM, until every trainer has checkpointed and stopped."""
  pending = set(attempt.refs)
  notified = False
  while True:
    if forwarder.received and not notified:
      # Not from the signal handler itself: Ray calls must not interrupt
      # the Ray calls of this loop.
      logging.warning('SIGTERM: passing the preemption notice on to %s',
                      attempt.names + list(attempt.local))
      attempt.terminate()
      notified = True
    ready = []
    if pending:
      ready, _ = ray.wait(list(pending), num_returns=1,
                          timeout=poll_interval_s)
    else:  # Only the coordinator is left.
      time.sleep(poll_interval_s)
    attempt.pull_logs()
    for ref in ready:
      pending.discard(ref)
      name = attempt.refs[ref]
      try:
        code = ray.get(ref)
      except ray.exceptions.RayError as e:
        # The actor or its node died: the process went with it.
        attempt.errors[name] = f'{type(e).__name__}: {e}'
        return _FAILED, attempt.exit_record(name, None)
      if not notified and (code != 0 or name in servers):
        return _FAILED, attempt.exit_record(name, code)
    running = [attempt.refs[r] for r in pending
               if attempt.refs[r] not in servers]
    for name, process in attempt.local.items():
      code = process.popen.poll()
      if code is None:
        running.append(name)
      elif code != 0 and not notified:
        return _FAILED, attempt.exit_record(name, code)
    if not running:
      if notified:
        trainer = next(n for n in attempt.names + list(attempt.local)
                       if n not in servers)
        return _PREEMPTED, attempt.exit_record(trainer, None)
      return _DONE, None
    if timeout_s and time.monotonic() - start > timeout_s:
      return _TIMEOUT, attempt.exit_record(running[0], None)


def _describe(failure: launcher.ProcessExit) -> str:
  code = failure.exit_code
  how = ('died with its Ray actor' if code is None else
         f'was killed by signal {-code}' if code < 0 else
         f'exited with code {code}')
  return (f'Training task {failure.process!r} {how} (attempt '
          f'{failure.attempt}). Log {failure.log_path}, last lines:\n'
          f'{failure.log_tail}')


def run_on_ray(strategy: str, num_workers: int, num_ps: int,
               argv_for_role: Callable[[str], List[str]], task_json: str,
               log_dir: str, *, placement_strategy: str,
               resources: Dict[str, float],
               local_paths: Dict[str, str],
               timeout_s: float = 0, max_restarts: int = 0,
               poll_interval_s: float = 0.5,
               grace_s: float = launcher.DEFAULT_GRACE_S,
               read_progress: Optional[
                   Callable[[], Optional[Dict[str, Any]]]] = None
              ) -> launcher.LaunchResult:
  """Runs the cluster on the connected Ray cluster, relaunching on failure.

  Args:
    strategy, num_workers, num_ps, argv_for_role: As for
      launcher.cluster_processes; argv may hold PYTHON and TASK_FILE.
    task_json: The training task, written to a file on each task's node.
    log_dir: Gets `attempt-<k>/<task>.log` per task.
    placement_strategy: 'SPREAD' or 'PACK'.
    resources: Per task: cpus, gpus, memory_mb.
    local_paths: Outputs on local paths (what must not span hosts).
    timeout_s: Limit for all attempts together; 0 = none.
    max_restarts: Whole-cluster relaunches allowed after a failure.
    poll_interval_s: How often logs are pulled while waiting.
    grace_s: Time between SIGTERM and SIGKILL when stopping processes.
    read_progress: The chief's progress record, logged every few seconds
      as with the local launcher.

  Raises:
    launcher.ClusterFailedError: A task failed and no restart was left.
    launcher.ClusterTimeoutError: The time limit passed.
    launcher.ClusterPreemptedError: SIGTERM arrived; it went on to every
      task's process, which checkpointed and stopped.
    PlacementError: The cluster's resources cannot hold the tasks.
    StorageNotSharedError: Local outputs with tasks on several hosts.
  """
  shape = launcher.cluster_shape(strategy, num_workers, num_ps)
  # Every task but the parameter-server coordinator (chief) runs on Ray.
  names = ([launcher.process_name(task, i)
            for task, count in shape.items() if task != 'chief'
            for i in range(count)] or ['trainer'])
  forwarded = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
  start = time.monotonic()
  restarts: List[launcher.ProcessExit] = []
  attempt_index = 0
  with tempfile.TemporaryDirectory(prefix='hpm-ray-driver-') as local_dir, \
      launcher.SigtermForwarder() as forwarder:
    # The forwarder only records the notice (its `running` stays empty):
    # _watch passes it on, to the actors and the coordinator alike.
    local_task_path = os.path.join(local_dir, 'training_task.json')
    with open(local_task_path, 'w') as f:
      f.write(task_json)
    while True:
      attempt_dir = os.path.join(log_dir, f'attempt-{attempt_index}')
      os.makedirs(attempt_dir, exist_ok=True)
      attempt = _Attempt(names, resources, placement_strategy, attempt_index,
                         attempt_dir)
      try:
        placement = dict(attempt.locate())
        if 'chief' in shape:
          # The coordinator runs and listens on this machine, off Ray.
          placement['chief'] = {'node_id': 'driver', 'node_ip': _driver_ip(),
                                'port': portpicker.pick_unused_port()}
        logging.info('Ray attempt %d placement: %s', attempt_index, placement)
        check_shared_storage(placement, local_paths)
        addresses = {
            task: [f"{placement[launcher.process_name(task, i)]['node_ip']}:"
                   f"{placement[launcher.process_name(task, i)]['port']}"
                   for i in range(count)] for task, count in shape.items()}
        specs = launcher.cluster_processes(strategy, num_workers, num_ps,
                                           argv_for_role, addresses=addresses)
        for spec in specs:
          spec.env = {**forwarded, **spec.env}
        attempt.start(specs, task_json, local_task_path)
        relay = launcher.ProgressRelay(read_progress,
                                       progress.LINE_EVERY_SECONDS,
                                       len(restarts))
        try:
          outcome, failure = _watch(attempt,
                                    {s.name for s in specs if s.server},
                                    start, timeout_s, poll_interval_s,
                                    forwarder)
        finally:
          relay.stop()
      finally:
        attempt.stop(grace_s)
      if outcome == _DONE:
        return launcher.LaunchResult(attempt_index + 1, restarts,
                                     time.monotonic() - start, log_dir,
                                     placement)
      # Read after stop: the log's last lines arrive with it.
      failure = attempt.exit_record(failure.process, failure.exit_code)
      if outcome == _PREEMPTED:
        raise launcher.ClusterPreemptedError(
            'Preempted (SIGTERM): the training processes were told to '
            'checkpoint and stop; a rerun resumes. Log of '
            f'{failure.process} {failure.log_path}, last lines:\n'
            f'{failure.log_tail}', failure, restarts)
      if outcome == _TIMEOUT:
        raise launcher.ClusterTimeoutError(
            f'Training exceeded timeout_s={timeout_s} and was killed. Last '
            f'lines of {failure.process} ({failure.log_path}):\n'
            f'{failure.log_tail}', failure, restarts)
      message = _describe(failure)
      if (len(restarts) >= max_restarts or
          failure.exit_code == launcher.NOT_RETRYABLE_EXIT_CODE):
        raise launcher.ClusterFailedError(message, failure, restarts)
      logging.warning('Restarting the Ray cluster (%d of %d): %s',
                      len(restarts) + 1, max_restarts, message)
      restarts.append(failure)
      attempt_index += 1
