"""Node death on real hosts: uninterrupted vs one host lost, with and without
a spare host (elastic).

    python -m benchmarks.bench_elastic

Three test hosts (components/testing/netns_hosts.py: network namespaces, each
its own address) run a Ray node each, the head at the bridge's address; data,
checkpoints and outputs are on gs:// (a GCS emulator, relayed on the bridge,
components/testing/gcs_emulator.py), as across real hosts. The same
MultiWorkerMirrored training (2 workers through the Ray launcher, SPREAD, the
id-recording model of components/testing/id_recording_module.py, which logs the
example ids of every step) runs:

- uninterrupted (fixed size, and elastic with `min_workers=1`: the elastic
  data order is defined by the global batch, so it has its own reference);
- **spare host**: at a seeded step, worker-1's host dies (SIGKILL of its
  raylet and every process in its namespace); the cluster is relaunched at
  full size on the spare host;
- **no spare host, elastic**: the third host's CPU is held; the same death;
  the relaunch continues with 1 worker (2 micro-batches per update); the host
  comes back after the one-worker attempt trained a few steps, and the
  supervisor grows the cluster back to 2.

Measured per run: wall time; for each fault, the seconds from the fault
(the kill, or the host's node being back) to the first training step of the
next attempt (detection + relaunch + restore), seen in the id log; the steps
redone (trained by the failed attempt and again after it); and the examples
lost or repeated: per update, the ids of the final trajectory against the
uninterrupted run's.
"""

import collections
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Dict, List

import portpicker

from benchmarks import harness
from benchmarks import report
from components.trainer.checkpoint.config import SupervisionConfig
from components.trainer.cluster import ray_backend
from components.testing import gcs_emulator
from components.testing import netns_hosts
from components.testing import ray_cluster
from components.testing import trainer_testing as tt

EXAMPLES = 256
WORKERS = 2
BATCH = 2  # per replica: 64 steps per pass over the data
TRAIN_STEPS = 48
SAVE_EVERY = 8
STEP_SLEEP_S = 0.2
KILL_STEPS = (17, 24)
# Steps the one-worker attempt trains before the dead host comes back.
STEPS_BEFORE_RETURN = 4
SEED = 20261202
RECOVERY_GOAL_S = 30.0
TIMEOUT_S = 900


def _task(root: str, data: Dict[str, str], elastic: bool, id_log: str):
  """The training, its outputs under `root` (gs://), its id log local."""
  task = tt.make_task(
      root, data, strategy='multi_worker_mirrored', num_workers=WORKERS,
      train_steps=TRAIN_STEPS, per_replica_batch_size=BATCH, eval_steps=1,
      fault_tolerance={'save_every_steps': SAVE_EVERY, 'max_restarts': 2},
      hparams={'step_sleep_seconds': STEP_SLEEP_S}, id_log=id_log)
  task.distribution = {**task.distribution, 'launcher': 'ray',
                       **({'min_workers': 1} if elastic else {})}
  return task


class _Watcher:
  """Polls the id log: when each process first trained, and `act(records)`
  until it returns True."""

  def __init__(self, task, act: Callable[[List[dict]], bool]):
    self._path = task.hparams['id_log']
    self._act = act
    self.first_seen: Dict[int, float] = {}
    self._done = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def _run(self):
    acting = True
    while not self._done.wait(0.05):
      records = tt.read_id_log(self._path) if os.path.exists(
          self._path) else []
      now = time.time()
      for record in records:
        self.first_seen.setdefault(record['pid'], now)
      if acting and self._act(records):
        acting = False

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._done.set()
    self._thread.join()


def _launch(task, logs: str, act=lambda records: False) -> Dict[str, Any]:
  argv = [ray_backend.PYTHON, '-m', 'components.testing.trainer_testing',
          ray_backend.TASK_FILE]
  elastic = 'min_workers' in task.distribution
  began = time.time()
  with _Watcher(task, act) as watcher:
    launch = ray_backend.run_on_ray(
        'multi_worker_mirrored', WORKERS, 0, lambda role: argv,
        task.to_json(), logs,
        placement_strategy='SPREAD',
        resources={'cpus': 1, 'gpus': 0, 'memory_mb': 0}, local_paths={},
        min_workers=1 if elastic else None,
        supervision=SupervisionConfig(timeout_s=TIMEOUT_S, max_restarts=2,
                                      rescale_check_s=2))
  ended = time.time()
  records = tt.read_id_log(task.hparams['id_log'])
  for record in records:  # Any process that trained after the last poll.
    watcher.first_seen.setdefault(record['pid'], ended)
  return {'wall_s': ended - began, 'launch': launch,
          'first_seen': watcher.first_seen, 'records': records}


def _attempt_of(run: Dict[str, Any]) -> Dict[int, int]:
  """pid -> its attempt: 0 before the fault, 1 after it, 2 after the host
  came back (the one-worker attempt started before that)."""
  faults = run.get('faults') or {}
  back_at = faults.get('back_at', float('inf'))
  return {pid: 0 if pid in faults.get('seen', (pid,)) else
          1 if seen_at < back_at else 2
          for pid, seen_at in run['first_seen'].items()}


def _compare(run: Dict[str, Any], reference: Dict[str, Any]) -> Dict[str, Any]:
  """Steps redone and examples lost or repeated against `reference`."""
  attempt_of = _attempt_of(run)
  trained = collections.defaultdict(set)
  for record in run['records']:
    if record['replica'] == 0:
      trained[attempt_of[record['pid']]].add(record['step'])
  redone = sum(len(trained[a] & set().union(*(
      trained[b] for b in trained if b > a))) for a in trained)
  mine = tt.ids_by_update(run['records'], attempt_of.get)
  theirs = tt.ids_by_update(reference['records'], lambda pid: 0)
  off = 0
  for step in set(mine) | set(theirs):
    ours = collections.Counter(mine.get(step, []))
    reference_ids = collections.Counter(theirs.get(step, []))
    off += sum(((ours - reference_ids) + (reference_ids - ours)).values())
  return {'redone': redone, 'off': off, 'attempt_of': attempt_of}


def _first_step_after(run, attempt: int, attempt_of) -> float:
  return min(t for pid, t in run['first_seen'].items()
             if attempt_of.get(pid) == attempt)


def measure(work: str, bucket: str, cluster) -> Dict[str, Dict[str, Any]]:
  """The four runs, one after the other, on one Ray cluster; outputs in
  `bucket`, logs and id logs under `work`."""
  data = tt.copy_dataset(
      tt.write_id_dataset(os.path.join(work, 'ids'), EXAMPLES), f'{bucket}/ids')
  rng = random.Random(SEED)
  runs = {}

  def run(name, elastic, act=lambda records: False):
    folder = name.replace(', ', '-').replace(' ', '-')
    local = os.path.join(work, folder)
    os.makedirs(local)
    task = _task(f'{bucket}/{folder}', data, elastic,
                 os.path.join(local, 'ids.jsonl'))
    return _launch(task, os.path.join(local, 'logs'), act)

  for name, elastic in (('uninterrupted', False),
                        ('uninterrupted, elastic', True)):
    runs[name] = run(name, elastic)
    print(f'[bench_elastic] {name}: {runs[name]["wall_s"]:.1f} s', flush=True)

  def killer(kill_step, faults, then=None):
    def act(records):
      if 'host' not in faults:
        mine = [r for r in records if r['replica'] == 1]
        if not mine or mine[-1]['step'] < kill_step:
          return False
        faults['host'] = cluster.host_of(mine[-1]['pid'])
        faults['seen'] = {r['pid'] for r in records}
        faults['killed_at'] = time.time()
        cluster.kill_host(faults['host'])
        return then is None
      return then(records)
    return act

  def back_on_its_host(faults):
    while faults['host'] in ray_cluster.node_labels().values():
      time.sleep(0.5)
    cluster.restart_node(faults['host'])
    faults['back_at'] = time.time()

  # Spare host: relaunched at full size.
  faults = {}
  runs['spare host'] = run('spare host', False,
                           killer(rng.randrange(*KILL_STEPS), faults))
  runs['spare host']['faults'] = faults
  back_on_its_host(faults)
  print(f'[bench_elastic] spare host: {runs["spare host"]["wall_s"]:.1f} s',
        flush=True)

  # No spare host: the third host's CPU is held.
  live = sorted(set(ray_cluster.node_labels().values()))
  faults = {}

  def return_after_some_steps(records):
    single = [r for r in records if r['pid'] not in faults['seen']]
    if len({r['step'] for r in single}) < STEPS_BEFORE_RETURN:
      return False
    back_on_its_host(faults)
    return True

  with ray_cluster.holding_cpus(live[-1:]):
    runs['no spare host, elastic'] = run(
        'no spare host, elastic', True,
        killer(rng.randrange(*KILL_STEPS), faults, return_after_some_steps))
  runs['no spare host, elastic']['faults'] = faults
  print('[bench_elastic] no spare host: '
        f'{runs["no spare host, elastic"]["wall_s"]:.1f} s', flush=True)
  return runs


def _summary(name: str, runs) -> Dict[str, Any]:
  """Run `name`'s recovery times, steps redone and examples off against its
  uninterrupted reference."""
  run = runs[name]
  reference = runs['uninterrupted, elastic' if 'elastic' in name
                   else 'uninterrupted']
  compared = _compare(run, reference)
  faults = run.get('faults')
  recover = []
  if faults:
    attempt_of = compared['attempt_of']
    recover.append(_first_step_after(run, 1, attempt_of) -
                   faults['killed_at'])
    if 'back_at' in faults and run['launch'].attempts > 2:
      recover.append(_first_step_after(run, 2, attempt_of) -
                     faults['back_at'])
  return {'recover_s': recover, 'redone': compared['redone'],
          'off': compared['off']}


def _row(name: str, run: Dict[str, Any], summary: Dict[str, Any]) -> List[str]:
  members = ', '.join(f'{e.from_workers}->{e.to_workers}'
                      for e in run['launch'].membership) or '-'
  return [name, f'{run["wall_s"]:.1f}', str(run['launch'].attempts), members,
          ', '.join(f'{s:.1f}' for s in summary['recover_s']) or '-',
          str(summary['redone']), str(summary['off'])]


def main(results_dir: str = 'benchmarks/results') -> str:
  reason = netns_hosts.unavailable_reason()
  if reason:
    sys.exit(f'bench_elastic needs test hosts: {reason}')
  with tempfile.TemporaryDirectory(prefix='bench-elastic-') as work:
    emulator = gcs_emulator.GcsEmulator(portpicker.pick_unused_port(),
                                        log_dir=work)
    try:
      # gs:// in this process too (the data's copy, the roots' folders).
      os.environ.update(tt.child_env(),
                        **gcs_emulator.environment(emulator.port))
      bucket = emulator.create_bucket(f'bench-elastic-{uuid.uuid4().hex[:8]}')
      with netns_hosts.netns_hosts(3) as hosts, emulator.reachable_at(
          hosts.bridge_address) as gcs_env, ray_cluster.local_ray_cluster(
              work, {**tt.child_env(), **gcs_env}, hosts=hosts) as cluster:
        with ray_cluster.connected(cluster):
          runs = measure(work, bucket, cluster)
    finally:
      emulator.stop()
  summaries = {name: _summary(name, runs) for name in runs}
  rows = [_row(name, runs[name], summaries[name]) for name in runs]
  recoveries = [s for summary in summaries.values()
                for s in summary['recover_s']]
  redone = max(summary['redone'] for summary in summaries.values())
  off = sum(summary['off'] for summary in summaries.values())
  body = '\n\n'.join([
      __doc__.split('\n\n', 2)[2].strip(),
      f'{TRAIN_STEPS} steps of {WORKERS} workers x {BATCH} examples '
      f'({STEP_SLEEP_S:g} s sleep per step), a checkpoint every {SAVE_EVERY} '
      f'steps; Ray declares a node dead after '
      f'{ray_cluster.HOST_HEALTH_CHECKS} (the test hosts\' settings).',
      report.table(['run', 'wall s', 'attempts', 'workers',
                    'fault -> first step s', 'steps redone',
                    'examples lost or repeated'], rows),
      report.table(['goal', 'measured', 'met'], [
          [f'time to recover under {RECOVERY_GOAL_S:g} s',
           f'max {max(recoveries):.1f} s',
           'yes' if max(recoveries) < RECOVERY_GOAL_S else '**no**'],
          [f'steps redone at most one checkpoint interval ({SAVE_EVERY})',
           f'max {redone}', 'yes' if redone <= SAVE_EVERY else '**no**'],
          ['zero examples lost or repeated', str(off),
           'yes' if off == 0 else '**no**']]),
  ])
  return report.write(results_dir, 'elastic',
                      'Node death on real hosts: spare host and elastic', body)


if __name__ == '__main__':
  harness.entry(harness.parser('benchmarks.bench_elastic'),
                lambda args: main(args.results_dir))
