"""A real two-node Ray cluster, for tests and benchmarks.

On localhost (default): `ray start --head` plus `ray start --address` as a
second node, each in its own process with 1 CPU and its own custom resource
(NODE_RESOURCES), ports picked free, a private temp dir; every process is
ended by its pid on exit (the `ray start --block` processes, then whatever
still names the temp dir).

On test hosts (`hosts=`, components/testing/netns_hosts.py): the head runs
at the bridge's address (no CPUs: training never lands there, as on a cluster's
head pod), the driver's host runs no node, and each HOST_RESOURCES node runs
on its own host, with its own address and temp dir; a host's death
(`Host.kill_all`) takes its raylet and every worker with it. The nodes keep
the proxy that `env` names (gs:// through the GCS emulator,
GcsEmulator.reachable_at); on localhost they get none (nothing there uses
gs://).
"""

import collections
import contextlib
import dataclasses
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import portpicker

from components.testing import netns_hosts

NODE_RESOURCES = ('node_a', 'node_b')
# On test hosts: one label per host (the third a spare).
HOST_RESOURCES = NODE_RESOURCES + ('node_c',)
# On test hosts, the head's GCS declares a node dead after 5 failed health
# checks, one a second with 2 s to answer: a cut-off host in about 15 s.
# Ray's defaults (every 3 s, 10 s to answer) took 64 s here.
HOST_HEALTH_CHECKS = {'RAY_health_check_period_ms': '1000',
                      'RAY_health_check_timeout_ms': '2000',
                      'RAY_health_check_failure_threshold': '5'}
RAY = os.path.join(os.path.dirname(sys.executable), 'ray')
START_TIMEOUT_S = 240


def _ray_start(args, temp_dir, log_path, env, node_ip='127.0.0.1',
               host=None, num_cpus=1) -> subprocess.Popen:
  ports = {flag: portpicker.pick_unused_port() for flag in (
      '--node-manager-port', '--object-manager-port', '--metrics-export-port',
      '--dashboard-agent-listen-port', '--dashboard-agent-grpc-port',
      '--runtime-env-agent-port')}
  argv = [RAY, 'start', '--block', '--disable-usage-stats',
          f'--temp-dir={temp_dir}', f'--node-ip-address={node_ip}',
          f'--num-cpus={num_cpus}',
          *[f'{flag}={port}' for flag, port in ports.items()], *args]
  if host is not None:
    # The host's own temp dir where the head's is: Ray's session files (the
    # node's address among them) are per machine.
    own = f'{temp_dir}-{host.name}'
    os.makedirs(own, exist_ok=True)
    argv = host.argv(argv, own_dir=(own, temp_dir))
  with open(log_path, 'wb') as log:
    return subprocess.Popen(argv, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _session_pids(temp_dir: str):
  """Pids of the processes whose command line names our temp dir."""
  pids = []
  for entry in os.listdir('/proc'):
    if not entry.isdigit():
      continue
    try:
      with open(f'/proc/{entry}/cmdline', 'rb') as f:
        if temp_dir.encode() in f.read():
          pids.append(int(entry))
    except OSError:
      pass
  return pids


def _raylet_logs(temp_dir: str, max_lines: int = 15) -> str:
  """The end of every raylet's log under `temp_dir` and the hosts' own
  temp dirs beside it (why a node is not up)."""
  tails = []
  for path in sorted(glob.glob(os.path.join(
      f'{temp_dir}*', 'session_*', 'logs', 'raylet.out'))):
    with open(path, errors='replace') as f:
      lines = f.read().splitlines()[-max_lines:]
    tails.append(f'--- {path}\n' + '\n'.join(lines))
  return '\n'.join(tails)


@contextlib.contextmanager
def _raylet_logs_on_failure(temp_dir: str) -> Iterator[None]:
  try:
    yield
  except RuntimeError as error:
    raise RuntimeError(f'{error}\n{_raylet_logs(temp_dir)}') from error


# Prints the live nodes as JSON: [[address, [resource names]], ...].
_LIVE_NODES = ('import json, ray, sys; '
               'ray.init(address=sys.argv[1], logging_level=40); '
               'print(json.dumps([[n["NodeManagerAddress"], '
               'sorted(n["Resources"])] for n in ray.nodes() if n["Alive"]]))')


def _wait_for(address, processes, env, what, ready):
  """Asks a fresh process for the live nodes until `ready(nodes)` returns
  something other than None, and returns that; fails if one of `processes`
  (the `ray start`s) exits or `what` is not up in time."""
  deadline = time.monotonic() + START_TIMEOUT_S
  while time.monotonic() < deadline:
    for process in processes:
      if process.poll() is not None:
        raise RuntimeError(f'ray start exited: {process.args}')
    try:
      # A loaded machine can take a minute to import Ray and connect: a
      # probe that runs out of time counts as "not yet", within the deadline.
      out = subprocess.run(
          [sys.executable, '-c', _LIVE_NODES, address], env=env,
          capture_output=True, text=True, check=False,
          timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      continue
    lines = out.stdout.splitlines()
    if out.returncode == 0 and lines:
      result = ready(json.loads(lines[-1]))
      if result is not None:
        return result
    time.sleep(1)
  raise RuntimeError(f'{what} not alive at {address} after '
                     f'{START_TIMEOUT_S} s')


def _wait_for_nodes(address, count, processes, env):
  """Waits until `count` nodes are alive; their addresses."""
  return _wait_for(
      address, processes, env, f'{count} Ray nodes',
      lambda nodes: sorted({ip for ip, _ in nodes}) if len(nodes) == count
      else None)


def _wait_for_label(address, label, process, env):
  """Waits until a node with resource `label` is alive."""
  _wait_for(address, [process], env, f'Ray node {label}',
            lambda nodes: True if any(label in names for _, names in nodes)
            else None)


@dataclasses.dataclass
class LocalRayCluster:
  address: str
  # Ray Client's address (ray://), what a KFP pod connects with.
  client_address: str
  temp_dir: str
  # The nodes' addresses, which the tests' proxy settings must bypass.
  node_ips: List[str]
  # What the nodes' processes get; a driver process of the test's, too.
  env: Dict[str, str]
  # On test hosts: each node's label -> its host.
  hosts: Dict[str, netns_hosts.Host] = dataclasses.field(default_factory=dict)
  # On test hosts: the host of a driver on no Ray node.
  driver: Optional[netns_hosts.Host] = None
  # Starts the Ray node `label` again on its host.
  _start_node: Optional[Callable[[str], None]] = dataclasses.field(
      default=None, repr=False)

  def no_proxy(self) -> str:
    return ','.join([os.environ.get('no_proxy', '')] + self.node_ips)

  def kill_host(self, label: str) -> List[int]:
    """The host of node `label` dies: SIGKILL of its raylet, agents and
    workers, every process in its namespace; their pids."""
    return self.hosts[label].kill_all()

  def host_of(self, pid: int) -> str:
    """The label of the test host whose namespace runs `pid`."""
    for label, host in self.hosts.items():
      if pid in host.pids():
        return label
    raise ValueError(f'pid {pid} runs on no test host')

  def restart_node(self, label: str) -> None:
    """`ray start` again on the host of node `label` (once its old node is
    gone, as after a reboot); returns when the node is alive."""
    self._start_node(label)


@contextlib.contextmanager
def local_ray_cluster(log_dir: str, env: Dict[str, str],
                      hosts: Optional[netns_hosts.Hosts] = None
                      ) -> Iterator[LocalRayCluster]:
  """Yields the running cluster; the nodes' processes get `env`. With
  `hosts`, the head at the bridge's address and each node on its own
  host."""
  # Short: Ray's sockets live under it (AF_UNIX paths are limited).
  temp_dir = tempfile.mkdtemp(prefix='ray-', dir='/tmp')
  head_ip = hosts.bridge_address if hosts else '127.0.0.1'
  env = {k: v for k, v in env.items() if k != 'RAY_ADDRESS'}
  if hosts:
    # gs:// through the proxy `env` names (the GCS emulator, relayed on the
    # bridge); Ray's and TF's gRPC between the hosts bypass it.
    no_proxy = ','.join([env.get('no_proxy', ''), head_ip] +
                        [host.address for host in hosts.hosts])
    env.update(no_proxy=no_proxy, NO_PROXY=no_proxy)
  else:
    # No proxy: Ray places tasks (a parameter-server chief on the driver)
    # at this machine's own address, which no no_proxy lists.
    env = {k: v for k, v in env.items()
           if k.lower() not in ('https_proxy', 'http_proxy')}
  port = portpicker.pick_unused_port()
  address = f'{head_ip}:{port}'
  client_port = portpicker.pick_unused_port()
  head_args = ['--head', f'--port={port}', '--include-dashboard=false',
               f'--ray-client-server-port={client_port}']
  if hosts:
    if len(hosts.hosts) > len(HOST_RESOURCES):
      raise ValueError(f'at most {len(HOST_RESOURCES)} hosts')
    nodes = list(zip(HOST_RESOURCES, hosts.hosts))
    head_cpus = 0
  else:
    # The head is the first node.
    head_args.append(f'--resources={json.dumps({NODE_RESOURCES[0]: 1})}')
    nodes = [(NODE_RESOURCES[1], None)]
    head_cpus = 1
  processes = []
  try:
    processes.append(_ray_start(
        head_args, temp_dir, os.path.join(log_dir, 'ray-head.log'),
        {**env, **HOST_HEALTH_CHECKS} if hosts else env,
        node_ip=head_ip, num_cpus=head_cpus))
    with _raylet_logs_on_failure(temp_dir):
      _wait_for_nodes(address, 1, processes, env)
    def start_node(label, host, start=0):
      processes.append(_ray_start(
          [f'--address={address}', f'--resources={json.dumps({label: 1})}'],
          temp_dir,
          os.path.join(log_dir, f'ray-{label}-{start}.log'), env,
          node_ip=host.address if host else head_ip, host=host))

    # One at a time: nodes that start together in one session folder can
    # pick the same socket names and fail to register.
    for count, (label, host) in enumerate(nodes, start=2):
      start_node(label, host)
      with _raylet_logs_on_failure(temp_dir):
        node_ips = _wait_for_nodes(address, count, processes, env)
    by_label = {label: host for label, host in nodes if host}
    restarts = collections.Counter()

    def restart(label):
      restarts[label] += 1
      start_node(label, by_label[label], restarts[label])
      with _raylet_logs_on_failure(temp_dir):
        _wait_for_label(address, label, processes[-1], env)

    yield LocalRayCluster(address, f'ray://{head_ip}:{client_port}',
                          temp_dir, node_ips, env, by_label,
                          hosts.driver if hosts else None, restart)
  finally:
    for process in reversed(processes):
      if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
          process.wait(timeout=30)
        except subprocess.TimeoutExpired:
          process.kill()
          process.wait()
    for pid in _session_pids(temp_dir):
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    for folder in [temp_dir, *glob.glob(f'{temp_dir}-*')]:
      shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def connected(cluster: LocalRayCluster) -> Iterator[LocalRayCluster]:
  """This process as `cluster`'s driver (a benchmark's; the tests' fixture
  also restores the environment): the nodes' addresses bypass the proxy."""
  from components.trainer.cluster import ray_backend  # pylint: disable=g-import-not-at-top
  os.environ['no_proxy'] = os.environ['NO_PROXY'] = cluster.no_proxy()
  ray_backend.connect(cluster.address)
  try:
    yield cluster
  finally:
    ray_backend.disconnect()


class _CpuHolder:
  """Holds its node's CPU (a host with no room for a worker)."""

  def ready(self):
    return True


@contextlib.contextmanager
def holding_cpus(labels: Sequence[str]) -> Iterator[None]:
  """One CPU of each node in `labels` held by an actor (other work that
  leaves no room there), released at the end; needs a connected driver."""
  import ray  # pylint: disable=g-import-not-at-top
  holders = [ray.remote(num_cpus=1, resources={label: 1})(_CpuHolder).remote()
             for label in labels]
  ray.get([holder.ready.remote() for holder in holders])
  try:
    yield
  finally:
    for holder in holders:
      ray.kill(holder)


def node_labels() -> Dict[str, str]:
  """Ray node id -> its label (needs a connected driver)."""
  import ray  # pylint: disable=g-import-not-at-top
  return {node['NodeID']: label for node in ray.nodes() if node['Alive']
          for label in HOST_RESOURCES if label in node['Resources']}
