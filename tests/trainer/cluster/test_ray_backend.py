"""launcher='ray': HighPerfTrainer's clusters as Ray actors (real Ray).

Fast: the Ray options' validation, the storage rule for clusters over
several hosts, the `auto` rule for a Ray cluster, an unreachable address.
Slow, on real Ray clusters (tests/support/ray_cluster.py).

On three test hosts (network namespaces with their own addresses,
tests/support/netns_hosts.py; the head at the bridge's address, a fourth
namespace for a driver on no Ray node), with data, checkpoints and outputs on
gs:// (the suite's GCS emulator, which the hosts reach at the bridge's
address; `run_on_ray` refuses local outputs across hosts, as the executor
passes them; only the id log, the test's own record of what trained, is a
local file the hosts share):
- MultiWorkerMirrored with 2 workers on two hosts, two addresses, each
  reading its partition from a tf.data service cell on the third host
  (`offload`), trains to the same weights, bit for bit, as the local
  launcher;
- the same from a driver process on its own host through Ray Client
  (ray://, as from a Kubeflow pod);
- one training hit in turn by SIGKILL of a worker's actor process, the death
  of its host (its raylet and every process in its namespace) and a
  partition of its host (seen by the supervisor's hang_timeout_s), relaunched
  each time, bit for bit, every example trained once;
- an elastic cluster that runs on with one worker and grows back to two;
- SIGTERM to the driver (a preemption notice) reaches every host's worker
  through its actor, they checkpoint and stop, and a rerun resumes with no
  step lost;
- the taxi pipeline on a gs:// root with launcher='ray' and `auto` spreads
  over the hosts and is blessed.

On two nodes of localhost: `auto`'s node count; parameter_server (ps and
workers on Ray, the coordinator here) trains the exact step count.

Beside the local launcher's baseline it shares: the same cluster with each
worker's partition served by a tf.data service cell (`offload`).
"""

import dataclasses
import importlib.metadata
import json
import os
import random
import signal
import sys
import threading
import time
import uuid

import numpy as np
import portpicker
import pytest
import tensorflow as tf

from components import storage
from components.trainer.checkpoint.config import SupervisionConfig
from components.trainer.cluster import ray_backend
from components.trainer.cluster import supervisor
from components.trainer.cluster import tf_cluster
from components.trainer.config import DistributionConfig
from components.trainer.strategies import choice as strategy_lib
from tests.support import lanes
from tests.support import mlmd
from components.testing import netns_hosts
from components.testing import ray_cluster as ray_cluster_lib
from tests.support import ray_training
from components.testing import trainer_testing as tt

NUM_EXAMPLES = tt.NUM_EXAMPLES  # in the `data` fixture
STEP = 'step/.ATTRIBUTES/VARIABLE_VALUE'
ITERATIONS = 'optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE'
CLUSTER_TIMEOUT_S = ray_training.CLUSTER_TIMEOUT_S
PREEMPTION_SAVED_AT = 'checkpointed_runs/.ATTRIBUTES/VARIABLE_VALUE'
NODES = ray_cluster_lib.NODE_RESOURCES


def _error(**values) -> str:
  with pytest.raises(ValueError) as error:
    DistributionConfig.from_dict(values)
  return str(error.value)


# ------------------------------------------------------------------ fast


@pytest.mark.parametrize('values,expected', [
    ({'ray': {'placement': 'STRICT_SPREAD'}},
     ["ray.placement='STRICT_SPREAD'", "('SPREAD', 'PACK')"]),
    ({'ray': {'resources': {'cpu': 1}}},
     ["['cpu']", "['cpus', 'gpus', 'memory_mb']"]),
    ({'ray': {'resources': {'gpus': -1}}},
     ["ray.resources['gpus']=-1", '>= 0']),
    ({'ray': {'resources': {'cpus': True}}}, ["ray.resources['cpus']=True"]),
    ({'ray': {'resources': {'cpus': 0}}}, ['reserves nothing', 'memory_mb']),
    ({'ray': {'resources': [1]}}, ['ray.resources=[1]', 'must be a dict']),
    ({'ray': {'address': 6379}}, ['ray.address=6379', 'host:port']),
    ({'ray': ['head:6379']}, ["ray=['head:6379'] must be an object"]),
    ({'strategy': 'parameter_server', 'num_workers': 2},
     ["launcher='ray' needs num_ps >= 1", 'num_ps=0']),
])
def test_bad_ray_options_are_named(values, expected):
  message = _error(launcher='ray', **values)
  for text in expected:
    assert text in message, message


def test_ray_options_need_launcher_ray():
  message = _error(launcher='local', ray={'placement': 'PACK'})
  assert "'placement': 'PACK'" in message
  assert "a launcher on a Ray cluster (('ray',))" in message
  assert "launcher='local'" in message


def test_ray_options_round_trip():
  config = DistributionConfig.from_dict(
      {'launcher': 'ray', 'ray': {
          'address': 'head:6379', 'placement': 'PACK',
          'resources': {'gpus': 1, 'memory_mb': 512}},
       'strategy': 'multi_worker_mirrored', 'num_workers': 2})
  assert DistributionConfig.from_json(config.to_json()) == config
  assert config.ray.task_resources() == {'cpus': 1, 'gpus': 1,
                                         'memory_mb': 512}
  assert config.expected_replicas() == 2


def test_auto_spreads_over_the_ray_nodes():
  config = DistributionConfig.from_dict({'launcher': 'ray'})
  resolved, reason = strategy_lib.resolve(
      config, strategy_lib.Environment(ray_nodes=3))
  assert resolved.strategy == 'multi_worker_mirrored'
  assert resolved.num_workers == 3
  assert 'Ray cluster of 3 nodes' in reason
  # One node, or another launcher: nothing to spread over.
  assert strategy_lib.resolve(config, strategy_lib.Environment(
      ray_nodes=1))[0].strategy == 'one_device'
  local = DistributionConfig.from_dict({})
  assert strategy_lib.resolve(local, strategy_lib.Environment(
      ray_nodes=3))[0].strategy == 'one_device'


def test_local_paths_cannot_span_hosts():
  placement = {'worker-0': {'node_ip': '10.0.0.1'},
               'worker-1': {'node_ip': '10.0.0.2'}}
  with pytest.raises(ray_backend.StorageNotSharedError) as error:
    ray_backend.check_shared_storage(placement,
                                      {'checkpoints': '/data/ckpt'})
  message = str(error.value)
  assert "['10.0.0.1', '10.0.0.2']" in message
  assert "'checkpoints': '/data/ckpt'" in message and 'gs://' in message
  # One host shares its local disk; shared storage spans hosts.
  ray_backend.check_shared_storage(
      {'worker-0': {'node_ip': '10.0.0.1'},
       'worker-1': {'node_ip': '10.0.0.1'}}, {'checkpoints': '/data/ckpt'})
  ray_backend.check_shared_storage(placement, {})


def test_unreachable_cluster_fails_fast_naming_the_address():
  address = f'127.0.0.1:{portpicker.pick_unused_port()}'
  with pytest.raises(ray_backend.RayUnreachableError) as error:
    ray_backend.connect(address)
  assert f'ray.address={address!r}' in str(error.value)


def test_raycluster_manifest_runs_the_locked_ray_in_the_pipeline_image():
  """Static check of kubeflow/raycluster.yaml (no Kubernetes here)."""
  import yaml  # pylint: disable=g-import-not-at-top
  with open(os.path.join(tt.REPO_ROOT, 'kubeflow', 'raycluster.yaml')) as f:
    manifest = yaml.safe_load(f)
  # The manifest runs the TFX 1.16 lane's image (its default), and the
  # installed lane's Ray (what the test venv runs) is that lock's.
  assert lanes.pins(lanes.installed())['ray'] == importlib.metadata.version(
      'ray')
  assert manifest['apiVersion'] == 'ray.io/v1'
  assert manifest['kind'] == 'RayCluster'
  assert manifest['spec']['rayVersion'] == lanes.pins('1.16')['ray']
  groups = [manifest['spec']['headGroupSpec']] + manifest['spec'][
      'workerGroupSpecs']
  for group in groups:
    [container] = group['template']['spec']['containers']
    assert container['image'].endswith('/tfx-hpm:0.1.0'), container
    assert {'name': 'TF_USE_LEGACY_KERAS', 'value': '1'} in container['env']
  ports = {p['containerPort'] for p in manifest['spec']['headGroupSpec'][
      'template']['spec']['containers'][0]['ports']}
  # What kubeflow.runner --ray-address names (Ray Client).
  assert 10001 in ports


# --------------------------------------------------- real Ray cluster


@pytest.fixture(scope='module')
def ray_cluster(tmp_path_factory):
  with ray_cluster_lib.local_ray_cluster(
      str(tmp_path_factory.mktemp('ray-logs')), tt.child_env()) as cluster:
    yield cluster


@pytest.fixture(scope='module')
def ray_hosts_cluster(tmp_path_factory, gcs_emulator_server):
  """A Ray node on each of three test hosts, the head on the driver side;
  gs:// on every host goes to the GCS emulator, at the bridge's address."""
  reason = netns_hosts.unavailable_reason()
  if reason:
    pytest.skip(f'no test hosts here: {reason}')
  with netns_hosts.netns_hosts(3) as hosts, gcs_emulator_server.reachable_at(
      hosts.bridge_address) as gcs_env:
    with ray_cluster_lib.local_ray_cluster(
        str(tmp_path_factory.mktemp('ray-hosts-logs')),
        {**tt.child_env(), **gcs_env}, hosts=hosts) as cluster:
      yield cluster


@pytest.fixture(scope='module')
def gcs_data(gcs_bucket, data):
  """The `data` fixture's files, copied to gs://."""
  return tt.copy_dataset(data, f'{gcs_bucket}/ray-hosts-data')


@pytest.fixture
def gcs_root(gcs_bucket, request):
  """A fresh gs:// folder for one test's outputs."""
  return f'{gcs_bucket}/{request.node.name}-{uuid.uuid4().hex[:8]}'


def _driver_env(monkeypatch, cluster):
  """The tasks' environment here; the nodes' addresses bypass the proxy."""
  for key, value in tt.child_env().items():
    monkeypatch.setenv(key, value)
  for key in ('no_proxy', 'NO_PROXY'):
    monkeypatch.setenv(key, cluster.no_proxy())


def _connected(cluster, monkeypatch):
  """This process connected to `cluster` as the driver, with the tasks'
  environment, for the test."""
  _driver_env(monkeypatch, cluster)
  handler = signal.getsignal(signal.SIGTERM)
  ray_backend.connect(cluster.address)
  yield cluster
  ray_backend.disconnect()
  # ray.init's SIGTERM handler (sys.exit) is gone with the connection.
  assert signal.getsignal(signal.SIGTERM) is handler


@pytest.fixture
def ray_driver(ray_cluster, monkeypatch):
  yield from _connected(ray_cluster, monkeypatch)


@pytest.fixture
def ray_hosts_driver(ray_hosts_cluster, monkeypatch):
  yield from _connected(ray_hosts_cluster, monkeypatch)


def _run_on_ray_acting(task, root, act, **options):
  """ray_training.run_on_ray while a thread calls `act(id log records)` until it
  returns True (it acted: a kill, a signal)."""

  finished = threading.Event()

  def watch():
    while not finished.wait(0.05):
      if act(tt.read_id_log(task.hparams['id_log'])):
        return

  thread = threading.Thread(target=watch, daemon=True)
  thread.start()
  try:
    return ray_training.run_on_ray(task, root, **options)
  finally:
    finished.set()
    thread.join()


@pytest.fixture(scope='module')
def local_baseline(tmp_path_factory, data):
  """The final tensors of tt.mwms_task under the local launcher."""
  root = str(tmp_path_factory.mktemp('local-baseline'))
  task = tt.mwms_task(root, data)
  with pytest.MonkeyPatch.context() as env:
    for key, value in tt.child_env().items():
      env.setenv(key, value)
    tt.run_cluster(task, root, max_restarts=0, timeout_s=CLUSTER_TIMEOUT_S)
  return tt.final_tensors(task)


def _assert_equal_tensors(actual, expected, ignore=()):
  assert actual[STEP] == 16 and actual[ITERATIONS] == 16
  assert sorted(actual) == sorted(expected)
  for name, value in expected.items():
    if name not in ignore:
      np.testing.assert_array_equal(actual[name], value, err_msg=name)


@pytest.mark.slow
def test_mwms_over_two_ray_hosts_matches_the_local_launcher(
    tmp_path, gcs_data, gcs_root, ray_hosts_driver, local_baseline):
  """Each worker's partition is served by a cell of its own, a Ray actor
  on the spare host (`offload`, launcher 'ray'): the same weights."""
  root = str(tmp_path)
  task = tt.mwms_task(gcs_root, gcs_data, id_log=str(tmp_path / 'ids.jsonl'))
  task = dataclasses.replace(task, distribution={
      **task.distribution, 'offload': {'cells': 1, 'launcher': 'ray',
                                       'cpus_per_cell': 0.5}})
  launch = ray_training.run_on_ray(task, root)

  assert launch.attempts == 1 and not launch.relaunches
  assert sorted(launch.placement) == ['worker-0', 'worker-1']
  # Two hosts, two addresses: the recorded placement says so.
  _assert_on_two_hosts(launch.placement, ray_hosts_driver)
  for name in launch.placement:
    with open(os.path.join(root, 'logs', 'attempt-0', f'{name}.log')) as f:
      text = f.read()
    # The worker's own output (TensorFlow joining the cluster) came back
    # through Ray: the strategy's own line, on TF 2.16 and 2.21 alike (TF
    # 2.21's C++ coordination agent no longer logs at INFO here).
    assert 'MultiWorkerMirroredStrategy with cluster_spec' in text, text
    assert 'Traceback' not in text, text
  result = tt.read_result(task)
  assert result.steps == 16 and result.num_replicas == 2
  _assert_equal_tensors(tt.final_tensors(task), local_baseline)
  # The chief's cell served its partition from a host of its own.
  offload = result.loop.offload
  assert offload['partitions'] == {'0': 'cell-0'} and not offload['lost']
  cell_host = offload['cells']['cell-0'].rsplit(':', 1)[0]
  assert cell_host not in {where['node_ip']
                           for where in launch.placement.values()}


def _assert_on_two_hosts(placement, cluster, dead=()):
  """The tasks ran on two different live hosts (not the driver side)."""
  labels = ray_cluster_lib.node_labels()
  hosts = {labels[where['node_id']] for where in placement.values()}
  ips = {where['node_ip'] for where in placement.values()}
  assert len(hosts) == 2 and not hosts & set(dead), placement
  assert ips == {cluster.hosts[label].address for label in hosts}, placement


def _training_processes(cluster):
  """Pids of training processes (tests.support.trainer_testing) on the
  cluster's hosts."""
  found = []
  for host in cluster.hosts.values():
    for pid in host.pids():
      try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
          if b'components.testing.trainer_testing' in f.read():
            found.append(pid)
      except OSError:
        pass
  return found


def _proc_stat(pid):
  """(state, parent pid) of a process, None once it is gone."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      fields = f.read().rpartition(')')[2].split()
  except FileNotFoundError:
    return None
  return fields[0], int(fields[1])


@pytest.mark.slow
def test_killed_actor_dead_host_and_partition_the_cluster_resumes_each_time(
    tmp_path, gcs_data, gcs_root, ray_hosts_driver, local_baseline,
    run_seed):
  """One training, three faults in turn, each in the attempt the one before
  it relaunched, each on worker-1: SIGKILL of its actor process; the death
  of its host (SIGKILL of the raylet and every process in the namespace: the
  spare host stands in); its host's link taken down (a partition: its peer
  hangs in a collective). The first two are seen by Ray (a lost actor, a
  dead node) or by the peer's aborted collective, whichever first; the
  partition by the supervisor: no new step for hang_timeout_s, under TF's
  heartbeat timeout and Ray's health checks. Each time the cluster is
  relaunched and resumes. With one host dead and one cut off, the last
  relaunch waits for room: the link comes back, the cut-off host's old Ray
  processes end by themselves (Ray declared its node dead), a node starts
  there again and the training finishes on it. The result is the
  uninterrupted run's, bit for bit, every example trained once."""
  cluster = ray_hosts_driver
  root = str(tmp_path)
  task = tt.mwms_task(gcs_root, gcs_data, id_log=str(tmp_path / 'ids.jsonl'),
                      max_restarts=3)
  rng = random.Random(run_seed)
  # Each after a checkpoint (every 4 steps) of its attempt.
  steps = {'actor': rng.randrange(5, 7)}
  steps['host'] = rng.randrange(steps['actor'] + 2, 11)
  steps['partition'] = rng.randrange(steps['host'] + 2, 15)
  print(f'faults at steps {steps} (TFX_HPM_TEST_SEED={run_seed})')
  faults = []  # (fault, pids of the attempt it hit, the host it hit)
  restored = {}

  def fault(kind, records):
    """Applies `kind` to worker-1 of the attempt after the last fault."""
    seen = {pid for _, pids, _ in faults for pid in pids}
    mine = [r for r in records if r['pid'] not in seen and r['replica'] == 1]
    if not mine or mine[-1]['step'] < steps[kind]:
      return False
    pid = mine[-1]['pid']
    host = cluster.host_of(pid)
    faults.append((kind, {r['pid'] for r in records} - seen, host))
    if kind == 'actor':
      # The worker process's parent is its Ray actor.
      restored['worker'] = pid
      os.kill(_proc_stat(pid)[1], signal.SIGKILL)
    elif kind == 'host':
      restored['host_pids'] = cluster.kill_host(host)
    else:
      cluster.hosts[host].disconnect()
    return True

  def restore(host):
    """Link back once Ray declared the host's node dead; its old processes
    end by themselves; a new node starts there."""
    start = time.monotonic()
    while host in ray_cluster_lib.node_labels().values():
      time.sleep(0.5)
    restored['detected_s'] = time.monotonic() - start
    cluster.hosts[host].reconnect()
    deadline = time.monotonic() + 60
    while cluster.hosts[host].pids() and time.monotonic() < deadline:
      time.sleep(0.5)
    restored['left_behind'] = cluster.hosts[host].pids()
    cluster.restart_node(host)

  def act(records):
    for kind in ('actor', 'host', 'partition'):
      if len(faults) == list(steps).index(kind):
        if fault(kind, records) and kind == 'partition':
          restore(faults[-1][2])
          return True
        return False
    return True

  # As in tests/trainer/cluster/test_faults.py: under TF's own 10 s heartbeat
  # timeout (and Ray's 15 s here), far over a step and a save.
  launch = _run_on_ray_acting(task, root, act, hang_timeout_s=4)

  print(f'the partition\'s node declared dead by Ray after '
        f'{restored["detected_s"]:.1f} s')
  assert [kind for kind, _, _ in faults] == list(steps)
  assert restored['host_pids'] and launch.attempts == 4
  assert not restored['left_behind']
  actor_restart, host_restart, partition_restart = launch.relaunches
  # Seen from Ray: the actor died.
  assert actor_restart.process == 'worker-1'
  assert actor_restart.exit_code is None and '[Ray]' in actor_restart.log_tail
  assert 'Actor' in actor_restart.log_tail
  # The host's death: seen by whichever came first, Ray (the actor lost
  # with its host), the peer, whose collective TensorFlow aborts (its
  # connection reset), or the stall.
  assert (host_restart.exit_code is None and
          '[Ray]' in host_restart.log_tail) or any(
              seen in host_restart.log_tail for seen in (
                  'Collective ops is aborted', 'No new training step')), (
                      host_restart)
  # The partition: the chief hangs in its all-reduce; the supervisor killed
  # the attempt on the stall.
  assert 'No new training step' in partition_restart.log_tail, (
      partition_restart)
  dead = faults[1][2]
  # The last attempt ran on two hosts again: the cut-off one, back, among
  # them; the dead one not.
  _assert_on_two_hosts(launch.placement, cluster, dead=[dead])
  assert not cluster.hosts[dead].pids() and not _training_processes(cluster)
  result = tt.read_result(task)
  assert result.steps == 16 and result.num_replicas == 2
  events = result.resume_events
  assert [e['event'] for e in events] == ['resumed'] * 3, events
  assert all(e['from_step'] % 4 == 0 for e in events), events
  for event, step in zip(events, steps.values()):
    assert event['from_step'] <= step + 1, (events, steps)
  # Bit for bit what the uninterrupted cluster trained.
  _assert_equal_tensors(tt.final_tensors(task), local_baseline)
  tt.assert_each_id_once(task, 16, replicas=2)
  # The actor's worker process died with it (PR_SET_PDEATHSIG).
  stat = _proc_stat(restored['worker'])
  assert stat is None or stat[0] in 'ZX', stat


def _elastic_task(root, data, **hparams):
  """tt.mwms_task as an elastic cluster: min_workers=1 of 2."""
  task = tt.mwms_task(root, data, max_restarts=1)
  return dataclasses.replace(
      task, hparams={**task.hparams, **hparams}, distribution={
          **task.distribution, 'launcher': 'ray', 'min_workers': 1})


@pytest.mark.slow
@pytest.mark.extended
def test_elastic_cluster_without_a_spare_host_runs_on_and_grows_back(
    tmp_path, data, gcs_data, gcs_root, ray_hosts_driver, run_seed):
  """min_workers=1 of 2, no spare host (any third host's CPU is held): the
  host of worker-1 dies at a seeded step; the relaunch cannot place 2
  workers and continues with 1 (accumulating 2 micro-batches), held in its
  first step until the host is back (so it cannot finish first); the
  supervisor's check finds room, the worker checkpoints and stops, and the
  cluster is relaunched with 2. Every update trains the
  examples of an uninterrupted 2-worker run, and the final weights are that
  run's, bit for bit (each update sums the same two per-replica gradients;
  see tests/trainer/cluster/test_faults.py' elastic test)."""
  cluster = ray_hosts_driver
  baseline = _elastic_task(str(tmp_path / 'baseline'), data)
  tt.run_cluster(baseline, str(tmp_path / 'baseline'), max_restarts=0)
  hold = tmp_path / 'hold'
  task = _elastic_task(gcs_root, gcs_data, id_log=str(tmp_path / 'ids.jsonl'),
                       step_sleep_seconds=0.75, hold_file=str(hold))
  kill_step = random.Random(run_seed).randrange(5, 7)
  print(f'host death at step {kill_step} (TFX_HPM_TEST_SEED={run_seed})')
  live = sorted(set(ray_cluster_lib.node_labels().values()))
  assert len(live) >= 2, live
  done = {}

  def act(records):
    if 'host' not in done:
      mine = [r for r in records if r['replica'] == 1]
      if not mine or mine[-1]['step'] < kill_step:
        return False
      done['host'] = cluster.host_of(mine[-1]['pid'])
      done['seen'] = {r['pid'] for r in records}
      hold.touch()
      cluster.kill_host(done['host'])
      return False
    if not any(r['pid'] not in done['seen'] for r in records):
      return False
    # The one-worker attempt trains (held): the host comes back.
    while done['host'] in ray_cluster_lib.node_labels().values():
      time.sleep(0.5)
    cluster.restart_node(done['host'])
    hold.unlink()
    return True

  try:
    with ray_cluster_lib.holding_cpus(live[2:]):
      launch = _run_on_ray_acting(
          task, str(tmp_path), act, min_workers=1,
          rescale_check_s=2)
  finally:
    hold.unlink(missing_ok=True)

  assert launch.attempts == 3
  lost, rescaled = launch.relaunches
  assert (lost.exit_code is None and '[Ray]' in lost.log_tail) or (
      'Collective ops is aborted' in lost.log_tail), lost
  assert rescaled.exit_code == 75, rescaled
  assert (lost.cause, rescaled.cause) == ('failure', 'membership')
  shrink, grow = launch.membership
  assert (shrink.attempt, shrink.from_workers, shrink.to_workers) == (1, 2, 1)
  assert 'places only 1 of 2 workers' in shrink.reason
  assert (grow.attempt, grow.from_workers, grow.to_workers) == (2, 1, 2)
  assert 'room for all 2 workers again' in grow.reason
  _assert_on_two_hosts(launch.placement, cluster)
  assert not _training_processes(cluster)

  records = tt.read_id_log(task.hparams['id_log'])
  # The one-worker attempt's process wrote the first records after the
  # host died; it trained replica 0 only.
  single = next(r['pid'] for r in records if r['pid'] not in done['seen'])
  assert {r['replica'] for r in records if r['pid'] == single} == {0}

  def attempt_of(pid):
    return 0 if pid in done['seen'] else 1 if pid == single else 2
  assert tt.ids_by_update(records, attempt_of) == tt.ids_by_update(
      tt.read_id_log(baseline.hparams['id_log']), lambda pid: 0)
  _assert_equal_tensors(tt.final_tensors(task), tt.final_tensors(baseline),
                        ignore=(PREEMPTION_SAVED_AT,))




@pytest.mark.slow
@pytest.mark.extended
def test_sigterm_reaches_the_workers_through_ray_and_a_rerun_resumes(
    tmp_path, gcs_data, gcs_root, ray_hosts_driver, local_baseline):
  """Across hosts: the notice reaches each host's worker, none is left."""
  cluster = ray_hosts_driver
  root = str(tmp_path)
  task = tt.mwms_task(gcs_root, gcs_data, id_log=str(tmp_path / 'ids.jsonl'))

  def preempt_the_driver_at_step_5(records):
    if not records or records[-1]['step'] < 5:
      return False
    # What a pod's preemption notice is: SIGTERM to the executor.
    os.kill(os.getpid(), signal.SIGTERM)
    return True

  with pytest.raises(supervisor.ClusterPreemptedError, match='SIGTERM'):
    _run_on_ray_acting(task, root, preempt_the_driver_at_step_5)
  # Both workers checkpointed at the notice's step and exited "preempted";
  # no training process is left on any host.
  assert tt.read_result(task).preempted is True
  assert not _training_processes(cluster)

  launch = ray_training.run_on_ray(task, root)
  assert launch.attempts == 1
  _assert_on_two_hosts(launch.placement, cluster)
  events = tt.read_result(task).resume_events
  assert [e['event'] for e in events] == ['preempted', 'resumed'], events
  assert events[1]['from_step'] == events[0]['at_step'] >= 5
  assert events[1]['steps_lost'] == 0
  # All but the step TF's PreemptionCheckpointHandler saved at, which it
  # keeps in the checkpoint (0 in a run it never saved).
  tensors = tt.final_tensors(task)
  assert tensors[PREEMPTION_SAVED_AT] == events[0]['at_step']
  _assert_equal_tensors(tensors, local_baseline,
                        ignore=[PREEMPTION_SAVED_AT])
  keys = [(r['step'], r['replica'])
          for r in tt.read_id_log(task.hparams['id_log'])]
  # Both workers stopped at the same checkpointed step: none ran twice.
  assert sorted(keys) == [(s, r) for s in range(16) for r in (0, 1)]


@pytest.mark.slow
@pytest.mark.extended
def test_a_driver_on_its_own_host_trains_over_ray_client_as_a_kubeflow_pod(
    tmp_path, gcs_data, gcs_root, ray_hosts_driver, local_baseline):
  """ray://: the driver a process on the driver's host, on no Ray node, as
  a Kubeflow pod's executor is (kubeflow.runner --ray-address); the head's
  Ray Client server speaks for it. The workers land on two other hosts."""
  cluster = ray_hosts_driver
  task = tt.mwms_task(gcs_root, gcs_data, id_log=str(tmp_path / 'ids.jsonl'))
  task_path = tmp_path / 'task.json'
  task.save(str(task_path))
  result_path = tmp_path / 'launch.json'
  driver = cluster.driver.run(
      [sys.executable, '-m', 'tests.support.ray_training',
       cluster.client_address, str(task_path), str(tmp_path),
       str(result_path)], env=cluster.env, cwd=tt.REPO_ROOT,
      capture_output=True, text=True, timeout=CLUSTER_TIMEOUT_S + 60)
  assert driver.returncode == 0, driver.stderr[-3000:]
  with open(result_path) as f:
    launch = json.load(f)
  assert launch['driver_address'] == cluster.driver.address
  assert launch['attempts'] == 1
  _assert_on_two_hosts(launch['placement'], cluster)
  assert not cluster.driver.pids()
  _assert_equal_tensors(tt.final_tensors(task), local_baseline)
  tt.assert_each_id_once(task, 16, replicas=2)


# As in tests/trainer/test_pipeline.py: 600 steps beat the majority class of the
# 2,000-row sample's eval split (~0.767); the Evaluator blesses only above.
ACCURACY_BOUND = 0.78
TAXI_STEPS = 600


@pytest.mark.slow
@pytest.mark.extended
def test_taxi_pipeline_on_gcs_spreads_over_the_ray_hosts_and_is_blessed(
    tmp_path, gcs_root, taxi_upstream, taxi_sample_dir, ray_hosts_cluster,
    monkeypatch):
  """`auto` with launcher='ray' on the test hosts, the pipeline root on
  gs://: MultiWorkerMirrored with one worker per host that can hold a task
  (the head, with no CPUs, is none), each on its own address."""
  # pylint: disable=g-import-not-at-top
  import ray
  from tfx import v1 as tfx
  from components import HighPerfTrainer
  from pipelines import taxi_pipeline
  from components.testing import taxi_runs
  # pylint: enable=g-import-not-at-top
  cluster = ray_hosts_cluster
  _driver_env(monkeypatch, cluster)
  # The default ray_address.
  monkeypatch.setenv('RAY_ADDRESS', cluster.address)
  # ExampleGen .. Transform's outputs on gs:// too; MLMD stays a local file.
  taxi_runs.start_moved(taxi_upstream, f'{gcs_root}/upstream', str(tmp_path))

  def make_trainer(inputs: taxi_pipeline.TrainerInputs):
    return HighPerfTrainer(
        module_file=inputs.module_file, examples=inputs.examples,
        transform_graph=inputs.transform_graph, schema=inputs.schema,
        train_args=tfx.proto.TrainArgs(num_steps=inputs.train_steps),
        eval_args=tfx.proto.EvalArgs(num_steps=inputs.eval_steps),
        distribution={'launcher': 'ray'},
        fault_tolerance={'timeout_s': CLUSTER_TIMEOUT_S})

  handler = signal.getsignal(signal.SIGTERM)
  run = taxi_runs.run(gcs_root, taxi_sample_dir, make_trainer,
                      train_steps=TAXI_STEPS, eval_steps=5,
                      accuracy_threshold=ACCURACY_BOUND,
                      metadata_dir=str(tmp_path), from_trainer=True)
  # The executor disconnected, and this process's SIGTERM handling is its
  # own again (ray.init's exits the process).
  assert signal.getsignal(signal.SIGTERM) is handler
  assert not ray.is_initialized()

  assert run.blessed is True, run.format()
  assert run.metrics['binary_accuracy'] >= ACCURACY_BOUND
  model_run = mlmd.latest_artifact(str(tmp_path / 'metadata.db'), 'ModelRun')
  assert model_run.uri.startswith(gcs_root)
  # The workers read the upstream's copies in the bucket.
  task = storage.read_json(
      os.path.join(model_run.uri, tf_cluster.TASK_FILE_NAME))
  assert all(path.startswith(gcs_root)
             for path in task['train_files'] + task['eval_files']), task
  props = model_run.custom_properties
  assert props['strategy'].string_value == 'multi_worker_mirrored'
  assert props['launcher'].string_value == 'ray'
  assert props['ray_address'].string_value == cluster.address
  placement = json.loads(props['ray_placement'].string_value)
  workers = props['num_replicas'].int_value
  assert f'Ray cluster of {workers} nodes' in props[
      'strategy_reason'].string_value
  assert workers >= 2 and sorted(placement) == [
      f'worker-{i}' for i in range(workers)], placement
  # One worker per host, each at its host's address.
  ips = [where['node_ip'] for where in placement.values()]
  host_ips = {host.address for host in cluster.hosts.values()}
  assert len(set(ips)) == workers and set(ips) <= host_ips, placement
  assert storage.read_json(os.path.join(
      model_run.uri, 'distribution_decision.json'))['placement'] == placement
  logs = tf.io.gfile.listdir(
      os.path.join(model_run.uri, 'cluster_logs', 'attempt-0'))
  assert sorted(logs) == [f'worker-{i}.log' for i in range(workers)]
  assert not _training_processes(cluster)


@pytest.mark.slow
@pytest.mark.extended
def test_parameter_server_over_ray_trains_the_exact_steps(
    tmp_path, data, ray_driver):
  """ps and workers as actors; the coordinator is this process's child."""
  del ray_driver
  root = str(tmp_path)
  task = tt.make_task(root, data, strategy='parameter_server', num_workers=2,
                      num_ps=1, train_steps=30, per_replica_batch_size=2,
                      fault_tolerance={'save_every_steps': 10})
  argv = {'trainer': [ray_backend.PYTHON, '-m',
                      'components.testing.trainer_testing',
                      ray_backend.TASK_FILE],
          'server': [ray_backend.PYTHON, '-m',
                     'components.trainer.process.entry',
                     '--task', ray_backend.TASK_FILE, '--role', 'server']}
  # Three Ray tasks on the two 1-CPU nodes.
  launch = ray_backend.run_on_ray(
      'parameter_server', 2, 1, argv.get, task.to_json(),
      os.path.join(root, 'logs'), placement_strategy='SPREAD',
      resources={'cpus': 0.5, 'gpus': 0, 'memory_mb': 0}, local_paths={},
      supervision=SupervisionConfig(timeout_s=CLUSTER_TIMEOUT_S))

  assert launch.attempts == 1
  assert sorted(launch.placement) == ['chief', 'ps-0', 'worker-0', 'worker-1']
  assert launch.placement['chief']['node_id'] == 'driver'
  labels = ray_cluster_lib.node_labels()
  assert {labels[launch.placement[name]['node_id']]
          for name in ('ps-0', 'worker-0', 'worker-1')} == set(NODES)
  result = tt.read_result(task)
  assert result.steps == 30 and result.loop.exported is True
  tensors = tt.final_tensors(task)
  assert tensors[STEP] == 30 and tensors[ITERATIONS] == 30
  with open(os.path.join(root, 'logs', 'attempt-0', 'ps-0.log')) as f:
    assert 'ps-0 serving at' in f.read()


@pytest.mark.slow
@pytest.mark.parametrize('min_workers', [None, 1])
def test_a_cluster_that_cannot_be_placed_fails_naming_what_it_asked(
    tmp_path, data, ray_hosts_driver, monkeypatch, min_workers):
  """64 CPUs per task fit no node: the launch fails naming the request, after
  one reservation per size it may take (fixed: 2 workers; elastic: 2, then
  min_workers), never a second one at the same size."""
  del ray_hosts_driver
  for name, seconds in (('PLACEMENT_TIMEOUT_S', 1.0),
                        ('FULL_SIZE_WAIT_S', 0.5)):
    monkeypatch.setattr(ray_backend.ray_placement, name, seconds)
  reserved = []
  reserve = ray_backend.ray_placement.reserve

  def counted(task_bundle, count, *args):
    reserved.append(count)
    return reserve(task_bundle, count, *args)
  monkeypatch.setattr(ray_backend.ray_placement, 'reserve', counted)
  task = tt.mwms_task(str(tmp_path), data)
  with pytest.raises(ray_backend.PlacementError) as e:
    ray_training.run_on_ray(task, str(tmp_path), cpus=64,
                            min_workers=min_workers)
  tasks = min_workers or 2
  assert f"cannot place {tasks} tasks of {{'CPU': 64}} each" in str(e.value)
  assert 'within 1 s' in str(e.value)
  assert reserved == ([2, 1] if min_workers else [2])


@pytest.mark.slow
def test_mwms_with_offload_cells_trains_what_its_own_readers_do(
    tmp_path, data, local_baseline):
  """Two local workers, each reading its partition from a tf.data service
  cell of its own: the weights of the local readers' run, bit for bit."""
  root = str(tmp_path)
  task = tt.mwms_task(root, data)
  task = dataclasses.replace(task, distribution={
      **task.distribution, 'offload': {'cells': 1}})
  with pytest.MonkeyPatch.context() as env:
    for key, value in tt.child_env().items():
      env.setenv(key, value)
    tt.run_cluster(task, root, max_restarts=0, timeout_s=CLUSTER_TIMEOUT_S)
  _assert_equal_tensors(tt.final_tensors(task), local_baseline)
  offload = tt.read_result(task).loop.offload
  # The chief's partition (of 2) came from its cell.
  assert offload['partitions'] == {'0': 'cell-0'} and not offload['lost']
