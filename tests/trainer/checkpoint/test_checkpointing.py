"""FaultToleranceConfig, the stable checkpoint location and CheckpointStore.

Storage faults come from `tests.support.faulty_storage` (a tf.io.gfile wrapper);
leases are contended by stores in this process and by real processes.
"""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest
import tensorflow as tf

from components import storage
from components.trainer.checkpoint.checkpointer import Checkpointer
from components.trainer.checkpoint.config import CheckpointConfig
from components.trainer.checkpoint.config import FaultToleranceConfig
from components.trainer.checkpoint.config import SupervisionConfig
from components.trainer.checkpoint import lease as lease_lib
from components.trainer.checkpoint import location as location_lib
from components.trainer.checkpoint import records as records_lib
from components.trainer.checkpoint import store as store_lib
from components.trainer.checkpoint.store import CheckpointStore
from components.testing import faulty_storage
from components.testing.faulty_storage import Fault
from components.testing.faulty_storage import FaultyStorage

# Retries without waiting: the tests count them, they do not time them.
NO_WAIT = storage.RetryPolicy(first_delay_s=0.0)


# ----------------------------------------------------------------- config


def test_default_config_is_valid_and_round_trips():
  config = FaultToleranceConfig().validate()
  assert config.save_every_steps == 100 and config.keep_last == 3
  assert config.delete_after_export is True and config.max_restarts == 2
  assert FaultToleranceConfig.from_dict(config.to_dict()) == config
  assert FaultToleranceConfig.from_json(config.to_json()) == config
  assert FaultToleranceConfig.from_json('') == FaultToleranceConfig()
  json.dumps(config.to_dict())


@pytest.mark.parametrize('values, message', [
    ({'save_every_steps': 0}, 'save_every_steps=0'),
    ({'save_every_steps': 2.5}, 'save_every_steps=2.5'),
    ({'save_every_steps': True}, 'save_every_steps=True'),
    ({'save_every_s': 0}, 'save_every_s=0'),
    ({'save_every_s': '60'}, "save_every_s='60'"),
    ({'keep_last': 0}, 'keep_last=0'),
    ({'max_restarts': -1}, 'max_restarts=-1'),
    ({'delete_after_export': 'yes'}, "delete_after_export='yes'"),
    ({'backup_root': ''}, "backup_root=''"),
    ({'backup_root': 3}, 'backup_root=3'),
    ({'lease': 'steal'}, "lease='steal'"),
    ({'lease_timeout_s': 0}, 'lease_timeout_s=0'),
    ({'lease_heartbeat_s': '10'}, "lease_heartbeat_s='10'"),
    ({'lease_heartbeat_s': True}, 'lease_heartbeat_s=True'),
    ({'save_every_s': float('nan')}, 'save_every_s=nan'),
    ({'save_every_s': float('inf')}, 'save_every_s=inf'),
    ({'lease_timeout_s': float('nan')}, 'lease_timeout_s=nan'),
    ({'lease_timeout_s': float('inf')}, 'lease_timeout_s=inf'),
    ({'lease_heartbeat_s': float('nan')},
     'lease_heartbeat_s=nan'),
    ({'lease_heartbeat_s': float('-inf')},
     'lease_heartbeat_s=-inf'),
    ({'max_restarts': float('nan')}, 'max_restarts=nan'),
    ({'hang_timeout_s': -1}, 'hang_timeout_s=-1'),
    ({'hang_timeout_s': float('nan')}, 'hang_timeout_s=nan'),
    ({'hang_timeout_s': float('inf')}, 'hang_timeout_s=inf'),
    ({'hang_timeout_s': '30'}, "hang_timeout_s='30'"),
])
def test_bad_config_names_value_and_allowed(values, message):
  with pytest.raises(ValueError) as error:
    FaultToleranceConfig.from_dict(values)
  assert message in str(error.value)
  assert 'must be' in str(error.value)


def test_unknown_config_key_is_rejected_with_allowed_keys():
  with pytest.raises(ValueError, match=r"\['save_every_step'\].*allowed.*"
                     'save_every_steps'):
    FaultToleranceConfig.from_dict({'save_every_step': 10})


def test_fault_tolerance_splits_checkpoints_from_supervision():
  """The exec property's one flat object: the training processes get the
  checkpoint settings, the supervisor its own."""
  config = FaultToleranceConfig.from_dict({
      'max_restarts': 0, 'keep_last': 5, 'timeout_s': 100,
      'hang_timeout_s': 7, 'rescale_check_s': 3})
  checkpoint = config.checkpoint()
  assert type(checkpoint) is CheckpointConfig  # pylint: disable=unidiomatic-typecheck
  assert checkpoint.keep_last == 5 and not hasattr(checkpoint, 'max_restarts')
  assert config.supervision() == SupervisionConfig(
      max_restarts=0, timeout_s=100, hang_timeout_s=7, rescale_check_s=3)
  with pytest.raises(ValueError, match=r"\['max_restarts'\]"):
    CheckpointConfig.from_dict({'max_restarts': 1})


def test_both_intervals_may_be_disabled_or_combined():
  assert FaultToleranceConfig(save_every_steps=None).validate()
  assert FaultToleranceConfig(save_every_steps=5,
                              save_every_s=0.5).validate()


# ------------------------------------------------------- stable location


def test_fingerprint_is_stable_and_sensitive():
  inputs = {'examples': '/p/Transform/examples/7', 'graph': '/p/T/graph/7'}
  config = {'hparams': {'lr': 0.1}, 'train_steps': 100}
  fingerprint = location_lib.training_fingerprint(inputs, config)
  assert fingerprint == location_lib.training_fingerprint(
      dict(reversed(list(inputs.items()))), dict(config))
  assert len(fingerprint) == 16
  changed_input = dict(inputs, examples='/p/Transform/examples/8')
  changed_config = dict(config, hparams={'lr': 0.2})
  assert location_lib.training_fingerprint(changed_input,
                                            config) != fingerprint
  assert location_lib.training_fingerprint(inputs,
                                            changed_config) != fingerprint


@pytest.mark.parametrize('root, expected', [
    ('gs://bucket/backups/', 'gs://bucket/backups/taxi/Trainer/abc'),
    ('hdfs://nn:8020/x', 'hdfs://nn:8020/x/taxi/Trainer/abc'),
    ('/tmp/ckpts', '/tmp/ckpts/taxi/Trainer/abc'),
])
def test_stable_checkpoint_dir_keeps_the_filesystem(root, expected):
  assert location_lib.stable_checkpoint_dir(root, 'taxi', 'Trainer',
                                             'abc') == expected


def test_stable_checkpoint_dir_sanitizes_and_rejects_empty():
  assert location_lib.stable_checkpoint_dir(
      '/r', 'my pipeline', 'Trainer.v2/x', 'f') == (
          '/r/my_pipeline/Trainer.v2_x/f')
  with pytest.raises(ValueError, match="node_id=''"):
    location_lib.stable_checkpoint_dir('/r', 'p', '', 'f')


def test_checkpoint_root_is_the_backup_root_else_under_the_pipeline_root():
  """The executor's and the Kubeflow compile's default alike."""
  assert location_lib.checkpoint_root('gs://b/ckpt', 'gs://b/root') == (
      'gs://b/ckpt')
  assert location_lib.checkpoint_root(None, 'gs://b/root') == (
      'gs://b/root/_hpm_checkpoints')
  assert location_lib.checkpoint_root('', 'ram://') == 'ram://_hpm_checkpoints'


# ------------------------------------------------------------- the store


class _State:
  """A checkpointable stand-in for model + optimizer + step."""

  def __init__(self):
    self.weights = tf.Variable(tf.zeros([64]))
    self.step = tf.Variable(0, dtype=tf.int64)
    self.checkpoint = tf.train.Checkpoint(weights=self.weights, step=self.step)

  def set(self, step):
    self.step.assign(step)
    self.weights.assign(tf.fill([64], float(step)))


@pytest.fixture(params=['local', 'ram'])
def root(request, tmp_path):
  """A local directory and TF's in-memory filesystem (a non-POSIX gfile)."""
  if request.param == 'local':
    return str(tmp_path / 'ckpts')
  # No glob metacharacters (the node name has '[ram]'): TF globs on read.
  return f'ram://hpm-{uuid.uuid4().hex}'


def _save_steps(store, state, steps):
  for step in steps:
    state.set(step)
    store.save(step)


def test_checkpoint_folder_names():
  # The one literal: folders saved by earlier versions must still be found.
  assert store_lib.checkpoint_name(120) == 'ckpt-000000000120'
  assert store_lib.step_of('gs://b/fp/ckpt-000000000120/') == 120
  assert store_lib.is_checkpoint_name('ckpt-000000000000')
  for other in ('ckpt-120', 'LEASE.json', 'progress.json', 'ckpt.index'):
    assert store_lib.step_of(other) is None
    assert not store_lib.is_checkpoint_name(other)


def test_save_restore_and_keep_last(root):
  state = _State()
  store = CheckpointStore(root + '/fp', state.checkpoint, keep_last=2)
  assert store.restore_latest() is None
  _save_steps(store, state, [10, 20, 30])
  assert _published(store) == [30, 20]
  state.set(0)
  restored = store.restore_latest()
  assert restored.step == 30 and restored.skipped == []
  assert int(state.step.numpy()) == 30
  assert float(state.weights.numpy()[0]) == 30.0
  manifest = store.verify(restored.path)
  assert manifest['step'] == 30 and manifest['version'] == 2
  # Sizes of every file, the sha256 of the index (TF checksums the data).
  files = manifest['files']
  assert set(files) == {store_lib.INDEX_NAME, _data_file(restored.path)}
  assert len(files[store_lib.INDEX_NAME]['sha256']) == 64
  assert all(tf.io.gfile.stat(restored.path + '/' + name).length == f['size']
             for name, f in files.items())


def test_save_reads_back_only_the_index(root):
  state = _State()
  store = CheckpointStore(root + '/fp', state.checkpoint)
  with FaultyStorage(root, []) as faults:
    _save_steps(store, state, [1, 2])
  assert faults.opened_for_read
  assert all(p.endswith('/' + store_lib.INDEX_NAME)
             for p in faults.opened_for_read)


def _data_file(path):
  return [n for n in tf.io.gfile.listdir(path) if '.data-' in n][0]


@pytest.mark.parametrize('file, damage, reason', [
    ('data', faulty_storage.halve, 'truncated'),
    # The weights, the step counter and the object graph (TF's crc32c).
    ('data', faulty_storage.flip(0.0), 'crc32c'),
    ('data', faulty_storage.flip(0.5), 'crc32c'),
    ('data', faulty_storage.flip(1.0), 'crc32c'),
    ('index', faulty_storage.flip(0.5), 'sha256'),
])
def test_corrupt_newest_falls_back_to_previous(root, file, damage, reason,
                                               caplog):
  state = _State()
  store = CheckpointStore(root + '/fp', state.checkpoint, keep_last=3)
  _save_steps(store, state, [5, 10])
  newest = store.checkpoint_dirs()[0]
  name = _data_file(newest) if file == 'data' else store_lib.INDEX_NAME
  faulty_storage.rewrite(newest + '/' + name, damage)
  state.set(0)
  restored = store.restore_latest()
  assert restored.step == 5
  assert float(state.weights.numpy()[0]) == 5.0
  assert int(state.step.numpy()) == 5
  assert restored.skipped == [{'path': newest, 'reason': restored.skipped[0][
      'reason'], 'deleted': True}]
  assert reason in restored.skipped[0]['reason']
  assert 'falling back' in caplog.text
  # The unusable checkpoint is gone, so later pruning cannot keep it.
  assert store.checkpoint_dirs() == [
      root + '/fp/' + store_lib.checkpoint_name(5)]


def test_crash_before_manifest_never_looks_valid(root, monkeypatch):
  state = _State()
  store = CheckpointStore(root + '/fp', state.checkpoint)
  _save_steps(store, state, [4])

  def crash(*unused_args, **unused_kwargs):
    raise KeyboardInterrupt('killed while publishing')

  monkeypatch.setattr(store_lib.storage, 'write_json', crash)
  state.set(8)
  with pytest.raises(KeyboardInterrupt):
    store.save(8)
  monkeypatch.undo()
  # The data files of step 8 are all there, only the manifest is missing.
  assert tf.io.gfile.exists(
      f'{root}/fp/{store_lib.checkpoint_name(8)}/{store_lib.INDEX_NAME}')
  state.set(0)
  restored = store.restore_latest()
  assert restored.step == 4
  assert 'no manifest' in restored.skipped[0]['reason']
  # Re-saving the same step after the crash publishes it normally.
  state.set(8)
  store.save(8)
  assert store.restore_latest().step == 8


def test_all_corrupt_starts_from_scratch(root):
  state = _State()
  store = CheckpointStore(root + '/fp', state.checkpoint)
  _save_steps(store, state, [3])
  tf.io.gfile.remove(
      store.checkpoint_dirs()[0] + '/' + store_lib.INDEX_NAME)
  assert store.restore_latest() is None
  assert store.checkpoint_dirs() == []


def test_non_chief_saves_nothing_shared(root):
  state = _State()
  store = CheckpointStore(root + '/fp', state.checkpoint, is_chief=False)
  state.set(7)
  assert store.save(7) == ''
  assert store.checkpoint_dirs() == []
  store.records.append_event({'event': 'x'})
  store.records.write_progress(7)
  assert not tf.io.gfile.exists(root + '/fp')


def test_events_progress_and_other_fingerprints(root):
  state = _State()
  old = CheckpointStore(root + '/node/oldfingerprint', state.checkpoint)
  _save_steps(old, state, [1])
  store = CheckpointStore(root + '/node/newfingerprint', state.checkpoint)
  assert store.other_fingerprints() == ['oldfingerprint']
  assert store.records.read_progress() is None
  store.records.write_progress(12)
  assert store.records.read_progress()['step'] == 12
  store.records.append_event({'event': 'fresh_start'})
  assert store.records.append_event({'event': 'resumed'}) == [
      {'event': 'fresh_start'}, {'event': 'resumed'}]
  assert store.records.read_events()[-1] == {'event': 'resumed'}
  store.delete_all()
  assert not tf.io.gfile.exists(root + '/node/newfingerprint')
  assert old.checkpoint_dirs()


def test_progress_marker_records_the_latest_step(root):
  store = CheckpointStore(root + '/fp', _State().checkpoint)
  marker = records_lib.ProgressMarker(store.records, min_interval_seconds=0.01)
  for step in range(1, 50):
    marker.update(step)
  marker.close()
  assert store.records.read_progress()['step'] == 49


def test_progress_marker_close_ends_the_pause_between_writes(root):
  """close() in the pause after a write writes the latest step and returns
  at once: waiting the pause out made every run's end late (by up to a
  second at the default)."""
  store = CheckpointStore(root + '/fp', _State().checkpoint)
  marker = records_lib.ProgressMarker(store.records,
                                      min_interval_seconds=3600)
  marker.update(1)
  deadline = time.monotonic() + 30
  while store.records.read_progress() is None and time.monotonic() < deadline:
    time.sleep(0.01)
  marker.update(2)
  closer = threading.Thread(target=marker.close, daemon=True)
  closer.start()
  closer.join(60)
  assert not closer.is_alive(), 'close() waited for the pause to end'
  assert store.records.read_progress()['step'] == 2


# --------------------------------------------------------- flaky storage


def _published(store):
  """Steps of the checkpoint folders there, newest first."""
  return [store_lib.step_of(p) for p in store.checkpoint_dirs()]


@pytest.mark.parametrize('fault', [
    Fault('checkpoint_write', 2, 'unavailable'),
    Fault('write', 3, 'deadline', count=2),
    Fault('stat', 4, 'reset'),
    Fault('list', 2, 'unavailable'),
    Fault('delete', 1, 'unavailable'),
    Fault('read', 1, 'deadline'),
    Fault('checkpoint_write', 1, 'slow', count=3),
], ids=lambda f: f'{f.kind}-{f.nth}-{f.error}')
def test_transient_faults_while_saving_are_retried_and_delete_nothing(
    root, fault):
  state = _State()
  store = CheckpointStore(root + '/fp', state.checkpoint, keep_last=2,
                          retry=NO_WAIT)
  with FaultyStorage(root, [fault]) as faults:
    _save_steps(store, state, [1, 2, 3])
  assert faults.injected, 'the fault was never reached'
  # Only pruning deleted anything: step 1, after step 3 was published.
  assert faults.deleted == [root + '/fp/' + store_lib.checkpoint_name(1)]
  assert _published(store) == [3, 2]
  retried = fault.error != 'slow'
  assert len(store.retries) == (fault.count if retried else 0)
  if retried:
    assert 'injected' in store.retries[0]['error']
  state.set(0)
  assert store.restore_latest().step == 3
  assert float(state.weights.numpy()[0]) == 3.0


@pytest.mark.parametrize('fault', [
    Fault('checkpoint_read', 1, 'unavailable', count=2),
    Fault('read', 1, 'reset'),
    Fault('stat', 2, 'deadline'),
    Fault('list', 1, 'unavailable'),
], ids=lambda f: f'{f.kind}-{f.nth}-{f.error}')
def test_transient_faults_while_restoring_restore_the_newest(root, fault):
  state = _State()
  store = CheckpointStore(root + '/fp', state.checkpoint, retry=NO_WAIT)
  _save_steps(store, state, [4, 8])
  state.set(0)
  with FaultyStorage(root, [fault]) as faults:
    restored = store.restore_latest()
  assert faults.injected and faults.deleted == []
  assert restored.step == 8 and restored.skipped == []
  assert float(state.weights.numpy()[0]) == 8.0
  assert len(store.retries) == fault.count


def test_storage_that_keeps_failing_fails_the_restore_and_deletes_nothing(
    root):
  state = _State()
  store = CheckpointStore(root + '/fp', state.checkpoint, retry=NO_WAIT)
  _save_steps(store, state, [4, 8])
  with FaultyStorage(root, [Fault('checkpoint_read', 1, 'unavailable',
                                  count=100)]) as faults:
    with pytest.raises(store_lib.CheckpointStorageError,
                       match=store_lib.checkpoint_name(8) +
                       '.*UnavailableError.*Nothing was deleted'):
      store.restore_latest()
  assert faults.deleted == []
  assert len(store.retries) == NO_WAIT.attempts - 1
  assert _published(store) == [8, 4]


def test_a_write_the_store_cut_short_is_caught_by_tf_on_restore(root):
  """The size recorded is the cut one: TF's own checksums catch it."""
  state = _State()
  store = CheckpointStore(root + '/fp', state.checkpoint)
  _save_steps(store, state, [4])
  with FaultyStorage(root, [Fault('checkpoint_write', 1, 'truncate')]):
    _save_steps(store, state, [8])
  state.set(0)
  restored = store.restore_latest()
  assert restored.step == 4 and float(state.weights.numpy()[0]) == 4.0
  [skipped] = restored.skipped
  assert store_lib.step_of(skipped['path']) == 8 and skipped['deleted']
  assert 'crc32c' in skipped['reason']


def test_a_cut_manifest_is_never_restored(root):
  state = _State()
  store = CheckpointStore(root + '/fp', state.checkpoint)
  _save_steps(store, state, [4])
  # Writes of step 8: the TF files go through C++; the manifest is write 1.
  with FaultyStorage(root, [Fault('write', 1, 'truncate')]) as faults:
    _save_steps(store, state, [8])
  assert f'{store_lib.checkpoint_name(8)}/{store_lib.MANIFEST_NAME}' in (
      faults.injected[0]['path'])
  restored = store.restore_latest()
  assert restored.step == 4
  assert 'unreadable manifest' in restored.skipped[0]['reason']


# ------------------------------------------------------- model mismatch


@pytest.mark.parametrize('changed, message', [
    (lambda: tf.train.Checkpoint(weights=tf.Variable(tf.zeros([32])),
                                 step=tf.Variable(0, dtype=tf.int64)),
     r'shape \(64,\).*shape \(32,\)'),
    (lambda: tf.train.Checkpoint(weights=tf.Variable(tf.zeros([64])),
                                 step=tf.Variable(0, dtype=tf.int64),
                                 extra=tf.Variable(1.0)),
     'not bound to checkpointed values'),
    (lambda: tf.train.Checkpoint(weights=tf.Variable(tf.zeros([64])),
                                 step=tf.Variable(0, dtype=tf.int32)),
     'expected dtype int32'),
], ids=['shape', 'new variable', 'dtype'])
def test_a_changed_model_is_a_clear_error_and_keeps_checkpoints(
    root, changed, message):
  state = _State()
  _save_steps(CheckpointStore(root + '/fp', state.checkpoint), state, [4, 8])
  store = CheckpointStore(root + '/fp', changed())
  with pytest.raises(store_lib.CheckpointMismatchError,
                     match=message) as error:
    store.restore_latest()
  assert (f'{store_lib.checkpoint_name(8)} is intact but does not fit the '
          'model') in str(error.value)
  assert 'are kept' in str(error.value)
  assert _published(store) == [8, 4]


# ----------------------------------------------------------------- lease


def _lease_store(root, run_id, state=None, heartbeat=10.0):
  return CheckpointStore(root + '/fp', (state or _State()).checkpoint,
                         keep_last=1, run_id=run_id,
                         lease_heartbeat_s=heartbeat, retry=NO_WAIT)


def _write_lease(root, **holder):
  lease = {'run_id': 'other-run', 'host': socket.gethostname(),
           'pid': os.getpid(), 'token': 'theirs', 'heartbeat': time.time(),
           'heartbeat_seconds': 10.0, **holder}
  storage.write_json(root + '/fp/' + lease_lib.LEASE_NAME, lease)
  return lease


def test_a_second_run_fails_naming_the_holder_and_prunes_nothing(root):
  state = _State()
  first = _lease_store(root, 'model_run/1', state)
  assert first.acquire_lease() is None
  _save_steps(first, state, [4])
  second = _lease_store(root, 'model_run/2')
  with pytest.raises(lease_lib.LeaseHeldError) as error:
    second.acquire_lease('fail')
  message = str(error.value)
  assert "run 'model_run/1'" in message and str(os.getpid()) in message
  assert "fault_tolerance.lease='wait'" in message
  # The second run never got to save or prune.
  with pytest.raises(RuntimeError, match='never acquired'):
    second.save(5)
  _save_steps(first, state, [8])
  assert _published(first) == [8]
  first.release_lease()
  assert not tf.io.gfile.exists(first.lease.path)


def test_wait_mode_takes_the_lease_once_the_holder_releases(root, caplog):
  first = _lease_store(root, 'model_run/1')
  first.acquire_lease()
  second = _lease_store(root, 'model_run/2', heartbeat=0.05)
  got = {}
  waiter = threading.Thread(target=lambda: got.update(
      event=second.acquire_lease('wait', timeout_seconds=300)))
  waiter.start()
  deadline = time.monotonic() + 60
  while 'Waiting for the checkpoint lease' not in caplog.text:
    assert time.monotonic() < deadline and waiter.is_alive()
    time.sleep(0.01)
  first.release_lease()
  waiter.join()
  assert got['event']['event'] == 'lease_waited'
  assert got['event']['previous_holder']['run_id'] == 'model_run/1'
  second.lease.ensure_held()
  second.release_lease()


def test_wait_mode_gives_up_after_its_timeout(root):
  _lease_store(root, 'model_run/1').acquire_lease()
  second = _lease_store(root, 'model_run/2', heartbeat=0.01)
  with pytest.raises(lease_lib.LeaseHeldError,
                     match='still holds it after'):
    second.acquire_lease('wait', timeout_seconds=0.05)


def _dead_pid():
  process = subprocess.Popen([sys.executable, '-c', 'pass'])
  process.wait()
  return process.pid


@pytest.mark.parametrize('holder, reason', [
    (lambda: {'heartbeat': time.time() - 3600, 'host': 'elsewhere'},
     'heartbeat is 3600 s old'),
    (lambda: {'pid': _dead_pid()}, 'is gone'),
    (lambda: {'token': ''}, 'unreadable'),
], ids=['stale heartbeat', 'dead holder', 'unreadable'])
def test_a_dead_or_stale_lease_is_taken_over_and_recorded(root, holder,
                                                          reason):
  previous = _write_lease(root, **holder())
  store = _lease_store(root, 'model_run/1')
  event = store.acquire_lease('fail')
  assert event['event'] == 'lease_taken_over' and reason in event['reason']
  assert event['previous_holder'] == previous
  assert store.lease.read()['token'] == store.lease.holder['token']
  store.release_lease()


def test_a_restarted_attempt_of_the_same_run_takes_its_lease_at_once(root):
  """Launcher restarts and executor retries keep the model_run URI."""
  _write_lease(root, run_id='model_run/1', host='elsewhere', pid=1)
  store = _lease_store(root, 'model_run/1')
  assert store.acquire_lease('fail') is None  # The 'resumed' event tells.
  assert store.lease.read()['token'] == store.lease.holder['token']
  store.release_lease()


def test_a_live_lease_on_another_host_is_not_taken_over(root):
  _write_lease(root, host='elsewhere', pid=1)
  with pytest.raises(lease_lib.LeaseHeldError, match='on elsewhere'):
    _lease_store(root, 'model_run/1').acquire_lease('fail')


def test_a_run_whose_lease_was_taken_stops_before_deleting(root):
  state = _State()
  store = _lease_store(root, 'model_run/1', state)
  store.acquire_lease()
  _save_steps(store, state, [4])
  _write_lease(root, host='elsewhere')  # Another run took over.
  with FaultyStorage(root, []) as faults:
    with pytest.raises(lease_lib.LeaseLostError,
                       match="taken over by run 'other-run'"):
      _save_steps(store, state, [8])
    with pytest.raises(lease_lib.LeaseLostError):
      store.delete_all()
  assert faults.deleted == []
  assert _published(store) == [4]
  store.release_lease()
  # The other run's lease stays.
  assert store.lease.read()['token'] == 'theirs'


def test_the_heartbeat_refreshes_the_lease(root):
  store = _lease_store(root, 'model_run/1', heartbeat=0.01)
  store.acquire_lease()
  first = store.lease.read()['heartbeat']
  deadline = time.monotonic() + 60
  while store.lease.read()['heartbeat'] == first:
    assert time.monotonic() < deadline
    time.sleep(0.01)
  store.release_lease()


def test_delete_all_under_the_lease_leaves_nothing(root):
  state = _State()
  store = _lease_store(root, 'model_run/1', state, heartbeat=0.01)
  store.acquire_lease()
  _save_steps(store, state, [4])
  store.delete_all()
  store.release_lease()
  assert not tf.io.gfile.exists(root + '/fp')


def test_checkpointer_events_say_what_storage_did(root):
  """Lease taken over, damaged checkpoint skipped and deleted, retries."""
  state = _State()
  config = CheckpointConfig(save_every_steps=4)
  first = CheckpointStore(root + '/fp', state.checkpoint)
  _save_steps(first, state, [4, 8])
  newest = first.checkpoint_dirs()[0]
  faulty_storage.rewrite(newest + '/' + _data_file(newest),
                         faulty_storage.flip(0.5))
  _write_lease(root, pid=_dead_pid(), run_id='model_run/1')
  checkpointer = Checkpointer(root + '/fp', state.checkpoint, config,
                              is_chief=True, manifest_extra={},
                              run_id='model_run/2')
  checkpointer.store._retry = NO_WAIT  # pylint: disable=protected-access
  try:
    with FaultyStorage(root, [Fault('checkpoint_read', 1, 'unavailable'),
                              Fault('checkpoint_write', 1, 'deadline')]):
      checkpointer.acquire_lease()
      assert checkpointer.restore() == 4
      checkpointer.save(8)
      checkpointer.record_storage_retries()
  finally:
    checkpointer.close()
    checkpointer.release()
  events = checkpointer.events
  assert [e['event'] for e in events] == ['lease_taken_over', 'resumed',
                                          'storage_retried']
  assert 'is gone' in events[0]['reason']
  [skipped] = events[1]['skipped_checkpoints']
  assert skipped['path'] == newest and skipped['deleted'] is True
  assert 'crc32c' in skipped['reason']
  assert events[2]['retries'] == 2
  assert events[2]['operations'] == {'read checkpoint': 1,
                                     'write checkpoint': 1}
  assert CheckpointStore(root + '/fp', None).records.read_events() == events


@pytest.mark.parametrize('reached', [0, 3])
def test_an_attempt_stopped_before_its_first_checkpoint_is_a_restart(
    root, reached):
  """Its progress marker may say step 0 (the marker is throttled); the
  rerun still says it restarted, and how many steps it lost at least."""
  state = _State()
  CheckpointStore(root + '/fp', state.checkpoint).records.write_progress(
      reached)
  checkpointer = Checkpointer(root + '/fp', state.checkpoint,
                              CheckpointConfig(save_every_steps=4),
                              is_chief=True, manifest_extra={})
  try:
    assert checkpointer.restore() == 0
  finally:
    checkpointer.close()
  [event] = checkpointer.events
  assert event['event'] == 'restarted'
  assert (event['from_step'], event['steps_lost']) == (0, reached)


def test_progress_marker_writes_new_details_of_the_same_step(root):
  """A save records the step, then the loop the step with its details: the
  second write is not skipped for having the same step."""
  store = CheckpointStore(root + '/fp', _State().checkpoint)
  marker = records_lib.ProgressMarker(store.records, min_interval_seconds=0.01)
  marker.update(150, {'checkpoints': 2})
  deadline = time.monotonic() + 30
  while store.records.read_progress() is None and time.monotonic() < deadline:
    time.sleep(0.01)
  marker.update(150, {'checkpoints': 3})
  marker.close()
  assert store.records.read_progress()['checkpoints'] == 3


def test_progress_marker_close_during_a_slow_write_keeps_the_last_details(
    root):
  """The last call saves (a bare step), then records its details and closes
  while the bare step is still being written (an object store): the marker
  still ends with the details, which the supervisor's progress line needs."""
  writing = threading.Event()

  def slow_io(what, fn, *args):
    writing.set()
    time.sleep(0.3)
    return fn(*args)

  records = records_lib.RunRecords(root + '/fp', True, io=slow_io)
  marker = records_lib.ProgressMarker(records, min_interval_seconds=0.01)
  marker.update(600)
  assert writing.wait(30)
  marker.update(600, {'train_steps': 600})
  marker.close()
  recorded = records_lib.read_progress(root + '/fp')
  assert (recorded['step'], recorded.get('train_steps')) == (600, 600)
