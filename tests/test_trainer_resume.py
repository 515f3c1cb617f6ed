"""Exact resume after real SIGKILL / SIGTERM of a training process.

(The fast tests at the end check the SIGTERM watcher in this process.)

Every run is a child process (`tests.trainer_testing`, the production
`worker.train` with deterministic ops) on 64 examples with an `id` feature;
the model logs which ids each optimizer step consumed. A killed-and-rerun
training must end with the same weights and optimizer state, bit for bit, as
an uninterrupted one, after exactly `TRAIN_STEPS` optimizer steps, and every
step of the surviving trajectory must have trained on the same ids.
"""

import os
import random
import signal

import numpy as np
import pytest
import tensorflow as tf

from components.trainer import checkpointing
from components.trainer import preemption
from tests import trainer_testing as tt

NUM_EXAMPLES = 64
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
def data(tmp_path_factory):
  return tt.write_id_dataset(str(tmp_path_factory.mktemp('ids')), NUM_EXAMPLES)


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
          'tensors': tt.latest_checkpoint_tensors(task.checkpoint_dir)}


def _steps_of(records, pid):
  return sorted({r['step'] for r in records if r['pid'] == pid})


def _assert_same_training(task, baseline):
  """Same final state bit for bit, exact step count, same ids per step."""
  result = tt.read_result(task)
  assert result['steps'] == TRAIN_STEPS and not result['preempted']
  tensors = tt.latest_checkpoint_tensors(task.checkpoint_dir)
  assert tensors[STEP] == TRAIN_STEPS and tensors[ITERATIONS] == TRAIN_STEPS
  assert sorted(tensors) == sorted(baseline['tensors'])
  for name, value in baseline['tensors'].items():
    np.testing.assert_array_equal(tensors[name], value, err_msg=name)
  records = tt.read_id_log(task.hparams['id_log'])
  assert tt.ids_by_step(records) == baseline['ids']
  return result, records


@pytest.mark.slow
@pytest.mark.parametrize('trial', range(3))
def test_sigkill_at_random_step_then_rerun_is_exact(tmp_path, data, baseline,
                                                    trial):
  kill_step = random.Random(SEED + trial).randrange(2, TRAIN_STEPS - 3)
  root = str(tmp_path)
  task = _task(root, data)
  killed_pid, code = tt.kill_at_step(task, root, kill_step, signal.SIGKILL)
  assert code == -signal.SIGKILL
  assert tt.run_child(task, root) == 0, tt.child_log(root)

  result, records = _assert_same_training(task, baseline)
  [event] = result['resume_events']
  killed_steps = _steps_of(records, killed_pid)
  assert event['event'] == 'resumed'
  assert event['from_step'] % SAVE_EVERY == 0
  assert event['from_step'] <= killed_steps[-1] + 1
  assert event['checkpoint'].endswith(
      checkpointing.CheckpointStore.checkpoint_name(event['from_step']))
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
  assert preempted['preempted'] is True
  assert preempted['steps'] == last_trained + 1 < TRAIN_STEPS
  assert preempted['resume_events'][-1]['event'] == 'preempted'
  assert preempted['resume_events'][-1]['at_step'] == last_trained + 1
  assert os.path.isdir(os.path.join(
      task.checkpoint_dir,
      checkpointing.CheckpointStore.checkpoint_name(last_trained + 1)))

  assert tt.run_child(task, root) == 0, tt.child_log(root)
  result, records = _assert_same_training(task, baseline)
  event = result['resume_events'][-1]
  assert event['event'] == 'resumed'
  assert event['from_step'] == last_trained + 1 and event['steps_lost'] == 0
  # No step was trained twice.
  steps = [r['step'] for r in records]
  assert sorted(steps) == list(range(TRAIN_STEPS))


def _flip_a_byte(path):
  with open(path, 'r+b') as f:
    f.seek(os.path.getsize(path) // 2)
    byte = f.read(1)
    f.seek(-1, os.SEEK_CUR)
    f.write(bytes([byte[0] ^ 0xFF]))


def _truncate(path):
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) // 2)


@pytest.mark.slow
@pytest.mark.parametrize('damage', [_flip_a_byte, _truncate])
def test_damaged_newest_checkpoint_falls_back_to_the_previous(
    tmp_path, data, baseline, damage):
  root = str(tmp_path)
  task = _task(root, data)
  _, code = tt.kill_at_step(task, root, 3 * SAVE_EVERY, signal.SIGKILL)
  assert code == -signal.SIGKILL
  store = checkpointing.CheckpointStore(task.checkpoint_dir, None)
  published = [p for p in store.checkpoint_dirs()
               if os.path.exists(os.path.join(p, checkpointing.MANIFEST_NAME))]
  newest, previous = published[0], published[1]
  data_file = next(n for n in os.listdir(newest) if '.data-' in n)
  damage(os.path.join(newest, data_file))

  assert tt.run_child(task, root) == 0, tt.child_log(root)
  result, _ = _assert_same_training(task, baseline)
  [event] = result['resume_events']
  assert event['checkpoint'] == previous
  # (A partial write cut by the kill, if any, is skipped too.)
  reasons = {s['path']: s['reason'] for s in event['skipped_checkpoints']}
  expected = 'sha256' if damage is _flip_a_byte else 'truncated'
  assert expected in reasons[newest]
  assert 'falling back to the previous one' in tt.child_log(root)


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


def test_exit_code_and_watcher_choice():
  assert preemption.exit_code({'preempted': True}) == 75
  assert preemption.exit_code({'preempted': False}) == 0
  watcher = preemption.make_watcher(tf.distribute.OneDeviceStrategy('/cpu:0'),
                                    tf.train.Checkpoint(), lambda: None)
  try:
    assert isinstance(watcher, preemption.SigtermWatcher)
  finally:
    watcher.close()
