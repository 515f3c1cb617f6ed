"""Test hosts: Linux network namespaces with their own addresses, on a bridge.

`netns_hosts(count)` makes `count` hosts for one test run, plus one more
for a driver that is on no Ray node (a Kubeflow pod's executor, connecting
with ray://):
- each is a network namespace (`ip netns`) with its own loopback and one
  interface, `eth0`, whose address is on a private /24 picked at random
  among those no route of this machine covers;
- every `eth0` is one end of a veth pair whose other end is plugged into a
  bridge in this (the root) namespace; the bridge holds the subnet's first
  address, where pytest (an in-process driver: a running process cannot
  move into a namespace), the Ray head and the GCS emulator run;
- no host has a default route and this namespace does not forward
  (`net.ipv4.ip_forward` is left alone), so their traffic stays between the
  addresses of this subnet.

A host runs programs inside its namespace (`Host.popen`); its death kills
every process in the namespace (`Host.kill_all`); a partition takes its link
down (`Host.disconnect`, `Host.reconnect`). Everything is torn down on exit:
the processes of each namespace by pid, then the namespaces and the bridge by
name. A namespace's name holds its creator's pid, so hosts left by a run that
was killed before its teardown are removed by the next one.
`unavailable_reason()` says why hosts cannot be made here (no root, no
iproute2, namespaces refused), for a skip that names it.
"""

import contextlib
import dataclasses
import ipaddress
import os
import random
import re
import shutil
import signal
import subprocess
import time
import uuid
from typing import Iterator, List, Optional, Sequence, Tuple

IP = shutil.which('ip') or '/usr/sbin/ip'
# Private /16s whose /24s the hosts may use.
_SUBNET_POOL = [ipaddress.ip_network(f'10.{a}.0.0/16') for a in range(200, 250)]


# hpm<creator pid>-<tag>-<index>; the bridge is hpmbr<tag>.
_NAME = re.compile(r'^hpm(?P<pid>\d+)-(?P<tag>[0-9a-f]{6})-\d+$')


class NetnsError(RuntimeError):
  """An `ip` command failed while making or changing the test hosts."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
  result = subprocess.run([IP, *args], capture_output=True, text=True,
                          check=False)
  if check and result.returncode:
    raise NetnsError(f'ip {" ".join(args)}: {result.stderr.strip()}')
  return result


def unavailable_reason() -> Optional[str]:
  """None if namespaces can be made here, else why not."""
  if os.geteuid() != 0:
    return 'test hosts need root (ip netns add)'
  if not os.path.exists(IP):
    return 'test hosts need iproute2 (the `ip` command)'
  probe = f'hpm-probe-{uuid.uuid4().hex[:8]}'
  result = _ip('netns', 'add', probe, check=False)
  if result.returncode:
    return f'ip netns add failed: {result.stderr.strip()}'
  _ip('netns', 'del', probe, check=False)
  return None


def _free_subnet() -> ipaddress.IPv4Network:
  """A /24 from the pool that no route here covers or overlaps."""
  routes = [ipaddress.ip_network(line.split()[0], strict=False)
            for line in _ip('-4', 'route', 'show', 'table', 'all').stdout
            .splitlines()
            if line and line.split()[0][0].isdigit()]
  rng = random.Random(uuid.uuid4().int)
  for _ in range(200):
    pool = rng.choice(_SUBNET_POOL)
    subnet = list(pool.subnets(new_prefix=24))[rng.randrange(256)]
    if not any(subnet.overlaps(route) for route in routes):
      return subnet
  raise NetnsError('no free private /24 for the test hosts')


def _namespace_pids(name: str) -> List[int]:
  return [int(p) for p in _ip('netns', 'pids', name).stdout.split()]


def _kill_namespace(name: str) -> List[int]:
  """SIGKILLs every process in namespace `name`; their pids. Repeats until
  none is left (a dying parent may still fork)."""
  killed = []
  for _ in range(50):
    pids = _namespace_pids(name)
    if not pids:
      return killed
    for pid in pids:
      with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    killed += pids
    time.sleep(0.1)
  raise NetnsError(f'processes left in {name}: {_namespace_pids(name)}')


@dataclasses.dataclass
class Host:
  """One test host: a network namespace and its link to the bridge."""
  name: str  # the namespace
  address: str  # eth0's address inside it
  link: str  # the veth end on the bridge, in the root namespace

  def argv(self, argv: Sequence[str],
           own_dir: Optional[Tuple[str, str]] = None) -> List[str]:
    """`argv` run inside this host's namespace.

    With `own_dir=(source, target)`, the process and its children see
    `source`'s files at `target`: the host's own disk area where the
    machine's is shared (bound in the mount namespace `ip netns exec` makes
    for each command, so nothing else sees it).
    """
    if own_dir:
      argv = ['sh', '-c', 'mount --bind "$1" "$2" && shift 2 && exec "$@"',
              'sh', *own_dir, *argv]
    return [IP, 'netns', 'exec', self.name, *argv]

  def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen(self.argv(argv), **kwargs)

  def run(self, argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(self.argv(argv), **kwargs)

  def pids(self) -> List[int]:
    """Every process in the namespace."""
    return _namespace_pids(self.name)

  def kill_all(self) -> List[int]:
    """SIGKILLs every process in the namespace (the host dies); their
    pids."""
    return _kill_namespace(self.name)

  def disconnect(self) -> None:
    """Takes the host's link down: a partition (its packets are dropped)."""
    _ip('link', 'set', self.link, 'down')

  def reconnect(self) -> None:
    _ip('link', 'set', self.link, 'up')


@dataclasses.dataclass
class Hosts:
  """The hosts, the driver's host, their bridge and its address."""
  hosts: List[Host]
  driver: Host
  bridge: str
  bridge_address: str
  subnet: str


def _remove(names: Sequence[str], bridge: str) -> None:
  """Kills every process in the namespaces, deletes them and the bridge."""
  for name in names:
    with contextlib.suppress(NetnsError):
      _kill_namespace(name)
    _ip('netns', 'del', name, check=False)
  _ip('link', 'del', bridge, check=False)


def remove_orphans() -> None:
  """Removes the hosts of runs whose process is gone."""
  for line in _ip('netns', 'list').stdout.splitlines():
    match = _NAME.match(line.split()[0]) if line.strip() else None
    if match and not os.path.exists(f'/proc/{match["pid"]}'):
      _remove([match.string], f'hpmbr{match["tag"]}')


@contextlib.contextmanager
def netns_hosts(count: int) -> Iterator[Hosts]:
  """Yields `count` hosts and the driver's on a new bridge; removes
  everything on exit."""
  remove_orphans()
  tag = uuid.uuid4().hex[:6]
  subnet = _free_subnet()
  addresses = list(subnet.hosts())
  bridge = f'hpmbr{tag}'
  hosts = []
  try:
    _ip('link', 'add', bridge, 'type', 'bridge')
    _ip('addr', 'add', f'{addresses[0]}/{subnet.prefixlen}', 'dev', bridge)
    _ip('link', 'set', bridge, 'up')
    for i in range(count + 1):
      host = Host(f'hpm{os.getpid()}-{tag}-{i}', str(addresses[i + 1]),
                  f'hpmv{tag}{i}')
      peer = f'hpmp{tag}{i}'
      _ip('netns', 'add', host.name)
      hosts.append(host)
      _ip('link', 'add', host.link, 'type', 'veth', 'peer', 'name', peer)
      _ip('link', 'set', peer, 'netns', host.name)
      _ip('link', 'set', host.link, 'master', bridge, 'up')
      _ip('-n', host.name, 'link', 'set', peer, 'name', 'eth0')
      _ip('-n', host.name, 'addr', 'add',
          f'{host.address}/{subnet.prefixlen}', 'dev', 'eth0')
      _ip('-n', host.name, 'link', 'set', 'eth0', 'up')
      _ip('-n', host.name, 'link', 'set', 'lo', 'up')
    yield Hosts(hosts[:count], hosts[count], bridge, str(addresses[0]),
                str(subnet))
  finally:
    _remove([host.name for host in hosts], bridge)
