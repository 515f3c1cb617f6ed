"""CheckpointConfig, the stable checkpoint location and CheckpointStore."""

import json
import time
import uuid

import pytest
import tensorflow as tf

from components.trainer import checkpointing
from components.trainer.checkpointing import CheckpointConfig
from components.trainer.checkpointing import CheckpointStore


# ----------------------------------------------------------------- config


def test_default_config_is_valid_and_round_trips():
  config = CheckpointConfig().validate()
  assert config.save_every_steps == 100 and config.keep_last == 3
  assert config.delete_after_export is True and config.max_restarts == 2
  assert CheckpointConfig.from_dict(config.to_dict()) == config
  assert CheckpointConfig.from_json(config.to_json()) == config
  assert CheckpointConfig.from_json('') == CheckpointConfig()
  json.dumps(config.to_dict())


@pytest.mark.parametrize('values, message', [
    ({'save_every_steps': 0}, 'save_every_steps=0'),
    ({'save_every_steps': 2.5}, 'save_every_steps=2.5'),
    ({'save_every_steps': True}, 'save_every_steps=True'),
    ({'save_every_seconds': 0}, 'save_every_seconds=0'),
    ({'save_every_seconds': '60'}, "save_every_seconds='60'"),
    ({'keep_last': 0}, 'keep_last=0'),
    ({'max_restarts': -1}, 'max_restarts=-1'),
    ({'delete_after_export': 'yes'}, "delete_after_export='yes'"),
    ({'backup_root': ''}, "backup_root=''"),
    ({'backup_root': 3}, 'backup_root=3'),
])
def test_bad_config_names_value_and_allowed(values, message):
  with pytest.raises(ValueError) as error:
    CheckpointConfig.from_dict(values)
  assert message in str(error.value)
  assert 'must be' in str(error.value)


def test_unknown_config_key_is_rejected_with_allowed_keys():
  with pytest.raises(ValueError, match=r"\['save_every_step'\].*allowed.*"
                     'save_every_steps'):
    CheckpointConfig.from_dict({'save_every_step': 10})


def test_both_intervals_may_be_disabled_or_combined():
  assert CheckpointConfig(save_every_steps=None).validate()
  assert CheckpointConfig(save_every_steps=5, save_every_seconds=0.5).validate()


# ------------------------------------------------------- stable location


def test_fingerprint_is_stable_and_sensitive():
  inputs = {'examples': '/p/Transform/examples/7', 'graph': '/p/T/graph/7'}
  config = {'hparams': {'lr': 0.1}, 'train_steps': 100}
  fingerprint = checkpointing.training_fingerprint(inputs, config)
  assert fingerprint == checkpointing.training_fingerprint(
      dict(reversed(list(inputs.items()))), dict(config))
  assert len(fingerprint) == 16
  changed_input = dict(inputs, examples='/p/Transform/examples/8')
  changed_config = dict(config, hparams={'lr': 0.2})
  assert checkpointing.training_fingerprint(changed_input,
                                            config) != fingerprint
  assert checkpointing.training_fingerprint(inputs,
                                            changed_config) != fingerprint


@pytest.mark.parametrize('root, expected', [
    ('gs://bucket/backups/', 'gs://bucket/backups/taxi/Trainer/abc'),
    ('hdfs://nn:8020/x', 'hdfs://nn:8020/x/taxi/Trainer/abc'),
    ('/tmp/ckpts', '/tmp/ckpts/taxi/Trainer/abc'),
])
def test_stable_checkpoint_dir_keeps_the_filesystem(root, expected):
  assert checkpointing.stable_checkpoint_dir(root, 'taxi', 'Trainer',
                                             'abc') == expected


def test_stable_checkpoint_dir_sanitizes_and_rejects_empty():
  assert checkpointing.stable_checkpoint_dir(
      '/r', 'my pipeline', 'Trainer.v2/x', 'f') == (
          '/r/my_pipeline/Trainer.v2_x/f')
  with pytest.raises(ValueError, match="node_id=''"):
    checkpointing.stable_checkpoint_dir('/r', 'p', '', 'f')


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


def test_save_restore_and_keep_last(root):
  state = _State()
  store = CheckpointStore(root + '/fp', state.checkpoint, keep_last=2)
  assert store.restore_latest() is None
  _save_steps(store, state, [10, 20, 30])
  assert [p.rsplit('/', 1)[1] for p in store.checkpoint_dirs()] == [
      'ckpt-000000000030', 'ckpt-000000000020']
  state.set(0)
  restored = store.restore_latest()
  assert restored.step == 30 and restored.skipped == []
  assert int(state.step.numpy()) == 30
  assert float(state.weights.numpy()[0]) == 30.0
  manifest = store.verify(restored.path)
  assert manifest['step'] == 30
  assert all(len(f['sha256']) == 64 for f in manifest['files'].values())


def _data_file(path):
  return [n for n in tf.io.gfile.listdir(path) if '.data-' in n][0]


def _rewrite(path, transform):
  with tf.io.gfile.GFile(path, 'rb') as f:
    content = f.read()
  # TF's ram:// filesystem appends to an existing file instead of replacing.
  tf.io.gfile.remove(path)
  with tf.io.gfile.GFile(path, 'wb') as f:
    f.write(transform(content))


@pytest.mark.parametrize('damage, reason', [
    (lambda b: b[:len(b) // 2], 'truncated'),
    (lambda b: b[:16] + bytes([b[16] ^ 0xFF]) + b[17:], 'sha256'),
])
def test_corrupt_newest_falls_back_to_previous(root, damage, reason, caplog):
  state = _State()
  store = CheckpointStore(root + '/fp', state.checkpoint, keep_last=3)
  _save_steps(store, state, [5, 10])
  newest = store.checkpoint_dirs()[0]
  _rewrite(newest + '/' + _data_file(newest), damage)
  state.set(0)
  restored = store.restore_latest()
  assert restored.step == 5
  assert float(state.weights.numpy()[0]) == 5.0
  assert restored.skipped[0]['path'] == newest
  assert reason in restored.skipped[0]['reason']
  assert 'falling back' in caplog.text
  # The unusable checkpoint is gone, so later pruning cannot keep it.
  assert store.checkpoint_dirs() == [root + '/fp/ckpt-000000000005']


def test_crash_before_manifest_never_looks_valid(root, monkeypatch):
  state = _State()
  store = CheckpointStore(root + '/fp', state.checkpoint)
  _save_steps(store, state, [4])

  def crash(*unused_args, **unused_kwargs):
    raise KeyboardInterrupt('killed while publishing')

  monkeypatch.setattr(checkpointing.storage, 'write_json', crash)
  state.set(8)
  with pytest.raises(KeyboardInterrupt):
    store.save(8)
  monkeypatch.undo()
  # The data files of step 8 are all there, only the manifest is missing.
  assert tf.io.gfile.exists(root + '/fp/ckpt-000000000008/ckpt.index')
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
  tf.io.gfile.remove(store.checkpoint_dirs()[0] + '/ckpt.index')
  assert store.restore_latest() is None
  assert store.checkpoint_dirs() == []


def test_non_chief_saves_nothing_shared(root):
  state = _State()
  store = CheckpointStore(root + '/fp', state.checkpoint, is_chief=False)
  state.set(7)
  assert store.save(7) == ''
  assert store.checkpoint_dirs() == []
  store.append_event({'event': 'x'})
  store.write_progress(7)
  assert not tf.io.gfile.exists(root + '/fp')


def test_events_progress_and_other_fingerprints(root):
  state = _State()
  old = CheckpointStore(root + '/node/oldfingerprint', state.checkpoint)
  _save_steps(old, state, [1])
  store = CheckpointStore(root + '/node/newfingerprint', state.checkpoint)
  assert store.other_fingerprints() == ['oldfingerprint']
  assert store.read_progress() is None
  store.write_progress(12)
  assert store.read_progress()['step'] == 12
  store.append_event({'event': 'fresh_start'})
  assert store.append_event({'event': 'resumed'}) == [
      {'event': 'fresh_start'}, {'event': 'resumed'}]
  assert store.read_events()[-1] == {'event': 'resumed'}
  store.delete_all()
  assert not tf.io.gfile.exists(root + '/node/newfingerprint')
  assert old.checkpoint_dirs()


def test_progress_marker_records_the_latest_step(root):
  store = CheckpointStore(root + '/fp', _State().checkpoint)
  marker = checkpointing.ProgressMarker(store, min_interval_seconds=0.01)
  for step in range(1, 50):
    marker.update(step)
  marker.close()
  assert store.read_progress()['step'] == 49


def test_progress_marker_writes_new_details_of_the_same_step(root):
  """A save records the step, then the loop the step with its details: the
  second write is not skipped for having the same step."""
  store = CheckpointStore(root + '/fp', _State().checkpoint)
  marker = checkpointing.ProgressMarker(store, min_interval_seconds=0.01)
  marker.update(150, {'checkpoints': 2})
  deadline = time.monotonic() + 30
  while store.read_progress() is None and time.monotonic() < deadline:
    time.sleep(0.01)
  marker.update(150, {'checkpoints': 3})
  marker.close()
  assert store.read_progress()['checkpoints'] == 3
