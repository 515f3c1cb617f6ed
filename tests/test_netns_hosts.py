"""The test hosts (tests/support/netns_hosts.py): real namespaces, real links.

Each host (the driver's too) reaches the others and the bridge on its own
address, reaches nothing beyond the subnet, is cut off while its link is down
and back when it is up, and dies with every process in it; nothing is left
after the block, and hosts a killed run left behind are removed by the next
one.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from components.testing import netns_hosts

pytestmark = pytest.mark.skipif(
    bool(netns_hosts.unavailable_reason()),
    reason=f'no test hosts here: {netns_hosts.unavailable_reason()}')

_LISTEN = ('import socket, sys; s = socket.socket(); '
           's.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(); print("up", '
           'flush=True)\nwhile True: s.accept()[0].close()')
_CONNECT = ('import socket, sys; s = socket.socket(); s.settimeout(1.0)\n'
            'try:\n s.connect((sys.argv[1], int(sys.argv[2]))); print("ok")\n'
            'except OSError as e: print(type(e).__name__, e.errno)')
PORT = 5999


def _connect(argv, address):
  return subprocess.run(argv([sys.executable, '-c', _CONNECT, address,
                              str(PORT)]),
                        capture_output=True, text=True, check=True
                        ).stdout.strip()


def _listen(host):
  server = host.popen([sys.executable, '-c', _LISTEN, str(PORT)],
                      stdout=subprocess.PIPE, text=True)
  assert server.stdout.readline().strip() == 'up'
  return server


def _names():
  out = subprocess.run([netns_hosts.IP, 'netns', 'list'], capture_output=True,
                       text=True, check=True).stdout
  return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_hosts_reach_each_other_only_and_die_whole():
  here = lambda argv: argv  # pylint: disable=unnecessary-lambda-assignment
  with netns_hosts.netns_hosts(2) as hosts:
    a, b = hosts.hosts
    driver = hosts.driver
    assert len({a.address, b.address, driver.address,
                hosts.bridge_address}) == 4
    server = _listen(b)
    assert _connect(a.argv, b.address) == 'ok'
    assert _connect(driver.argv, b.address) == 'ok'
    assert _connect(here, b.address) == 'ok'
    # No route beyond the subnet: a host knows only its link's.
    routes = a.run([netns_hosts.IP, 'route', 'show'], capture_output=True,
                   text=True, check=True).stdout.splitlines()
    assert routes == [f'{hosts.subnet} dev eth0 proto kernel scope link '
                      f'src {a.address} '], routes
    # A partition: the link down drops packets; up again, it is back.
    a.disconnect()
    assert _connect(a.argv, b.address) == 'TimeoutError None'
    a.reconnect()
    deadline = time.monotonic() + 10
    while _connect(a.argv, b.address) != 'ok':
      assert time.monotonic() < deadline, 'link did not come back'
    # The host dies: every process in it.
    assert server.pid in b.pids()
    assert server.pid in b.kill_all()
    assert server.wait(timeout=10) == -signal.SIGKILL and not b.pids()
    survivor = _listen(a)
    names = {a.name, b.name, driver.name}
    assert names <= _names()
  assert survivor.wait(timeout=10) == -signal.SIGKILL
  assert not names & _names()
  links = subprocess.run([netns_hosts.IP, '-br', 'link'], capture_output=True,
                         text=True, check=True).stdout
  assert hosts.bridge not in links and a.link not in links


def test_hosts_of_a_killed_run_are_removed_by_the_next():
  code = ('import time; from components.testing import netns_hosts\n'
          'with netns_hosts.netns_hosts(1) as h:\n'
          ' print(h.hosts[0].name, h.bridge, flush=True); time.sleep(600)')
  run = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE,
                         text=True, cwd=os.path.dirname(os.path.dirname(
                             os.path.abspath(__file__))))
  name, bridge = run.stdout.readline().split()
  run.kill()  # no teardown
  run.wait()
  assert name in _names()
  netns_hosts.remove_orphans()
  assert name not in _names()
  links = subprocess.run([netns_hosts.IP, '-br', 'link'], capture_output=True,
                         text=True, check=True).stdout
  assert bridge not in links
