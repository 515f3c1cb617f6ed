"""fault_tolerance.skip_unreadable_records: a damaged file is read up to its
first unreadable record, and every skip is recorded; never silently."""

import logging
import os

import tensorflow as tf

from components.data import input_pipeline
from components.data import shard_check
from components.data import shard_index
from components.data import unreadable
from components.trainer.managed import training
from components.testing import trainer_testing as tt

NUM_EXAMPLES = 256
TRAIN_STEPS = 12


def _flip_a_byte(path: str) -> None:
  with open(path, 'rb') as f:
    data = bytearray(f.read())
  data[len(data) // 2] ^= 0xFF
  with open(path, 'wb') as f:
    f.write(bytes(data))


def test_a_file_is_read_up_to_its_limit(tmp_path):
  data = tt.write_id_dataset(str(tmp_path), 32, num_files=2)
  files = sorted(tf.io.gfile.glob(data['pattern']))
  in_file = [r.numpy() for r in tf.data.TFRecordDataset(files[1], 'GZIP')]
  dataset = input_pipeline.read_batches(
      tf.data.Dataset.from_tensor_slices(files),
      input_pipeline.InputPipelineConfig(), 'GZIP', 1,
      readable_records={files[1]: 5})
  read = [batch[0].numpy() for batch in dataset]
  assert len(read) == 16 + 5
  assert [r for r in read if r in in_file] == in_file[:5]


def test_opted_in_training_reads_past_a_damaged_file_and_records_it(
    tmp_path, caplog, monkeypatch):
  folder = str(tmp_path / 'examples' / 'Split-train')
  data = tt.write_id_dataset(folder, NUM_EXAMPLES, num_files=4)
  files = sorted(tf.io.gfile.glob(data['pattern']))
  # Indexed as OptimizedTransform writes it: the file's count is known.
  shard_index.write(shard_index.build(folder, files, 'GZIP'),
                    shard_index.artifact_index_path(folder))
  damaged = files[-1]
  in_file = input_pipeline.count_records([damaged], 'GZIP')
  _flip_a_byte(damaged)  # The size stays: the index check passes.
  position = shard_check.first_damaged([damaged], 'GZIP')['readable_records']
  task = tt.make_task(str(tmp_path / 'run'), data, train_steps=TRAIN_STEPS,
                      fault_tolerance={'skip_unreadable_records': True})
  caplog.set_level(logging.WARNING)
  result = training.run_managed_training(
      task, tf.distribute.OneDeviceStrategy('/cpu:0'))

  assert result.steps == TRAIN_STEPS
  [skip] = result.unreadable_records
  assert (skip['path'], skip['position'], skip['skipped']) == (
      damaged, position, in_file - position)
  assert skip['error']
  assert any(damaged in r.getMessage() and 'skip_unreadable_records' in
             r.getMessage() for r in caplog.records)
  trained = {i for record in tt.read_id_log(task.hparams['id_log'])
             for i in record['ids']}
  assert len(trained) <= NUM_EXAMPLES - (in_file - position)
  assert os.path.exists(unreadable.record_path(task.checkpoint_dir))

  # A restart reads the kept scan, not the data.
  def no_scan(*args):
    raise AssertionError('scanned again')
  monkeypatch.setattr(unreadable, 'scan', no_scan)
  again = training.run_managed_training(
      task, tf.distribute.OneDeviceStrategy('/cpu:0'))
  assert again.unreadable_records == result.unreadable_records
