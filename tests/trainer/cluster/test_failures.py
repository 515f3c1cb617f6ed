"""Failures no relaunch can cure fail at once, naming what to fix; nothing
good is lost, and the run resumes exactly once the cause is removed.

The table (`components/trainer/common/failures.py`) per class; the supervisor's
use of a process's failure record; the damaged-file search; then the real
thing in supervised training processes: a truncated shard and one with a
flipped byte, a checkpoint location (a small tmpfs) that fills up
mid-training, and one that is read-only.
"""

import errno
import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from components.data import shard_check
from components.data import shard_index
from components.trainer.checkpoint import store as store_lib
from components.trainer.checkpoint.config import SupervisionConfig
from components.trainer.common import failures
from components.trainer.cluster import local_backend
from components.trainer.cluster.local_backend import ProcessSpec
from components.trainer.cluster import supervisor
from tests.support import small_disk
from tests.support import gzip_cuts
from components.testing import trainer_testing as tt

TRAIN_STEPS = 80  # More than an epoch (64 steps): every file is read.
NUM_EXAMPLES = 256
NUM_FILES = 4


@pytest.mark.parametrize('error, expected', [
    (tf.errors.DataLossError(None, None, 'truncated record at 10'),
     failures.CORRUPT_DATA),
    (tf.errors.NotFoundError(None, None, '/d/a.gz; No such file or directory'),
     failures.MISSING_FILE),
    # A restarted parameter server's lost variables: a relaunch cures it.
    (tf.errors.NotFoundError(None, None, 'Resource worker/x does not exist'),
     failures.TRANSIENT),
    (tf.errors.ResourceExhaustedError(
        None, None, '/c/ckpt_temp/part-0; No space left on device'),
     failures.STORAGE_FULL),
    (OSError(errno.ENOSPC, 'No space left on device'), failures.STORAGE_FULL),
    (OSError(errno.EROFS, 'Read-only file system'),
     failures.STORAGE_READ_ONLY),
    (tf.errors.PermissionDeniedError(None, None, 'gs://b/x: 403'),
     failures.PERMISSION_DENIED),
    # Throttled, unreachable, lost: relaunched.
    (tf.errors.ResourceExhaustedError(None, None, '429 Too Many Requests'),
     failures.TRANSIENT),
    (tf.errors.UnavailableError(None, None, 'Socket closed'),
     failures.TRANSIENT),
    (RuntimeError('worker lost'), failures.TRANSIENT),
    # Found against the shard index before training.
    (shard_index.ShardChangedError('/d/a.gz has 3 bytes'),
     failures.CORRUPT_DATA),
    (shard_index.ShardMissingError('/d/a.gz is gone'), failures.MISSING_FILE),
])
def test_one_table_tells_what_a_relaunch_can_cure(error, expected):
  assert failures.classify(error) is expected
  assert expected.retry == (expected is failures.TRANSIENT)


def test_the_cause_of_a_wrapping_error_decides():
  try:
    try:
      raise OSError(errno.ENOSPC, 'No space left on device')
    except OSError as e:
      raise RuntimeError('save failed') from e
  except RuntimeError as wrapped:
    assert failures.classify(wrapped) is failures.STORAGE_FULL


def test_the_short_text_is_the_errors_own_line():
  graph_error = tf.errors.NotFoundError(None, None, (
      'Graph execution error:\n\nDetected at node IteratorGetNext defined '
      'at (most recent call last):\n  File "x.py", line 1, in <module>\n\n'
      '/d/a.gz; No such file or directory\n\t [[{{node IteratorGetNext}}]]'))
  assert failures.short_text(graph_error) == (
      '/d/a.gz; No such file or directory')
  eager_error = tf.errors.DataLossError(None, None, (
      '{{function_node __wrapped__ReduceDataset_device_/job:localhost}} '
      'truncated record at 10 [Op:ReduceDataset]'))
  assert failures.short_text(eager_error) == (
      'truncated record at 10 [Op:ReduceDataset]')


def test_the_failure_record_leads_the_error_and_stops_relaunches(tmp_path):
  """A process that wrote a record and exited 78 is not relaunched, and the
  error starts with what to fix; one that crashed is relaunched as
  transient."""
  line = failures.record_line(failures.CORRUPT_DATA, 'The file x is bad.')
  failing = [ProcessSpec('worker-0', [sys.executable, '-c', (
      f'import sys; print({line!r}); sys.exit(78)')])]
  with pytest.raises(supervisor.ClusterFailedError) as error:
    local_backend.run_supervised(lambda attempt: failing, str(tmp_path / 'a'),
                            SupervisionConfig(max_restarts=2))
  assert str(error.value).startswith('The file x is bad.\n'), error.value
  assert error.value.relaunches == []
  assert error.value.failure.failure_class == 'corrupt_data'
  assert not (tmp_path / 'a' / 'attempt-1').exists()

  def crash_once(attempt):
    code = 'import sys; sys.exit(1)' if attempt == 0 else 'print("ok")'
    return [ProcessSpec('worker-0', [sys.executable, '-c', code])]

  result = local_backend.run_supervised(crash_once, str(tmp_path / 'b'),
                                   SupervisionConfig(max_restarts=2))
  [restart] = result.relaunches
  assert (restart.cause, restart.failure_class) == ('failure', 'transient')


def _damage(path: str, how: str) -> None:
  if how == 'missing':  # Listed (a link), gone when read.
    os.remove(path)
    os.symlink(path + '.gone', path)
    return
  with open(path, 'rb') as f:
    data = bytearray(f.read())
  if how == 'flipped':
    data[len(data) // 2] ^= 0xFF
    with open(path, 'wb') as f:
      f.write(bytes(data))
    return
  # Cut inside a record: where a cut reads silently depends on the bytes.
  gzip_cuts.cut_inside_a_record(path)


def test_a_gzip_file_cut_where_a_record_ends_is_found(tmp_path):
  """TF reads such a file without an error, only fewer records; the check
  reads the gzip stream to its end marker."""
  path = str(tmp_path / 'part.gz')
  gzip_cuts.write_records(path)
  silent_cuts = 0
  for cut, records in gzip_cuts.silent_cuts(path):
    silent_cuts += 1
    damaged = shard_check.first_damaged([path], 'GZIP')
    assert damaged and damaged['path'] == path, cut
    assert damaged['readable_records'] == records <= 32
    assert 'cut short' in damaged['error']
    if silent_cuts == 3:
      break
  assert silent_cuts  # The case exists for this file.


@pytest.mark.parametrize('how', ['truncated', 'flipped'])
def test_the_damaged_file_is_found_with_its_readable_records(tmp_path, how):
  data = tt.write_id_dataset(str(tmp_path), 64, num_files=2)
  files = sorted(tf.io.gfile.glob(data['pattern']))
  assert shard_check.first_damaged([data['pattern']], 'GZIP') is None
  _damage(files[1], how)
  damaged = shard_check.first_damaged([data['pattern']], 'GZIP')
  assert damaged['path'] == files[1]
  # gzip finds a flipped byte in the block it is in (here the whole small
  # file) or at the stream's checksum: no record of that block reads.
  assert (0 < damaged['readable_records'] < 32 if how == 'truncated' else
          0 <= damaged['readable_records'] < 32)
  assert damaged['error']


# --- real training processes


@pytest.fixture(scope='module')
def dataset(tmp_path_factory):
  return tt.write_id_dataset(str(tmp_path_factory.mktemp('ids')),
                             NUM_EXAMPLES, num_files=NUM_FILES)


def _task(root: str, data, checkpoint_dir=None, save_every_steps=4,
          step_sleep_s=0.0):
  return tt.make_task(
      root, data, train_steps=TRAIN_STEPS, per_replica_batch_size=4,
      seed=3, deterministic=True, checkpoint_dir=checkpoint_dir,
      hparams={'step_sleep_seconds': step_sleep_s},
      fault_tolerance={'save_every_steps': save_every_steps, 'keep_last': 2,
                       'max_restarts': 2})


def _train(task, root):
  """The production worker under the supervisor, max_restarts 2."""
  return tt.run_cluster(task, root, strategy='one_device', num_workers=1,
                        production=True, max_restarts=2)


@pytest.fixture(scope='module')
def baseline(tmp_path_factory, dataset):
  """An uninterrupted run: the final tensors every resumed run must end
  with."""
  root = str(tmp_path_factory.mktemp('baseline'))
  task = _task(root, dataset)
  _train(task, root)
  return tt.final_tensors(task)


def _assert_same_tensors(task, baseline):
  final = tt.final_tensors(task)
  assert sorted(final) == sorted(baseline)
  for name, value in baseline.items():
    np.testing.assert_array_equal(final[name], value, err_msg=name)


def _published_steps(checkpoint_dir: str):
  return sorted(
      store_lib.step_of(name) for name in os.listdir(checkpoint_dir)
      if store_lib.is_checkpoint_name(name) and os.path.exists(
          os.path.join(checkpoint_dir, name, store_lib.MANIFEST_NAME)))


@pytest.mark.slow
@pytest.mark.parametrize('how', ['truncated', 'flipped', 'missing'])
def test_a_damaged_or_missing_shard_fails_at_once_naming_it_then_resumes(
    tmp_path, dataset, baseline, how):
  data = tt.copy_dataset(dataset, str(tmp_path / 'data'))
  last_file = sorted(tf.io.gfile.glob(data['pattern']))[-1]
  good_bytes = open(last_file, 'rb').read()
  _damage(last_file, how)
  root = str(tmp_path / 'run')
  task = _task(root, data)

  with pytest.raises(supervisor.ClusterFailedError) as error:
    _train(task, root)

  message = str(error.value)
  if how == 'missing':
    assert message.startswith(f'{last_file}; No such file or directory')
    assert '(missing_file: not retried). Restore the file' in message
  else:
    assert message.startswith(f'The data file {last_file} is damaged after '
                              'record '), message
    assert '(corrupt_data: not retried). Replace the damaged file' in message
  assert error.value.relaunches == []  # No relaunch: it could not help.
  assert not os.path.exists(os.path.join(root, 'logs', 'attempt-1'))
  kept = _published_steps(task.checkpoint_dir)

  os.remove(last_file)  # The file copied again.
  with open(last_file, 'wb') as f:
    f.write(good_bytes)
  _train(task, root)
  result = tt.read_result(task)
  assert result.steps == TRAIN_STEPS
  assert result.loop.start_step == (kept[-1] if kept else 0)
  _assert_same_tensors(task, baseline)


@pytest.mark.slow
def test_a_shard_changed_since_the_last_attempt_fails_before_any_step(
    tmp_path, dataset):
  """The first attempt indexed the data (beside its checkpoints); a rerun
  finds a shard cut short before training, names it, and counts nothing
  again."""
  data = tt.copy_dataset(dataset, str(tmp_path / 'data'))
  root = str(tmp_path / 'run')
  first = _task(root, data)
  first.train_steps = 8
  _train(first, root)
  indexed = tt.read_result(first).loop.shard_index['train']
  assert indexed['records'] == NUM_EXAMPLES
  assert indexed['source'].startswith('built now (')
  shard = sorted(tf.io.gfile.glob(data['pattern']))[1]
  size = os.path.getsize(shard)
  with open(shard, 'r+b') as f:
    f.truncate(size - 100)
  task = _task(root, data)

  with pytest.raises(supervisor.ClusterFailedError) as error:
    _train(task, root)

  message = str(error.value)
  assert message.startswith(f'The data file {shard} has {size - 100:,} bytes; '
                            f'the shard index {task.checkpoint_dir}'), message
  assert '(corrupt_data: not retried)' in message
  assert error.value.relaunches == []
  # Before any step: the id log has only the first attempt's 8 steps.
  steps = {r['step'] for r in tt.read_id_log(task.hparams['id_log'])}
  assert steps == set(range(8))


@pytest.mark.slow
def test_a_full_checkpoint_location_says_so_keeps_the_last_good_one_and_resumes(
    tmp_path, dataset, baseline):
  root = str(tmp_path / 'run')
  with small_disk.tmpfs(str(tmp_path / 'small_disk'), '2m') as disk:
    checkpoints = os.path.join(disk, 'checkpoints')
    task = _task(root, dataset, checkpoint_dir=checkpoints,
                 step_sleep_s=0.1)
    filler = []

    def fill_after_the_first_checkpoint():
      # Mid-training: once the step-4 checkpoint is published.
      manifest = os.path.join(checkpoints, store_lib.checkpoint_name(4),
                              store_lib.MANIFEST_NAME)
      while not os.path.exists(manifest):
        time.sleep(0.02)
      filler.append(small_disk.fill(disk))

    filling = threading.Thread(target=fill_after_the_first_checkpoint,
                               daemon=True)
    filling.start()
    with pytest.raises(supervisor.ClusterFailedError) as error:
      _train(task, root)
    filling.join(timeout=5)

    message = str(error.value)
    assert message.startswith(f'The checkpoint location {checkpoints} is '
                              'full: saving step 8 failed'), message
    assert 'a checkpoint takes about' in message and 'bytes are free' in message
    assert ('The last good checkpoint is step 4 (' in message and
            'kept: a rerun resumes from it' in message), message
    assert '(storage_full: not retried)' in message
    assert error.value.relaunches == []
    assert _published_steps(checkpoints) == [4]  # Intact, not pruned.

    os.remove(filler[0])  # Space freed.
    _train(task, root)
    result = tt.read_result(task)
    assert result.loop.start_step == 4 and result.steps == TRAIN_STEPS
    _assert_same_tensors(task, baseline)


@pytest.mark.slow
def test_a_read_only_checkpoint_location_fails_at_once_and_loses_nothing(
    tmp_path, dataset, baseline):
  root = str(tmp_path / 'run')
  with small_disk.tmpfs(str(tmp_path / 'disk'), '4m') as disk:
    checkpoints = os.path.join(disk, 'checkpoints')
    first = _task(root, dataset, checkpoint_dir=checkpoints)
    first.train_steps = TRAIN_STEPS // 2
    _train(first, root)
    kept = _published_steps(checkpoints)
    subprocess.run(['mount', '-o', 'remount,ro', disk], check=True)
    task = _task(root, dataset, checkpoint_dir=checkpoints)

    with pytest.raises(supervisor.ClusterFailedError) as error:
      _train(task, root)

    message = str(error.value)
    assert message.startswith(f'The checkpoint location {checkpoints} is '
                              'read-only ('), message
    assert '(storage_read_only: not retried)' in message, message
    assert error.value.relaunches == []
    assert _published_steps(checkpoints) == kept

    subprocess.run(['mount', '-o', 'remount,rw', disk], check=True)
    _train(task, root)
    result = tt.read_result(task)
    assert result.loop.start_step == TRAIN_STEPS // 2
    _assert_same_tensors(task, baseline)
    shutil.rmtree(checkpoints)


@pytest.mark.slow
def test_a_full_model_location_fails_the_export_at_once_and_resumes_to_it(
    tmp_path, dataset, baseline):
  """Training ends, its last checkpoint is saved, the export finds the model
  location full: named, not retried; after space is freed the rerun resumes
  at the end and exports."""
  root = str(tmp_path / 'run')
  with small_disk.tmpfs(str(tmp_path / 'model_disk'), '1m') as disk:
    task = _task(root, dataset)
    task.serving_model_dir = os.path.join(disk, 'serving_model')
    filler = small_disk.fill(disk)

    with pytest.raises(supervisor.ClusterFailedError) as error:
      _train(task, root)

    message = str(error.value)
    assert message.startswith(
        f'The model location {task.serving_model_dir} is full'), message
    assert '(storage_full: not retried)' in message, message
    assert error.value.relaunches == []
    assert _published_steps(task.checkpoint_dir)[-1] == TRAIN_STEPS

    os.remove(filler)
    _train(task, root)
    result = tt.read_result(task)
    assert result.loop.start_step == result.steps == TRAIN_STEPS
    assert result.loop.exported
    _assert_same_tensors(task, baseline)
