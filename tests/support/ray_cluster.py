"""A real two-node Ray cluster on localhost, for tests and benchmarks.

`ray start --head` plus `ray start --address` as a second node, each in its
own process with 1 CPU and its own custom resource (NODE_RESOURCES), ports
picked free, a private temp dir; every process is ended by its pid on exit
(the `ray start --block` processes, then whatever still names the temp dir).
"""

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, Iterator, List

import portpicker

NODE_RESOURCES = ('node_a', 'node_b')
RAY = os.path.join(os.path.dirname(sys.executable), 'ray')
START_TIMEOUT_S = 240


def _ray_start(args, temp_dir, log_path, env) -> subprocess.Popen:
  ports = {flag: portpicker.pick_unused_port() for flag in (
      '--node-manager-port', '--object-manager-port', '--metrics-export-port',
      '--dashboard-agent-listen-port', '--dashboard-agent-grpc-port',
      '--runtime-env-agent-port')}
  argv = [RAY, 'start', '--block', '--disable-usage-stats',
          f'--temp-dir={temp_dir}', '--node-ip-address=127.0.0.1',
          '--num-cpus=1',
          *[f'{flag}={port}' for flag, port in ports.items()], *args]
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


def _wait_for_nodes(address, count, processes, env):
  """Waits until `count` nodes are alive (asked from a fresh process)."""
  code = ('import ray, sys; ray.init(address=sys.argv[1], logging_level=40); '
          'print(",".join(n["NodeManagerAddress"] for n in ray.nodes() '
          'if n["Alive"]))')
  deadline = time.monotonic() + START_TIMEOUT_S
  while time.monotonic() < deadline:
    for process in processes:
      if process.poll() is not None:
        raise RuntimeError(f'ray start exited: {process.args}')
    try:
      # A loaded machine can take a minute to import Ray and connect: a
      # probe that runs out of time counts as "not yet", within the deadline.
      out = subprocess.run(
          [sys.executable, '-c', code, address], env=env,
          capture_output=True, text=True, check=False,
          timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
      continue
    ips = out.stdout.split()[-1:]
    if out.returncode == 0 and ips and len(ips[0].split(',')) == count:
      return sorted(set(ips[0].split(',')))
    time.sleep(1)
  raise RuntimeError(f'{count} Ray nodes not alive at {address} after '
                     f'{START_TIMEOUT_S} s')


@dataclasses.dataclass
class LocalRayCluster:
  address: str
  # Ray Client's address (ray://), what a KFP pod connects with.
  client_address: str
  temp_dir: str
  # The nodes' addresses, which the tests' proxy settings must bypass.
  node_ips: List[str]

  def no_proxy(self) -> str:
    return ','.join([os.environ.get('no_proxy', '')] + self.node_ips)

  def raylet_pid(self, label: str) -> int:
    """The raylet of the node with resource `label`."""
    import ray  # pylint: disable=g-import-not-at-top
    [port] = [node['NodeManagerPort'] for node in ray.nodes()
              if node['Alive'] and label in node['Resources']]
    flag = f'--node_manager_port={port}'.encode()
    for pid in _session_pids(self.temp_dir):
      try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
          argv = f.read().split(b'\0')
      except OSError:
        continue
      if argv[0].endswith(b'raylet') and flag in argv:
        return pid
    raise RuntimeError(f'No raylet with {flag!r} under {self.temp_dir}')

  def kill_workers(self, label: str) -> List[int]:
    """SIGKILLs every Ray worker process of the node with resource `label`
    (the raylet's children titled `ray::...`: its actors, whose training
    processes die with them; not its agents, with which the raylet would
    die); their pids."""
    raylet = self.raylet_pid(label)
    killed = []
    for entry in os.listdir('/proc'):
      try:
        with open(f'/proc/{entry}/stat') as f:
          parent = int(f.read().rpartition(')')[2].split()[1])
        with open(f'/proc/{entry}/cmdline', 'rb') as f:
          title = f.read()
      except (OSError, ValueError, IndexError):
        continue
      if parent == raylet and title.startswith(b'ray::'):
        os.kill(int(entry), signal.SIGKILL)
        killed.append(int(entry))
    return killed


@contextlib.contextmanager
def local_ray_cluster(log_dir: str,
                      env: Dict[str, str]) -> Iterator[LocalRayCluster]:
  """Yields the running cluster; the nodes' processes get `env`."""
  # Short: Ray's sockets live under it (AF_UNIX paths are limited).
  temp_dir = tempfile.mkdtemp(prefix='ray-', dir='/tmp')
  # No proxy (the GCS emulator's) between the nodes' TF processes.
  env = {k: v for k, v in env.items()
         if k != 'RAY_ADDRESS' and k.lower() not in ('https_proxy',
                                                     'http_proxy')}
  port = portpicker.pick_unused_port()
  address = f'127.0.0.1:{port}'
  client_port = portpicker.pick_unused_port()
  processes = []
  try:
    processes.append(_ray_start(
        ['--head', f'--port={port}', '--include-dashboard=false',
         f'--ray-client-server-port={client_port}',
         f'--resources={json.dumps({NODE_RESOURCES[0]: 1})}'],
        temp_dir, os.path.join(log_dir, 'ray-head.log'), env))
    _wait_for_nodes(address, 1, processes, env)
    processes.append(_ray_start(
        [f'--address={address}',
         f'--resources={json.dumps({NODE_RESOURCES[1]: 1})}'],
        temp_dir, os.path.join(log_dir, 'ray-node.log'), env))
    node_ips = _wait_for_nodes(address, 2, processes, env)
    yield LocalRayCluster(address, f'ray://127.0.0.1:{client_port}',
                          temp_dir, node_ips)
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
    shutil.rmtree(temp_dir, ignore_errors=True)


def node_labels() -> Dict[str, str]:
  """Ray node id -> its NODE_RESOURCES label (needs a connected driver)."""
  import ray  # pylint: disable=g-import-not-at-top
  return {node['NodeID']: label for node in ray.nodes() if node['Alive']
          for label in NODE_RESOURCES if label in node['Resources']}
