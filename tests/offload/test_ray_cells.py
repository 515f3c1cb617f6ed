"""Partition streams served by cells in Ray actors on test hosts (network
namespaces with their own addresses, tests/support/netns_hosts.py; a Ray
node of 1 CPU on each of three, the head on the bridge, this process the
driver; the split is a local folder, which the hosts share).

A cell reserves its node's CPU (`cpus_per_cell=1`): two cells are on two
hosts and a replacement lands on the third, the spare. The guarantees of
test_served.py, over the network: the rows of the local reader, exactly;
an actor killed by Ray or a host cut off mid-epoch is found, by Ray (a dead
actor) or by a ping that gets no answer, and its partitions move on at
their consumers' positions.
"""

import time

import pytest
import ray

from components.offload import launch
from components.offload import served
from components.offload import stream
from components.offload.config import OffloadConfig
from components.trainer.cluster import ray_backend
from components.testing import netns_hosts
from components.testing import ray_cluster as ray_cluster_lib
from components.testing import trainer_testing as tt
from tests.support.partition_rows import BATCH, PARTITIONS
from tests.support.partition_rows import served_rows, update_rows

# pylint: disable=protected-access
# A waiting consumer checks its queue every _CHECK_S and pings the cell's
# actor every _PING_EVERY_S; a ping with no answer in _PING_TIMEOUT_S finds
# a cut-off cell.
PING_FINDS_IT_S = (launch._PING_EVERY_S + launch._PING_TIMEOUT_S +
                   stream._CHECK_S)
NO_ANSWER = f'its actor did not answer in {launch._PING_TIMEOUT_S} s'
# pylint: enable=protected-access
# Seconds a loaded machine may add to a detection: the consumer's elements
# in flight, the pool's lock, a slow ping's answer.
DETECTION_SLACK_S = 5


@pytest.fixture(scope='module')
def ray_hosts(tmp_path_factory):
  """The cluster on the test hosts, this process its driver; the nodes'
  addresses bypass the proxy (gRPC to the cells)."""
  reason = netns_hosts.unavailable_reason()
  if reason:
    pytest.skip(f'no test hosts here: {reason}')
  with netns_hosts.netns_hosts(3) as hosts, ray_cluster_lib.local_ray_cluster(
      str(tmp_path_factory.mktemp('ray-hosts-logs')), tt.child_env(),
      hosts=hosts) as cluster, pytest.MonkeyPatch.context() as env:
    for key in ('no_proxy', 'NO_PROXY'):
      env.setenv(key, cluster.no_proxy())
    ray_backend.connect(cluster.address)
    try:
      yield cluster
    finally:
      ray_backend.disconnect()


def _ray_offload(**options) -> served.Offload:
  """Two cells of a whole node's CPU each, as Ray actors."""
  config = OffloadConfig(cells=2, launcher='ray', cpus_per_cell=1, **options)
  return served.Offload(config, PARTITIONS, BATCH)


def _host_of(cell, cluster) -> str:
  """The label of the host the cell's actor runs on, which its address
  must name (not the driver's, not a loopback one)."""
  host = cluster.host_of(cell.pid)
  assert cell.address.rsplit(':', 1)[0] == cluster.hosts[host].address, (
      cell.address, host)
  return host


def _cells(offload: served.Offload):
  return dict(offload.pool._cells)  # pylint: disable=protected-access


@pytest.mark.slow
def test_cells_on_two_hosts_serve_the_rows_of_the_local_reader(
    shards, local_rows, ray_hosts):
  files, order = shards
  offload = _ray_offload()
  try:
    hosts = {name: _host_of(cell, ray_hosts)
             for name, cell in _cells(offload).items()}
    rows = update_rows(files, order, serve_of=lambda _: offload.serve)
  finally:
    offload.close()
  assert rows == local_rows
  assert len(set(hosts.values())) == 2, hosts
  record = offload.describe()
  assert record['partitions'] == {'0': 'cell-0', '1': 'cell-1',
                                  '2': 'cell-0', '3': 'cell-1'}
  assert not record['lost'] and record['replays_dropped'] == 0


@pytest.mark.slow
def test_a_cell_actor_killed_by_ray_moves_its_partitions_to_the_survivor(
    shards, local_rows, ray_hosts):
  """No replacement allowed: cell-0's partitions go to cell-1, at their
  consumers' positions (a new cell on another host: the next test)."""
  files, order = shards
  offload = _ray_offload(lost_after_s=30, max_cell_starts=0)

  def kill(update):
    if update == 9:
      ray.kill(_cells(offload)['cell-0']._actor)  # pylint: disable=protected-access

  rows = served_rows(files, order, offload, each=kill)
  assert rows == local_rows
  record = offload.describe()
  assert [e['event'] for e in record['events']] == [
      'started', 'started', 'lost', 'moved']
  assert record['events'][-1]['partitions'] == [0, 2]
  assert set(record['partitions'].values()) == {'cell-1'}
  # Found by Ray (the ping's answer: a dead actor), long before
  # lost_after_s.
  assert record['lost'] == {'cell-0': 'its actor is gone (ActorDiedError)'}


@pytest.mark.slow
def test_a_cell_host_cut_off_is_found_and_its_partitions_move_to_another(
    shards, local_rows, ray_hosts):
  """cell-0's host loses its link: its actor's node does not answer, and
  lost_after_s (30 s) is far off, so the ping finds it. Last in the module:
  Ray may have declared the host's node dead by the time its link is
  back."""
  files, order = shards
  lost_after_s = 30
  offload = _ray_offload(lost_after_s=lost_after_s, max_cell_starts=1)
  cut = _host_of(_cells(offload)['cell-0'], ray_hosts)
  cut_at = []

  def cut_off(update):
    if update == 9:
      cut_at.append(time.time())
      ray_hosts.hosts[cut].disconnect()

  try:
    rows = update_rows(files, order, serve_of=lambda _: offload.serve,
                       each=cut_off)
    cells = _cells(offload)
    survivor, replacement = (_host_of(cells[name], ray_hosts)
                             for name in ('cell-1', 'cell-2'))
  finally:
    offload.close()
    ray_hosts.hosts[cut].reconnect()
  assert rows == local_rows
  assert len({cut, survivor, replacement}) == 3
  record = offload.describe()
  [lost] = [e for e in record['events'] if e['event'] == 'lost']
  assert lost['cell'] == 'cell-0'
  detected_s = lost['time'] - cut_at[0]
  # Found by the ping, long before lost_after_s.
  bound_s = min(lost_after_s, PING_FINDS_IT_S) + DETECTION_SLACK_S
  print(f'the cut-off cell was found lost {detected_s:.1f} s after its host '
        f'was disconnected (bound {bound_s:g} s): {lost["why"]}')
  assert detected_s < bound_s
  assert lost['why'] == NO_ANSWER
  assert record['partitions'] == {'0': 'cell-2', '1': 'cell-1',
                                  '2': 'cell-2', '3': 'cell-1'}
