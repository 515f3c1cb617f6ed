"""Runs a training cluster's tasks as Ray actors across a Ray cluster's nodes.

HighPerfTrainer's `ray` launcher, a backend of `supervisor.supervise`:
TensorFlow's gRPC runtime still trains (MultiWorkerMirrored all-reduce,
ParameterServer); Ray places, starts and watches the processes. Each attempt
reserves a placement group (one bundle per TF task, SPREAD or PACK), starts
one actor per task in its bundle, asks each actor for its node's IP and a
free port there, builds the TF_CONFIGs from them (`tf_cluster`) and has
every actor run the same task process the local launcher runs. The
parameter-server coordinator (chief) stays where the local launcher runs
it: a child process of the driver (the executor). The attempt's tasks are
watched through ray.wait on the actors' `run` calls; an actor or node that
dies (RayActorError) is a lost task. What follows an attempt (relaunch on
the nodes that remain, resuming from the last checkpoint, or an error) is
the supervisor's decision, the same as for the local launcher. An elastic
cluster (`min_workers`, `membership`) that cannot be placed at full size is
placed with as many workers as fit, down to min_workers, and reports
whether the full size fits again when the supervisor asks. The
actors echo their process's output (Ray forwards it to the driver's log,
prefixed with the task) and the driver pulls it into
`log_dir/attempt-<k>/<task>.log` while they run.

No TFX or TensorFlow import.
"""

import logging as py_logging
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional

from absl import logging
import portpicker
import ray
import ray.util.client
from ray.util import scheduling_strategies

from components.trainer.checkpoint.config import SupervisionConfig
from components.trainer.cluster import local_backend
from components.trainer.common import membership
from components.trainer.cluster.ray_actor import PYTHON
from components.trainer.cluster.ray_actor import RemoteTaskActor
from components.trainer.cluster.ray_actor import TASK_FILE
from components.trainer.cluster import ray_placement
from components.trainer.cluster import supervisor
from components.trainer.cluster import tf_cluster

# The driver's environment variables every task gets (the rest is its
# node's): the import path of the suite and of the user module.
FORWARDED_ENV = ('PYTHONPATH', 'TF_USE_LEGACY_KERAS', 'TF_CPP_MIN_LOG_LEVEL')
CONNECT_TIMEOUT_S = 10.0
# How long the driver waits for an actor to answer a log pull.
LOG_PULL_TIMEOUT_S = 10.0


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
  """distribution.ray.address, else RAY_ADDRESS, else `auto` (the node's own
  cluster)."""
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
        f'No Ray cluster answers at ray.address={address!r} '
        f'({type(e).__name__}: {e}). Start one (`ray start --head`), or set '
        "ray.address / RAY_ADDRESS to its head's host:port.") from e


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
        f'Cannot connect to the Ray cluster at ray.address={address!r}: '
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


def task_nodes(resources: Dict[str, float]) -> List[Dict[str, Any]]:
  """The alive nodes with room, when idle, for one task of `resources`
  (RayConfig.task_resources): a head that schedules no tasks
  (num-cpus 0, as in kubeflow/raycluster.yaml) is not one."""
  task_bundle = ray_placement.bundle(resources)
  return [node for node in ray.nodes() if node['Alive'] and all(
      node['Resources'].get(key, 0) >= value
      for key, value in task_bundle.items())]


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
        "ray.placement='PACK' on a node large enough for all tasks.")


def _placement_error(tasks: int, task_bundle: Dict[str, float],
                     placement_strategy: str) -> PlacementError:
  return PlacementError(
      f'The Ray cluster cannot place {tasks} tasks of {task_bundle} each '
      f'(ray.resources, strategy {placement_strategy}) within '
      f'{ray_placement.PLACEMENT_TIMEOUT_S:g} s; available: '
      f'{ray.available_resources()}. Lower num_workers / num_ps or '
      'ray.resources, or add nodes.')


class _RayAttempt:
  """One launch of the cluster: placement group, actors, processes (a
  supervisor.Attempt)."""

  # Set for an elastic cluster (supervisor.Attempt's membership).
  workers = full_workers = 0
  membership_reason = ''

  def __init__(self, actor_names: List[str], resources: Dict[str, float],
               placement_strategy: str, attempt_dir: str, group=None):
    self.names = list(actor_names)
    self.placement: Dict[str, Dict[str, Any]] = {}
    self._placement_strategy = placement_strategy
    self._actor_names = actor_names
    self._dir = attempt_dir
    self._servers = set()
    self._codes: Dict[str, Optional[int]] = {}
    self._errors: Dict[str, str] = {}
    self._offsets = {name: 0 for name in actor_names}
    self._dead = set()
    self._bundle = bundle = ray_placement.bundle(resources)
    self.group = group or ray_placement.reserve(
        bundle, len(actor_names), placement_strategy,
        ray_placement.PLACEMENT_TIMEOUT_S)
    if self.group is None:
      raise _placement_error(len(actor_names), bundle, placement_strategy)
    self.actors = {
        name: RemoteTaskActor.options(
            num_cpus=resources['cpus'], num_gpus=resources['gpus'],
            memory=int(resources['memory_mb'] * 2**20) or None,
            scheduling_strategy=(
                scheduling_strategies.PlacementGroupSchedulingStrategy(
                    self.group, placement_group_bundle_index=i))
        ).remote(name)
        for i, name in enumerate(actor_names)}
    self.refs: Dict[Any, str] = {}
    # The parameter-server coordinator, a child of this process as with the
    # local launcher.
    self.local: Dict[str, local_backend.RunningProcess] = {}

  def locate(self) -> Dict[str, Dict[str, Any]]:
    """Each task's node and a free port there, with the node's IP."""
    wheres = ray.get([self.actors[n].where.remote()
                      for n in self._actor_names])
    ips = node_ips()
    self.placement = {name: {**where, 'node_ip': ips[where['node_id']]}
                      for name, where in zip(self._actor_names, wheres)}
    return self.placement

  def start(self, specs: List[tf_cluster.ProcessSpec], task_json: str,
            local_task_path: str) -> None:
    self._servers = {spec.name for spec in specs if spec.server}
    for spec in specs:
      if spec.name in self.actors:
        self.refs[self.actors[spec.name].run.remote(
            spec.argv, spec.env, task_json)] = spec.name
        continue
      argv = [sys.executable if a == PYTHON else
              local_task_path if a == TASK_FILE else a for a in spec.argv]
      self.local[spec.name] = local_backend.RunningProcess(
          tf_cluster.ProcessSpec(spec.name, argv, spec.env, spec.server),
          self.log_path(spec.name))
      self.names.append(spec.name)

  def log_path(self, name: str) -> str:
    return os.path.join(self._dir, f'{name}.log')

  def pull_logs(self) -> None:
    """Appends what each live actor's process printed since the last pull."""
    names = [n for n in self._actor_names if n not in self._dead]
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

  def poll(self, wait_s: float) -> List[supervisor.TaskStatus]:
    """Waits on the actors' runs; every task's state, logs pulled."""
    pending = [ref for ref, name in self.refs.items()
               if name not in self._codes]
    ready = []
    if pending:
      ready, _ = ray.wait(pending, num_returns=1, timeout=wait_s)
    else:  # Only the coordinator is left.
      time.sleep(wait_s)
    self.pull_logs()
    for ref in ready:
      name = self.refs[ref]
      try:
        self._codes[name] = ray.get(ref)
      except ray.exceptions.RayError as e:
        # The actor or its node died: the process went with it.
        self._codes[name] = None
        self._errors[name] = f'\n[Ray] {type(e).__name__}: {e}'
    return [supervisor.TaskStatus(
        name, name in self._servers, name not in self._codes,
        self._codes.get(name), self._errors.get(name, ''))
            for name in self.refs.values()] + [
                process.status() for process in self.local.values()]

  def pass_on_notice(self) -> None:
    """SIGTERM to every task's process, the coordinator's included."""
    for name in self._actor_names:
      if name not in self._dead:
        self.actors[name].terminate.remote()
    for process in self.local.values():
      process.terminate()

  def can_grow(self) -> bool:
    """Whether the workers this attempt lacks fit beside it now (a trial
    reservation, released at once)."""
    trial = ray_placement.reserve(
        self._bundle, self.full_workers - self.workers,
        self._placement_strategy, ray_placement.GROW_CHECK_WAIT_S)
    if trial is None:
      return False
    ray.util.remove_placement_group(trial)
    return True

  def stop(self, grace_s: float) -> None:
    """Stops every process, keeps the last of its log, frees the nodes."""
    local_backend.stop_all(list(self.local.values()), grace_s)
    alive = [n for n in self._actor_names if n not in self._dead]
    ray.wait([self.actors[n].stop.remote(grace_s) for n in alive],
             num_returns=len(alive), timeout=grace_s + LOG_PULL_TIMEOUT_S)
    self.pull_logs()
    for actor in self.actors.values():
      ray.kill(actor)
    ray.util.remove_placement_group(self.group)


def run_on_ray(strategy: str, num_workers: int, num_ps: int,
               argv_for_role: Callable[[str], List[str]], task_json: str,
               log_dir: str, *, placement_strategy: str,
               resources: Dict[str, float],
               local_paths: Dict[str, str],
               min_workers: Optional[int] = None,
               poll_interval_s: float = 0.5,
               supervision: SupervisionConfig = SupervisionConfig(),
               read_progress: Optional[supervisor.ReadProgress] = None
              ) -> supervisor.LaunchResult:
  """Runs the cluster on the connected Ray cluster, under the supervisor.

  Args:
    strategy, num_workers, num_ps, argv_for_role: As for
      tf_cluster.cluster_processes; argv may hold PYTHON and TASK_FILE.
    task_json: The training task, written to a file on each task's node.
    log_dir: Gets `attempt-<k>/<task>.log` per task.
    placement_strategy: 'SPREAD' or 'PACK'.
    resources: Per task: cpus, gpus, memory_mb.
    local_paths: Outputs on local paths (what must not span hosts).
    min_workers: Below num_workers: an elastic cluster, placed with as many
      workers as fit down to this many (`membership`).
    poll_interval_s: How often logs are pulled while waiting.
    supervision, read_progress: As for supervisor.supervise.

  Raises:
    What supervisor.supervise raises, and
    PlacementError: The cluster's resources cannot hold the tasks.
    StorageNotSharedError: Local outputs with tasks on several hosts.
  """
  forwarded = {k: os.environ[k] for k in FORWARDED_ENV if k in os.environ}
  elastic = membership.is_elastic(num_workers, min_workers)

  def start(index: int, attempt_dir: str) -> _RayAttempt:
    group, workers, reason = None, num_workers, ''
    if elastic:
      task_bundle = ray_placement.bundle(resources)
      group, workers, reason = ray_placement.elastic_size(
          task_bundle, num_workers, min_workers, placement_strategy)
      if group is None:
        raise _placement_error(min_workers, task_bundle, placement_strategy)
    shape = tf_cluster.cluster_shape(strategy, workers, num_ps)
    # Every task but the parameter-server coordinator (chief) runs on Ray.
    actor_names = [n for n in tf_cluster.task_names(shape) if n != 'chief']
    attempt = _RayAttempt(actor_names, resources, placement_strategy,
                          attempt_dir, group)
    if elastic:
      attempt.workers, attempt.full_workers = workers, num_workers
      attempt.membership_reason = reason
    try:
      placement = attempt.locate()
      if 'chief' in shape:
        # The coordinator runs and listens on this machine, off Ray.
        placement['chief'] = {'node_id': 'driver', 'node_ip': _driver_ip(),
                              'port': portpicker.pick_unused_port()}
      logging.info('Ray attempt %d placement: %s', index, placement)
      check_shared_storage(placement, local_paths)
      addresses = {
          task: [f"{placement[tf_cluster.process_name(task, i)]['node_ip']}:"
                 f"{placement[tf_cluster.process_name(task, i)]['port']}"
                 for i in range(count)] for task, count in shape.items()}
      specs = tf_cluster.cluster_processes(
          strategy, workers, num_ps, argv_for_role, addresses=addresses)
      for spec in specs:
        spec.env = {**forwarded, **spec.env}
      attempt.start(specs, task_json, local_task_path)
    except BaseException:
      attempt.stop(supervision.grace_s)
      raise
    return attempt

  with tempfile.TemporaryDirectory(prefix='hpm-ray-driver-') as local_dir:
    local_task_path = os.path.join(local_dir, tf_cluster.TASK_FILE_NAME)
    with open(local_task_path, 'w') as f:
      f.write(task_json)
    return supervisor.supervise(start, log_dir, supervision,
                                read_progress=read_progress,
                                poll_interval_s=poll_interval_s)
