"""Exact resume after real SIGKILL / SIGTERM of a training process.

(The fast tests at the end check the SIGTERM watcher in this process.)

Every run is a child process (`tests.support.trainer_testing`, the
production `task_process.train` with deterministic ops) on 64 examples with an
`id` feature; the model logs which ids each optimizer step consumed. A
killed-and-rerun training must end with the same weights and optimizer state,
bit for bit, as an uninterrupted one, after exactly `TRAIN_STEPS` optimizer
steps, and every step of the surviving trajectory must have trained on the same
ids.
"""

import dataclasses
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from components.trainer.checkpoint import store as store_lib
from components.trainer.common import exit_codes
from components.trainer.managed import preemption
from components.testing import trainer_testing as tt
from components.testing import faulty_storage
from components.testing.faulty_storage import Fault
from components.testing.faulty_storage import FaultyStorage

NUM_EXAMPLES = tt.NUM_EXAMPLES  # in the `data` fixture
TRAIN_STEPS = 32  # 2 examples per step: one pass over the data.
SAVE_EVERY = 4
SEED = 20240611
STEP = 'step/.ATTRIBUTES/VARIABLE_VALUE'
ITERATIONS = 'optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE'


def _task(root, data):
  # Slow steps (50 ms) so that a signal lands mid-training.
  return tt.make_task(root, data, train_steps=TRAIN_STEPS,
                      per_replica_batch_size=2,
                      fault_tolerance={'save_every_steps': SAVE_EVERY},
                      hparams={'step_sleep_seconds': 0.05})


@pytest.fixture(scope='module')
def baseline(tmp_path_factory, data):
  """An uninterrupted run: its ids per step and final checkpoint."""
  root = str(tmp_path_factory.mktemp('baseline'))
  task = _task(root, data)
  assert tt.run_child(task, root) == 0, tt.child_log(root)
  by_step = tt.ids_by_step(tt.read_id_log(task.hparams['id_log']))
  assert sorted(i for ids in by_step.values() for i in ids) == list(
      range(NUM_EXAMPLES))
  return {'ids': by_step,
          'tensors': tt.final_tensors(task)}


def _steps_of(records, pid):
  return sorted({r['step'] for r in records if r['pid'] == pid})


def _assert_same_training(task, baseline):
  """Same final state bit for bit, exact step count, same ids per step."""
  result = tt.read_result(task)
  assert result.steps == TRAIN_STEPS and not result.preempted
  tensors = tt.final_tensors(task)
  assert tensors[STEP] == TRAIN_STEPS and tensors[ITERATIONS] == TRAIN_STEPS
  assert sorted(tensors) == sorted(baseline['tensors'])
  for name, value in baseline['tensors'].items():
    np.testing.assert_array_equal(tensors[name], value, err_msg=name)
  records = tt.read_id_log(task.hparams['id_log'])
  assert tt.ids_by_step(records) == baseline['ids']
  return result, records


@pytest.mark.slow
def test_sigkill_at_random_step_then_rerun_is_exact(tmp_path, data, baseline,
                                                    run_seed):
  """One trial a run; its kill step comes from the run's printed seed, so
  successive runs cover different steps (replay: TFX_HPM_TEST_SEED)."""
  kill_step = random.Random(run_seed).randrange(2, TRAIN_STEPS - 3)
  print(f'kill step {kill_step} (TFX_HPM_TEST_SEED={run_seed})')
  root = str(tmp_path)
  task = _task(root, data)
  killed_pid, code = tt.kill_at_step(task, root, kill_step, signal.SIGKILL)
  assert code == -signal.SIGKILL
  assert tt.run_child(task, root) == 0, tt.child_log(root)

  result, records = _assert_same_training(task, baseline)
  [event] = result.resume_events
  killed_steps = _steps_of(records, killed_pid)
  if event['event'] == 'restarted':  # Killed before its first checkpoint.
    assert event['from_step'] == 0 and killed_steps[-1] <= SAVE_EVERY
  else:
    assert event['event'] == 'resumed'
    assert event['from_step'] % SAVE_EVERY == 0
    assert event['checkpoint'].endswith(
        store_lib.checkpoint_name(event['from_step']))
  # Every checkpoint carries the data order it was trained in.
  manifests = sorted(pathlib.Path(task.checkpoint_dir).glob(
      f'*/{store_lib.MANIFEST_NAME}'))
  assert manifests and all(
      json.loads(m.read_text())['extra']['data_order'] ==
      result.loop.data_order for m in manifests)
  assert result.loop.data_order['partitions'] == 1
  assert event['from_step'] <= killed_steps[-1] + 1
  # The progress marker is throttled, so it may undercount, never overcount.
  assert 0 <= event['steps_lost'] <= killed_steps[-1] + 1 - event['from_step']
  # Redone steps replayed exactly the ids the killed process had trained on.
  resumed_pid = next(r['pid'] for r in reversed(records))
  assert _steps_of(records, resumed_pid) == list(
      range(event['from_step'], TRAIN_STEPS))
  for step in range(event['from_step'], killed_steps[-1] + 1):
    killed_ids = [r['ids'] for r in records
                  if r['pid'] == killed_pid and r['step'] == step]
    assert killed_ids in ([], [baseline['ids'][(step, 0)]])


@pytest.mark.slow
def test_sigterm_checkpoints_at_the_next_step_and_loses_nothing(
    tmp_path, data, baseline):
  term_step = random.Random(SEED).randrange(3, TRAIN_STEPS - 6)
  root = str(tmp_path)
  task = _task(root, data)
  preempted_pid, code = tt.kill_at_step(task, root, term_step, signal.SIGTERM)
  assert code == preemption.PREEMPTED_EXIT_CODE, tt.child_log(root)
  preempted = tt.read_result(task)
  records = tt.read_id_log(task.hparams['id_log'])
  last_trained = _steps_of(records, preempted_pid)[-1]
  # Saved right after the step that was running: nothing lost.
  assert preempted.preempted is True
  assert preempted.steps == last_trained + 1 < TRAIN_STEPS
  assert preempted.resume_events[-1]['event'] == 'preempted'
  assert preempted.resume_events[-1]['at_step'] == last_trained + 1
  assert os.path.isdir(os.path.join(
      task.checkpoint_dir,
      store_lib.checkpoint_name(last_trained + 1)))

  assert tt.run_child(task, root) == 0, tt.child_log(root)
  result, records = _assert_same_training(task, baseline)
  event = result.resume_events[-1]
  assert event['event'] == 'resumed'
  assert event['from_step'] == last_trained + 1 and event['steps_lost'] == 0
  # No step was trained twice.
  steps = [r['step'] for r in records]
  assert sorted(steps) == list(range(TRAIN_STEPS))


def _children(pid):
  """The pids of `pid`'s child processes."""
  found = []
  for task in pathlib.Path(f'/proc/{pid}/task').glob('*'):
    found += [int(c) for c in (task / 'children').read_text().split()]
  return found


def _offload_cells(pid):
  return [c for c in _children(pid) if b'components.offload.cell' in
          pathlib.Path(f'/proc/{c}/cmdline').read_bytes()]


def _wait_gone(pid, timeout_s=20):
  deadline = time.monotonic() + timeout_s
  while os.path.exists(f'/proc/{pid}') and time.monotonic() < deadline:
    time.sleep(0.1)
  return not os.path.exists(f'/proc/{pid}')


@pytest.mark.slow
def test_with_a_cell_in_the_loop_a_kill_and_a_lost_cell_change_nothing(
    tmp_path, data, baseline):
  """The partition served by a tf.data service cell (`offload`): the trainer
  SIGKILLed at step 9 and rerun, and in the rerun its cell SIGKILLed at its
  first step (later, the cell has produced the rest). The end state is the
  uninterrupted local reader's, bit for bit, and every step trained its
  ids."""
  root = str(tmp_path)
  task = _task(root, data)
  task = dataclasses.replace(task, distribution={
      **task.distribution,
      'offload': {'cells': 1, 'lost_after_s': 5, 'max_cell_starts': 1}})
  process = tt.start_child(task, root)
  try:
    tt.wait_for_step(process, task.hparams['id_log'], 9)
    [first_cell] = _offload_cells(process.pid)
    process.kill()
    assert process.wait(timeout=60) == -signal.SIGKILL
    # The cell ends with the process that started it.
    assert _wait_gone(first_cell)

    process = tt.start_child(task, root)
    tt.wait_for_step(process, task.hparams['id_log'], 9)
    [cell] = _offload_cells(process.pid)
    os.kill(cell, signal.SIGKILL)
    assert process.wait(timeout=tt.CHILD_TIMEOUT_SECONDS) == 0, (
        tt.child_log(root))
  finally:
    if process.poll() is None:
      process.kill()
  result, _ = _assert_same_training(task, baseline)
  assert result.resume_events[-1]['event'] == 'resumed'
  offload = result.loop.offload
  assert [e['event'] for e in offload['events']] == [
      'started', 'lost', 'started', 'moved']
  assert offload['lost'] == {'cell-0': 'its process is gone (exit -9)'}
  assert offload['partitions'] == {'0': 'cell-1'}
  # It moved on from the position its pump had queued, ahead of the step
  # the trainer had reached: not from the stream's start.
  assert offload['events'][1]['position'] > 9


@pytest.mark.slow
@pytest.mark.parametrize('damage', [
    faulty_storage.flip(0.5),
    pytest.param(faulty_storage.halve, marks=pytest.mark.extended)])
def test_damaged_newest_checkpoint_falls_back_to_the_previous(
    tmp_path, data, baseline, damage):
  root = str(tmp_path)
  task = _task(root, data)
  _, code = tt.kill_at_step(task, root, 3 * SAVE_EVERY, signal.SIGKILL)
  assert code == -signal.SIGKILL
  store = store_lib.CheckpointStore(task.checkpoint_dir, None)
  published = [p for p in store.checkpoint_dirs()
               if os.path.exists(os.path.join(p, store_lib.MANIFEST_NAME))]
  newest, previous = published[0], published[1]
  data_file = next(n for n in os.listdir(newest) if '.data-' in n)
  faulty_storage.rewrite(os.path.join(newest, data_file), damage)

  assert tt.run_child(task, root) == 0, tt.child_log(root)
  result, _ = _assert_same_training(task, baseline)
  [event] = result.resume_events
  assert event['checkpoint'] == previous
  # (A partial write cut by the kill, if any, is skipped too.)
  reasons = {s['path']: s['reason'] for s in event['skipped_checkpoints']}
  # A flipped byte: TF's crc32c on reading; a cut file: its size.
  expected = 'truncated' if damage is faulty_storage.halve else 'crc32c'
  assert expected in reasons[newest]
  assert all(s['deleted'] for s in event['skipped_checkpoints'])
  assert 'falling back to the previous one' in tt.child_log(root)


def _checkpoint_steps(task):
  store = store_lib.CheckpointStore(task.checkpoint_dir, None)
  return [store_lib.step_of(p) for p in store.checkpoint_dirs()]


@pytest.mark.slow
def test_flaky_storage_while_resuming_and_saving_loses_nothing(
    tmp_path, data, baseline):
  """Transient errors on the resumed attempt: retried, nothing deleted, the
  same training as an uninterrupted run, and the retries on record."""
  root = str(tmp_path)
  task = _task(root, data)
  _, code = tt.kill_at_step(task, root, 2 * SAVE_EVERY + 1, signal.SIGKILL)
  assert code == -signal.SIGKILL
  kept = _checkpoint_steps(task)
  faults = FaultyStorage(task.checkpoint_dir, [
      Fault('checkpoint_read', 1, 'unavailable'),
      Fault('list', 1, 'reset'),
      Fault('read', 2, 'deadline'),
      Fault('write', 3, 'unavailable', count=2),
      Fault('checkpoint_write', 2, 'deadline'),
      Fault('checkpoint_write', 3, 'slow'),
  ])
  assert tt.run_child(task, root, faults.to_json()) == 0, tt.child_log(root)

  result, _ = _assert_same_training(task, baseline)
  resumed, retried = result.resume_events
  assert resumed['event'] == 'resumed' and resumed['skipped_checkpoints'] == []
  assert resumed['from_step'] == max(kept)
  # One retry per injected error (the slow write is no error).
  assert retried['event'] == 'storage_retried' and retried['retries'] == 6
  assert retried['operations']['read checkpoint'] == 1
  assert retried['operations']['write checkpoint'] == 1
  assert 'injected' in retried['last_error']
  assert _checkpoint_steps(task) == [TRAIN_STEPS, TRAIN_STEPS - SAVE_EVERY,
                                     TRAIN_STEPS - 2 * SAVE_EVERY]


def _hold_lease(checkpoint_dir):
  """Another execution of the same training, holding the folder's lease."""
  holder = subprocess.Popen(
      [sys.executable, '-c',
       'import sys, time\n'
       'from components.trainer.checkpoint.store import CheckpointStore\n'
       'store = CheckpointStore(sys.argv[1], None,\n'
       '                        run_id="another-execution")\n'
       'store.acquire_lease()\n'
       'print("held", flush=True)\n'
       'time.sleep(600)\n', checkpoint_dir],
      cwd=tt.REPO_ROOT, env=tt.child_env(), stdout=subprocess.PIPE)
  assert holder.stdout.readline() == b'held\n'
  return holder


@pytest.mark.slow
def test_a_run_into_a_folder_another_run_holds_fails_or_waits(
    tmp_path, data, baseline):
  root = str(tmp_path)
  task = _task(root, data)
  _, code = tt.kill_at_step(task, root, 2 * SAVE_EVERY + 1, signal.SIGKILL)
  assert code == -signal.SIGKILL
  before = _checkpoint_steps(task)
  holder = _hold_lease(task.checkpoint_dir)
  try:
    # lease='fail': a clear error, and the other run's folder untouched;
    # the executor's worker says a relaunch would not help.
    assert tt.run_child(task, root, production=True) == (
        exit_codes.NOT_RETRYABLE_EXIT_CODE)
    log = tt.child_log(root)
    assert 'LeaseHeldError' in log and "run 'another-execution'" in log
    assert _checkpoint_steps(task) == before
    # lease='wait': waits; the holder dies; the lease is taken over.
    waiting = dataclasses.replace(task, fault_tolerance=dict(
        task.fault_tolerance, lease='wait', lease_heartbeat_s=0.5))
    child = tt.start_child(waiting, root)
    deadline = time.monotonic() + tt.CHILD_TIMEOUT_SECONDS
    while 'Waiting for the checkpoint lease' not in tt.child_log(root):
      assert time.monotonic() < deadline and child.poll() is None, (
          tt.child_log(root))
      time.sleep(0.1)
    holder.kill()
    holder.wait()
    assert child.wait(timeout=tt.CHILD_TIMEOUT_SECONDS) == 0, (
        tt.child_log(root))
  finally:
    if holder.poll() is None:
      holder.kill()
      holder.wait()
  result, _ = _assert_same_training(task, baseline)
  lease, resumed = result.resume_events
  assert lease['event'] == 'lease_taken_over' and 'is gone' in lease['reason']
  assert lease['previous_holder']['run_id'] == 'another-execution'
  assert resumed['event'] == 'resumed' and resumed['from_step'] == before[0]


# ---------------------------------------------------------------- fast


def test_sigterm_watcher_saves_at_the_boundary_then_stops():
  saved = []
  watcher = preemption.SigtermWatcher(lambda: saved.append('saved'))
  try:
    assert watcher.run(lambda: 'step 1') == 'step 1'
    os.kill(os.getpid(), signal.SIGTERM)  # Arrives "during" step 2.
    assert watcher.requested and saved == []
    with pytest.raises(preemption.Preempted):
      watcher.run(lambda: 'step 3')
    assert saved == ['saved']
  finally:
    watcher.close()
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_exit_code():
  assert preemption.exit_code(True) == 75
  assert preemption.exit_code(False) == 0
