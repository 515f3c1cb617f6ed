"""Killed workers and clusters, for every strategy (real processes, signals).

- mirrored and central_storage (2 logical CPUs): SIGKILL at a seeded random
  step, rerun: bit-identical to an uninterrupted run (one_device is covered
  in tests/trainer/managed/test_resume.py).
- MultiWorkerMirrored (2 workers) under the local launcher: SIGKILL one
  worker: the launcher relaunches the cluster, which resumes from the last
  checkpoint; SIGTERM one worker: TF's PreemptionCheckpointHandler has both
  workers checkpoint at the same step, nothing is lost.
- ParameterServer (1 ps, 2 workers, coordinator): SIGKILL one worker: the
  coordinator finishes on the other, with the exact step count; SIGKILL the
  coordinator: the launcher relaunches and training resumes.
"""

import collections
import dataclasses
import os
import random
import signal
import subprocess
import threading
import time

import numpy as np
import pytest

from components.trainer.cluster import tf_cluster
from components.trainer.managed import preemption
from components.testing import trainer_testing as tt

pytestmark = pytest.mark.slow

STEP = 'step/.ATTRIBUTES/VARIABLE_VALUE'
ITERATIONS = 'optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE'
PREEMPTION_COUNTER = 'checkpointed_runs/'
CLUSTER_TIMEOUT_S = tt.CLUSTER_TIMEOUT_S


# ------------------------------------------- single-process, two replicas


@pytest.mark.parametrize('strategy', [
    'mirrored', pytest.param('central_storage', marks=pytest.mark.extended)])
def test_two_replica_strategy_splits_batches_and_resumes_exactly_after_sigkill(
    tmp_path, data, strategy, run_seed):
  """2 replicas x 2 examples x 2 accumulation micro-steps = 8 per update: the
  uninterrupted run gives each replica its own 4 examples a step and exports;
  a run SIGKILLed at a random step and rerun ends bit for bit the same."""
  train_steps = 8  # 8 examples a step: one pass.

  def task_in(name):
    return tt.make_task(str(tmp_path / name), data, strategy=strategy,
                        train_steps=train_steps, per_replica_batch_size=2,
                        accumulation=2, logical_cpu_devices=2,
                        fault_tolerance={'save_every_steps': 2},
                        hparams={'step_sleep_seconds': 0.1})

  baseline = task_in('baseline')
  assert tt.run_child(baseline, str(tmp_path / 'baseline')) == 0
  result = tt.read_result(baseline)
  assert result.num_replicas == 2 and result.loop.examples_per_step == 8
  assert result.steps == train_steps and result.loop.exported is True
  assert set(result.loop.eval) == {'loss', 'binary_accuracy'}
  baseline_ids = tt.ids_by_step(tt.read_id_log(baseline.hparams['id_log']))
  assert all(len(ids) == 4 for ids in baseline_ids.values())
  tt.assert_each_id_once(baseline, train_steps, replicas=2)

  task = task_in('killed')
  root = str(tmp_path / 'killed')
  kill_step = random.Random(run_seed).randrange(3, train_steps - 2)
  print(f'kill step {kill_step} (TFX_HPM_TEST_SEED={run_seed})')
  _, code = tt.kill_at_step(task, root, kill_step, signal.SIGKILL)
  assert code == -signal.SIGKILL
  assert tt.run_child(task, root) == 0, tt.child_log(root)

  [event] = tt.read_result(task).resume_events
  assert event['event'] == 'resumed' and 0 < event['from_step'] <= (
      kill_step + 1)
  expected = tt.final_tensors(baseline)
  actual = tt.final_tensors(task)
  assert actual[STEP] == train_steps and actual[ITERATIONS] == train_steps
  for name, value in expected.items():
    np.testing.assert_array_equal(actual[name], value, err_msg=name)
  assert tt.ids_by_step(tt.read_id_log(task.hparams['id_log'])) == (
      baseline_ids)
  tt.assert_each_id_once(task, train_steps, replicas=2)


# ------------------------------------------------------------- clusters


def _signal_when(task, pick_pid, sig):
  """Background: signals the pid `pick_pid(records)` returns (once); what
  it sent to, and every pid seen by then (`seen`), go into the dict."""
  sent = {}

  def watch():
    deadline = time.monotonic() + CLUSTER_TIMEOUT_S
    while time.monotonic() < deadline:
      records = tt.read_id_log(task.hparams['id_log'])
      pid = pick_pid(records)
      if pid:
        sent['seen'] = {r['pid'] for r in records}
        sent['pid'] = pid
        os.kill(pid, sig)
        return
      time.sleep(0.05)

  thread = threading.Thread(target=watch, daemon=True)
  thread.start()
  return sent


def _worker_at_step(step, replica=1, after=None):
  """The pid of the worker training `replica` once it reached `step`; with
  `after` (what another `_signal_when` sent), only once that one was sent,
  and a process started since."""
  def pick(records):
    if after is not None and 'pid' not in after:
      return None
    mine = [r for r in records if r['replica'] == replica and
            r['pid'] not in (after or {}).get('seen', ())]
    return mine[-1]['pid'] if mine and mine[-1]['step'] >= step else None
  return pick


def test_mwms_worker_killed_then_stopped_cluster_relaunches_each_time(
    tmp_path, data, child_env, run_seed):
  """SIGKILL of worker 1 at a seeded step: its exit is seen, the cluster is
  relaunched and resumes. Then SIGSTOP of the relaunched worker 1 two steps
  later: the chief's next all-reduce waits for it without failing (what a
  cut-off host does); the supervisor sees no new step for hang_timeout_s,
  kills the attempt and relaunches it. Every example trains once."""
  del child_env
  root = str(tmp_path)
  task = tt.mwms_task(root, data, max_restarts=2)
  kill_step = random.Random(run_seed).randrange(5, 11)
  stop_step = kill_step + 2
  print(f'kill step {kill_step}, stop step {stop_step} '
        f'(TFX_HPM_TEST_SEED={run_seed})')
  killed = _signal_when(task, _worker_at_step(kill_step), signal.SIGKILL)
  stopped = _signal_when(task, _worker_at_step(stop_step, after=killed),
                         signal.SIGSTOP)
  # Well under TF's own 10 s heartbeat timeout, so that the hang is ours to
  # see; far over a step (0.1 s) and a save here.
  launch = tt.run_cluster(task, root, hang_timeout_s=4)

  assert launch.attempts == 3
  lost, hung = launch.relaunches
  assert (lost.process, lost.exit_code) == ('worker-1', -signal.SIGKILL)
  assert (hung.process, hung.exit_code) == ('worker-0', None)
  assert 'No new training step' in hung.log_tail
  assert stopped['pid'] != killed['pid']
  result = tt.read_result(task)
  assert result.steps == 16 and result.num_replicas == 2
  events = result.resume_events
  assert [e['event'] for e in events] == ['resumed', 'resumed']
  assert all(e['from_step'] % 4 == 0 for e in events)
  assert 0 < events[0]['from_step'] <= kill_step + 1
  assert events[0]['from_step'] <= events[1]['from_step'] <= stop_step + 1
  tensors = tt.final_tensors(task)
  assert tensors[STEP] == 16 and tensors[ITERATIONS] == 16
  tt.assert_each_id_once(task, 16, replicas=2)
  # The signalled workers' redone steps replayed the same examples.
  records = tt.read_id_log(task.hparams['id_log'])
  surviving = tt.ids_by_step(records)
  for record in records:
    if record['pid'] in (killed['pid'], stopped['pid']):
      assert record['ids'] == surviving[(record['step'], 1)]


def test_elastic_cluster_of_2_runs_on_1_and_back_with_the_same_updates(
    tmp_path, data, child_env, run_seed):
  """An elastic MultiWorkerMirrored cluster (min_workers=1 of 2) whose
  membership changes as its Ray launcher's would: SIGKILL of worker 1 at a
  seeded step, a relaunch with 1 worker (accumulating 2 micro-batches: the
  same update batch), SIGTERM to it a few steps later (it checkpoints), a
  relaunch with 2. Every update trains the same examples as an
  uninterrupted 2-worker run, and the final weights equal that run's: each
  update sums the same two per-replica gradients, in one all-reduce or in
  the accumulation (a + b == b + a in floating point; from 3 addends on the
  association could change the last bits)."""
  del child_env

  def elastic_task(name):
    task = tt.mwms_task(str(tmp_path / name), data, max_restarts=1)
    return dataclasses.replace(task, distribution={
        **task.distribution, 'launcher': 'ray', 'min_workers': 1})

  baseline = elastic_task('baseline')
  assert tt.run_cluster(baseline, str(tmp_path / 'baseline')).attempts == 1
  task = elastic_task('elastic')
  kill_step = random.Random(run_seed).randrange(5, 9)
  term_step = kill_step + 3
  print(f'kill step {kill_step}, SIGTERM step {term_step} '
        f'(TFX_HPM_TEST_SEED={run_seed})')
  killed = _signal_when(task, _worker_at_step(kill_step), signal.SIGKILL)
  preempted = _signal_when(
      task, _worker_at_step(term_step, replica=0, after=killed),
      signal.SIGTERM)
  launch = tt.run_cluster(task, str(tmp_path / 'elastic'),
                          num_workers=[2, 1, 2])

  assert launch.attempts == 3
  assert [r.exit_code for r in launch.relaunches] == [
      -signal.SIGKILL, preemption.PREEMPTED_EXIT_CODE]
  result = tt.read_result(task)
  assert (result.num_workers, result.loop.gradient_accumulation_steps,
          result.loop.examples_per_step) == (2, 1, 4)
  assert [e['event'] for e in result.resume_events] == [
      'resumed', 'preempted', 'resumed']

  def attempt_of(pid):
    return (0 if pid in killed['seen'] else
            1 if pid in preempted['seen'] else 2)
  records = tt.read_id_log(task.hparams['id_log'])
  assert {attempt_of(r['pid']) for r in records} == {0, 1, 2}
  # The one worker ran each step as 2 micro-batches of the per-replica 2.
  single = [r for r in records if attempt_of(r['pid']) == 1]
  assert {r['replica'] for r in single} == {0}
  assert all(len(r['ids']) == 2 for r in single)
  assert sorted(collections.Counter(r['step'] for r in single).values()) == (
      [2] * len({r['step'] for r in single}))
  updates = tt.ids_by_update(records, attempt_of)
  assert updates == tt.ids_by_update(
      tt.read_id_log(baseline.hparams['id_log']), lambda pid: 0)
  assert sorted(i for ids in updates.values() for i in ids) == list(
      range(tt.NUM_EXAMPLES))
  expected, actual = tt.final_tensors(baseline), tt.final_tensors(task)
  assert actual[STEP] == 16 and actual[ITERATIONS] == 16
  # The preemption handler counts the runs it checkpointed (SIGTERM: 1 run).
  assert sorted(actual) == sorted(expected)
  for name, value in expected.items():
    if not name.startswith(PREEMPTION_COUNTER):
      np.testing.assert_array_equal(actual[name], value, err_msg=name)


@pytest.mark.extended
def test_mwms_sigterm_checkpoints_on_every_worker_and_loses_nothing(
    tmp_path, data, child_env):
  del child_env
  root = str(tmp_path)
  # Time-based saves too: the workers agree on them with a collective.
  task = tt.mwms_task(root, data, save_every_s=0.5)
  _signal_when(task, _worker_at_step(5), signal.SIGTERM)
  launch = tt.run_cluster(task, root)

  # Both workers saved at the agreed step and exited "preempted".
  assert launch.attempts == 2
  assert launch.relaunches[0].exit_code == preemption.PREEMPTED_EXIT_CODE
  events = tt.read_result(task).resume_events
  assert [e['event'] for e in events] == ['preempted', 'resumed']
  assert events[1]['from_step'] == events[0]['at_step']
  assert events[1]['steps_lost'] == 0
  records = tt.read_id_log(task.hparams['id_log'])
  # No step ran twice on any replica: nothing was lost.
  keys = [(r['step'], r['replica']) for r in records]
  assert sorted(keys) == [(s, r) for s in range(16) for r in (0, 1)]
  tt.assert_each_id_once(task, 16, replicas=2)


def _ps_task(root, data, train_steps):
  return tt.make_task(root, data, strategy='parameter_server', num_workers=2,
                      num_ps=1, train_steps=train_steps,
                      per_replica_batch_size=2,
                      fault_tolerance={'save_every_steps': 10,
                                       'max_restarts': 1},
                      hparams={'step_sleep_seconds': 0.05})


def test_ps_survives_the_loss_of_a_worker(tmp_path, data):
  """No relaunch: the coordinator retries the lost worker's steps elsewhere."""
  root = str(tmp_path)
  task = _ps_task(root, data, train_steps=40)
  specs = tf_cluster.cluster_processes('parameter_server', 2, 1,
                                     tt.cluster_argv(task, root))
  processes = {}
  try:
    for spec in specs:
      env = dict(os.environ, **tt.child_env(),
                 **{k: v for k, v in spec.env.items() if v is not None})
      with open(os.path.join(root, f'{spec.name}.log'), 'wb') as log:
        processes[spec.name] = subprocess.Popen(
            spec.argv, env=env, cwd=tt.REPO_ROOT, stdout=log,
            stderr=subprocess.STDOUT)
    # Steps run their py_function (the id log) on the coordinator, so the
    # log tells the progress; the victim is a worker server.
    tt.wait_for_step(processes['chief'], task.hparams['id_log'], 10)
    processes['worker-1'].kill()
    assert processes['chief'].wait(timeout=CLUSTER_TIMEOUT_S) == 0, (
        open(os.path.join(root, 'chief.log'), errors='replace').read())
    assert processes['worker-1'].poll() == -signal.SIGKILL
  finally:
    for process in processes.values():
      if process.poll() is None:
        process.kill()
        process.wait()
  result = tt.read_result(task)
  assert result.steps == 40 and result.resume_events == []
  assert result.loop.exported is True
  tensors = tt.final_tensors(task)
  assert tensors[STEP] == 40 and tensors[ITERATIONS] == 40
  with open(os.path.join(root, 'chief.log'), errors='replace') as f:
    assert 'worker/replica:0/task:1 failed' in f.read()


@pytest.mark.extended
def test_ps_coordinator_killed_cluster_relaunches_and_resumes(
    tmp_path, data, child_env):
  del child_env
  root = str(tmp_path)
  task = _ps_task(root, data, train_steps=30)
  chief_past_step = lambda records: (  # pylint: disable=g-long-lambda
      records[-1]['pid'] if records and records[-1]['step'] >= 14 else None)
  _signal_when(task, chief_past_step, signal.SIGKILL)
  launch = tt.run_cluster(task, root, strategy='parameter_server', num_ps=1,
                         max_restarts=1)

  assert launch.attempts == 2 and launch.relaunches[0].process == 'chief'
  result = tt.read_result(task)
  [event] = result.resume_events
  assert event['event'] == 'resumed' and event['from_step'] in (10, 20)
  assert result.loop.start_step == event['from_step']
  tensors = tt.final_tensors(task)
  assert tensors[STEP] == 30 and tensors[ITERATIONS] == 30
