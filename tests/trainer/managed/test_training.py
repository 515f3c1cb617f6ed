"""The managed training loop: training, eval, export, TensorBoard, results.

Fast tests train a tiny model in this process with OneDeviceStrategy.
mirrored and central_storage (two logical CPU devices, which must be
configured before TensorFlow starts) split every batch over their replicas in
tests/trainer/cluster/test_faults.py, which runs them in child processes.
"""

import json
import logging
import os
import time
import types

import numpy as np
import pytest
import tensorflow as tf

from components.trainer.checkpoint import location as location_lib
from components.trainer.checkpoint import records as records_lib
from components.trainer.checkpoint import store as store_lib
from components.trainer.managed import accumulation
from components.trainer.managed import call_size
from components.trainer.managed import driver
from components.trainer.managed import evaluation
from components.trainer.managed import export
from components.trainer.managed import preemption
from components.trainer.common import progress
from components.trainer.managed import step_runners
from components.trainer.managed import training
from components.trainer.process.context import ProcessContext
from components.testing import trainer_testing as tt

# Two windows of the input pipeline's shuffle (8 batches of 4), so the first
# 64 examples read are exactly one pass over the data.
NUM_EXAMPLES = tt.NUM_EXAMPLES  # in the `data` fixture
# Helpers of the loop tested directly.
# pylint: disable=protected-access
per_example_loss = accumulation.per_example_loss
rows = accumulation.rows
# pylint: enable=protected-access


def train_here(task):
  return training.run_managed_training(task,
                                   tf.distribute.OneDeviceStrategy('/cpu:0'))


def _summary_tags(directory):
  tags = set()
  for name in tf.io.gfile.listdir(directory):
    for record in tf.data.TFRecordDataset(os.path.join(directory, name)):
      event = tf.compat.v1.Event.FromString(record.numpy())
      tags.update(v.tag for v in event.summary.value)
  return tags


def test_one_device_trains_evaluates_exports_and_reports(tmp_path, data):
  # 16 steps x 4 examples: exactly one pass over the 64 examples.
  task = tt.make_task(str(tmp_path), data, train_steps=16,
                      per_replica_batch_size=4,
                      fault_tolerance={'save_every_steps': 5, 'keep_last': 2})
  result = train_here(task)

  assert result.steps == 16 and result.steps_this_attempt == 16
  assert result.preempted is False and result.exported is True
  assert result.examples_per_step == 4
  assert result.examples_per_sec > 0
  assert np.isfinite(result.train_loss)
  assert set(result.eval) == {'loss', 'binary_accuracy'}
  assert result.resume_events == []
  # The fixed cost by part, and 'auto''s measurements: none complete in
  # calls capped at 5 steps, so no length is reported as chosen, only the
  # steps run at each and the comparison it was in.
  assert set(result.timing) == {
      'setup_s', 'build_model_s', 'restore_s', 'train_s', 'eval_s',
      'export_s', 'first_call_s'}
  assert all(v >= 0 for v in result.timing.values())
  assert result.timing['first_call_s'] <= result.timing['train_s']
  assert result.steps_per_execution is None
  assert result.steps_per_execution_auto == []
  assert result.steps_by_call_length == {'1': 4, '4': 12}
  assert result.steps_per_execution_auto_pending['comparing'] == [4]
  # Checkpoints at 5, 10, 15 and the final 16; the last two are kept.
  assert result.checkpoints_saved == 4
  assert sorted(os.listdir(task.checkpoint_dir))[:2] == [
      store_lib.checkpoint_name(15), store_lib.checkpoint_name(16)]
  # The worker writes it as JSON.
  assert json.loads(json.dumps(result.to_dict())) == result.to_dict()

  # Every example exactly once, 4 per optimizer step.
  by_step = tt.ids_by_step(tt.read_id_log(task.hparams['id_log']))
  assert sorted(by_step) == [(s, 0) for s in range(16)]
  assert all(len(ids) == 4 for ids in by_step.values())
  assert sorted(i for ids in by_step.values() for i in ids) == list(
      range(NUM_EXAMPLES))

  assert 'loss' in _summary_tags(os.path.join(task.model_run_dir, 'train'))
  assert {'loss', 'binary_accuracy'} <= _summary_tags(
      os.path.join(task.model_run_dir, 'validation'))

  served = tf.saved_model.load(task.serving_model_dir)
  outputs = served.signatures['serving_default'](
      x=tf.zeros([3, 4]), id=tf.constant([1, 2, 3], tf.int64))
  assert list(outputs.values())[0].shape == (3, 1)
  # A Keras SavedModel, as `model.save` writes it: its root has the
  # variables (warm starts, fine-tuning), and Keras metadata.
  assert served.variables and served.trainable_variables
  assert hasattr(served, 'keras_api')
  assert tf.io.gfile.exists(
      os.path.join(task.serving_model_dir, 'keras_metadata.pb'))


def test_eval_in_one_call_matches_keras_evaluate(tmp_path):
  """All eval steps run in one call (a tf.range loop): the same loss and
  metrics as Keras' own evaluate over the same batches, and the metrics
  summed over exactly `eval_steps` batches, not the whole split."""
  rng = np.random.default_rng(0)
  x = rng.normal(size=(40, 3)).astype(np.float32)
  y = (x.sum(axis=1, keepdims=True) > 0).astype(np.float32)
  dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
  model = tf.keras.Sequential([tf.keras.layers.Dense(1, activation='sigmoid')])
  model.compile(loss='binary_crossentropy', metrics=['binary_accuracy'])
  model.build([None, 3])
  strategy = tf.distribute.OneDeviceStrategy('/cpu:0')
  ours = evaluation.evaluate(model, strategy, False, lambda _: dataset, 7,
                             str(tmp_path), step=3)
  keras = model.evaluate(dataset.take(7), return_dict=True, verbose=0)
  assert ours.keys() == keras.keys() == {'loss', 'binary_accuracy'}
  for name in ours:
    assert ours[name] == pytest.approx(keras[name], rel=1e-6), name
  whole = model.evaluate(dataset, return_dict=True, verbose=0)
  assert ours['loss'] != pytest.approx(whole['loss'], rel=1e-6)
  assert {'loss', 'binary_accuracy'} <= _summary_tags(
      os.path.join(str(tmp_path), 'validation'))


def _write_transform_graph(path: str) -> None:
  """A real (tiny) TF Transform output: z-scored `x`, the label kept."""
  # pylint: disable=g-import-not-at-top
  import apache_beam as beam
  import tensorflow_transform as tft
  import tensorflow_transform.beam as tft_beam
  from tensorflow_transform.tf_metadata import dataset_metadata
  from tensorflow_transform.tf_metadata import metadata_io
  from tensorflow_transform.tf_metadata import schema_utils
  # pylint: enable=g-import-not-at-top
  spec = {'x': tf.io.FixedLenFeature([], tf.float32),
          'label': tf.io.FixedLenFeature([], tf.int64)}

  def preprocessing_fn(inputs):
    return {'x_xf': tft.scale_to_z_score(inputs['x']),
            'label': inputs['label']}

  metadata = dataset_metadata.DatasetMetadata(
      schema_utils.schema_from_feature_spec(spec))
  with beam.Pipeline() as pipeline, tft_beam.Context(
      temp_dir=os.path.join(path, 'tmp')):
    rows = pipeline | beam.Create(
        [{'x': float(i), 'label': i % 2} for i in range(8)])
    _ = ((rows, metadata) | tft_beam.AnalyzeDataset(preprocessing_fn)
         | tft_beam.WriteTransformFn(path))
  # The raw schema, as TFX's Transform writes it beside the graph.
  metadata_io.write_metadata(metadata, os.path.join(
      path, tft.TFTransformOutput.RAW_METADATA_DIR))


class _SignFlip(tf.keras.layers.Layer):
  """A Python `if` on a tensor: traced only through autograph, which Keras'
  saving turns off for layer calls, so the call is a tf.function (with a
  plain `call`, `model.save` and `tf.saved_model.save` fail alike)."""

  @tf.function
  def call(self, x):
    if tf.reduce_sum(x) > 0:
      return x
    return -x


def test_serving_signatures_apply_the_transform_and_keep_the_models_autograph(
    tmp_path):
  """The transform graph is applied without autograph (converting TF
  Transform's Python was most of the export), the model's call with it, as
  under stock TFX: a model with control flow on tensors exports and serves,
  both signatures apply the same transform, and the Keras model loaded from
  the export predicts what `serving_default` serves."""
  import tensorflow_transform as tft  # pylint: disable=g-import-not-at-top
  transform_dir = str(tmp_path / 'transform')
  _write_transform_graph(transform_dir)
  inputs = tf.keras.Input(shape=(), name='x_xf')
  model = tf.keras.Model({'x_xf': inputs}, _SignFlip()(inputs))
  export.export_saved_model(model, tft.TFTransformOutput(transform_dir),
                            'label', str(tmp_path / 'serving'))

  served = tf.saved_model.load(str(tmp_path / 'serving'))
  examples = tf.constant([tf.train.Example(features=tf.train.Features(
      feature={'x': tf.train.Feature(float_list=tf.train.FloatList(
          value=[x])),
               'label': tf.train.Feature(int64_list=tf.train.Int64List(
                   value=[1]))})).SerializeToString() for x in (0.0, 7.0)])
  outputs = served.signatures['serving_default'](examples=examples)
  transformed = served.signatures['transform_features'](examples=examples)
  z_scores = transformed['x_xf'].numpy()
  assert z_scores == pytest.approx([-3.5 / np.std(range(8)),
                                    3.5 / np.std(range(8))], rel=1e-5)
  # The batch sums to 0: the `if` took its tensor branch, -x.
  assert outputs['outputs'].numpy() == pytest.approx(-z_scores, rel=1e-6)
  # Keras loads it (the custom layer revived from its traces) and predicts
  # what `serving_default` answers for the same raw examples.
  keras_model = tf.keras.models.load_model(str(tmp_path / 'serving'))
  predicted = keras_model({'x_xf': transformed['x_xf']})
  assert predicted.numpy() == pytest.approx(outputs['outputs'].numpy(),
                                            rel=1e-6)


def test_delete_after_export_removes_the_checkpoints(tmp_path, data):
  task = tt.make_task(str(tmp_path), data, train_steps=3,
                      fault_tolerance={'save_every_steps': 1,
                                       'delete_after_export': True})
  result = train_here(task)
  assert result.checkpoints_saved == 3
  assert os.path.isdir(task.serving_model_dir)
  assert not os.path.exists(task.checkpoint_dir)


def test_rerun_resumes_with_the_exact_data_order(tmp_path, data):
  """A run stopped at step 6 and continued matches an uninterrupted one."""
  whole = tt.make_task(str(tmp_path / 'whole'), data, train_steps=12)
  train_here(whole)
  split = tt.make_task(str(tmp_path / 'split'), data, train_steps=6)
  train_here(split)
  split.train_steps = 12
  result = train_here(split)

  assert result.start_step == 6 and result.steps_this_attempt == 6
  event = result.resume_events[-1]
  assert event['event'] == 'resumed' and event['from_step'] == 6
  assert store_lib.step_of(event['checkpoint']) == 6
  assert event['steps_lost'] == 0
  assert tt.ids_by_step(tt.read_id_log(split.hparams['id_log'])) == (
      tt.ids_by_step(tt.read_id_log(whole.hparams['id_log'])))
  expected = tt.latest_checkpoint_tensors(whole.checkpoint_dir)
  actual = tt.latest_checkpoint_tensors(split.checkpoint_dir)
  assert sorted(actual) == sorted(expected)
  for name, value in expected.items():
    np.testing.assert_array_equal(actual[name], value, err_msg=name)


def test_changed_fingerprint_starts_fresh_and_says_so(tmp_path, data):
  root = str(tmp_path / 'backups')
  old_dir = location_lib.stable_checkpoint_dir(
      root, 'taxi', 'HighPerfTrainer',
      location_lib.training_fingerprint({'examples': 'a'}, {'steps': 2}))
  new_fingerprint = location_lib.training_fingerprint({'examples': 'b'},
                                                       {'steps': 2})
  new_dir = location_lib.stable_checkpoint_dir(root, 'taxi',
                                                'HighPerfTrainer',
                                                new_fingerprint)
  train_here(tt.make_task(str(tmp_path / 'old'), data, train_steps=2,
                          checkpoint_dir=old_dir))
  result = train_here(tt.make_task(str(tmp_path / 'new'), data, train_steps=2,
                                   checkpoint_dir=new_dir))
  assert result.start_step == 0
  [event] = result.resume_events
  assert event['event'] == 'fresh_start'
  assert os.path.basename(old_dir) in event['reason']
  assert new_dir.endswith(new_fingerprint)


def test_time_based_checkpoints(tmp_path, data):
  # Steps take at least 0.1 s, so saves 0.35 s apart are >= 4 steps apart.
  task = tt.make_task(str(tmp_path), data, train_steps=12,
                      fault_tolerance={'save_every_steps': None,
                                       'save_every_s': 0.35,
                                       'keep_last': 20},
                      hparams={'step_sleep_seconds': 0.1})
  result = train_here(task)
  steps = sorted(step for step in map(
      store_lib.step_of, os.listdir(task.checkpoint_dir)) if step is not None)
  assert result.checkpoints_saved == len(steps) >= 2
  assert steps[-1] == 12
  assert all(later - earlier >= 4 for earlier, later in zip(steps[:-2],
                                                            steps[1:-1]))


def test_module_without_build_model_is_rejected(tmp_path, data):
  task = tt.make_task(str(tmp_path), data)
  task.module_path = 'components.testing.trainer_testing'
  with pytest.raises(ValueError, match='needs `build_model`'):
    train_here(task)


def test_multi_output_loss_is_rejected():
  inputs = tf.keras.layers.Input(shape=(2,))
  model = tf.keras.Model(inputs, [tf.keras.layers.Dense(1)(inputs),
                                  tf.keras.layers.Dense(1)(inputs)])
  model.compile(loss=['mse', 'mse'])
  with pytest.raises(ValueError, match='one loss'):
    per_example_loss(model)


@pytest.mark.parametrize('loss', [
    'binary_crossentropy', tf.keras.losses.BinaryCrossentropy(),
    tf.keras.losses.binary_crossentropy])
def test_per_example_loss_matches_keras_mean(loss):
  inputs = tf.keras.layers.Input(shape=(2,))
  model = tf.keras.Model(inputs, tf.keras.layers.Dense(
      1, activation='sigmoid')(inputs))
  model.compile(loss=loss)
  labels = tf.constant([0.0, 1.0, 1.0])
  predictions = tf.constant([[0.2], [0.7], [0.4]])
  per_example = per_example_loss(model)(labels, predictions)
  assert per_example.shape == (3,)
  expected = tf.keras.losses.BinaryCrossentropy()(labels, predictions)
  np.testing.assert_allclose(tf.reduce_mean(per_example), expected, rtol=1e-6)


def test_rows_slices_dense_ragged_and_sparse():
  dense = tf.reshape(tf.range(12), [6, 2])
  np.testing.assert_array_equal(rows(dense, 2, 2), [[4, 5], [6, 7]])
  ragged = tf.ragged.constant([[1], [2, 3], [], [4, 5, 6]])
  assert rows(ragged, 1, 2).to_list() == [[2, 3], []]
  sparse_rows = rows(ragged.to_sparse(), 2, 2)
  assert tf.RaggedTensor.from_sparse(sparse_rows).to_list() == [[], [4, 5, 6]]


def test_step_rate_is_steady_and_falls_back_to_the_whole_attempt():
  steady = driver.StepStats(start_step=0)
  steady.steps_done(50)  # One parameter-server join: tracing included.
  only_join = steady.summary(50, 0.1, preempted=False)
  assert only_join['steps_per_sec'] > 0
  assert only_join['rate_includes_first_step'] is True
  steady.steps_done(50)
  two_joins = steady.summary(100, 0.1, preempted=False)
  assert two_joins['steps_per_sec'] > 0
  assert two_joins['rate_includes_first_step'] is False
  assert driver.StepStats(0).summary(0, 0.0, False)['steps_per_sec'] == 0.0


class _SlowSaves:
  """What `drive` asks of a checkpointer: a save every `every` steps that
  takes `save_s` seconds."""

  def __init__(self, every, save_s):
    self.config = types.SimpleNamespace(save_every_s=0)
    self.progress = types.SimpleNamespace(pausing=lambda step, why: None)
    self.every, self.save_s, self.last_save_time = every, save_s, 0.0

  def next_save_step(self, step):
    return (step // self.every + 1) * self.every

  def due_by_time(self):
    return False

  def save(self, step):
    del step
    time.sleep(self.save_s)


def test_auto_times_a_call_without_the_checkpoint_saved_after_it():
  # Saves every 100 steps, 50 ms each: calls of 100 steps all end in one,
  # calls of 64 never do (the 36 after them do). Timed with its save, 100
  # looked 3x slower per step than 64 and the default job ran two calls
  # per checkpoint interval; without, 100's 10 ms call overhead spread over
  # more steps wins.
  class Runner:
    traced_function = staticmethod(
        step_runners.SynchronousSteps.traced_function)

    def __call__(self, current, k):
      time.sleep(10e-3 + k * 1e-4)
      return current + k, 0.0

  sizer = call_size.CallSizer('auto', max_call=100)
  driver.drive(Runner(), _SlowSaves(100, 0.05),
               preemption.SigtermWatcher(lambda: None), start=0,
               train_steps=1_000, sizer=sizer,
               record_progress=lambda *args: None)
  [choice] = sizer.choices
  assert sorted(choice.seconds_per_call) == [4, 64, 100]
  assert choice.seconds_per_call[100] < 0.05
  assert sizer.chosen == 100


def test_progress_is_written_at_most_once_a_second(tmp_path, data,
                                                  monkeypatch, caplog):
  """Steps of about a millisecond, one per call: progress.json and the
  TensorBoard event file are written at most once a second plus the final
  write, and a progress line comes every few seconds (and at the end)."""
  train_steps = 400
  task = tt.make_task(str(tmp_path), data, train_steps=train_steps,
                      fault_tolerance={'save_every_steps': None},
                      hparams={'id_log': None})
  task.distribution['steps_per_execution'] = 1
  context = ProcessContext.of_strategy(
      task, tf.distribute.OneDeviceStrategy('/cpu:0'))
  clock = training.Stopwatch()
  built = training.build(context, clock)
  writes, flushes = [], []
  store, writer = built.checkpointer.records, built.progress_writer.writer
  write_progress, flush = store.write_progress, writer.flush
  monkeypatch.setattr(store, 'write_progress', lambda *args: (
      writes.append(args[0]), write_progress(*args)))
  monkeypatch.setattr(writer, 'flush', lambda: (flushes.append(1), flush()))
  caplog.set_level(logging.INFO, logger='tfx_hpm')
  began = time.monotonic()
  trained = training.train(context, built, training.restore(context, built),
                           clock)
  built.checkpointer.close()
  elapsed = time.monotonic() - began

  assert trained.summary['steps'] == train_steps
  once_a_second = int(elapsed / 1.0) + 2  # The first write and the last.
  assert 1 <= len(writes) <= once_a_second, (len(writes), elapsed)
  assert writes[-1] == train_steps
  assert 1 <= len(flushes) <= once_a_second, (len(flushes), elapsed)
  assert 'loss' in _summary_tags(os.path.join(task.model_run_dir, 'train'))
  lines = [r.getMessage() for r in caplog.records
           if r.name == progress.LOGGER.name]
  assert 2 <= len(lines) <= int(elapsed / progress.LINE_EVERY_SECONDS) + 2
  # After the first call, which traces: no steady rate yet for an ETA.
  assert lines[0].startswith('Training step 1/') and ', ETA ?, ' in lines[0]
  # What the launcher relays: the chief's last record, in the same words.
  record = records_lib.read_progress(task.checkpoint_dir)
  assert record['step'] == record['train_steps'] == train_steps
  assert record['examples_per_sec'] > 0 and record['loss'] > 0
  assert record['checkpoints'] == 1
  assert progress.format_line(record) == lines[-1]
  assert lines[-1].startswith(
      f'Training step {train_steps}/{train_steps} (100%), loss ')
  assert ', ETA 0 s, ' in lines[-1]


def test_steps_per_call_change_nothing_but_the_calls(tmp_path, data):
  """k steps per traced call: the same updates on the same batches, and
  checkpoints exactly where one step per call puts them."""
  results, weights, ids = {}, {}, {}
  for setting in (1, 5, 'auto'):
    task = tt.make_task(str(tmp_path / str(setting)), data, train_steps=13,
                        fault_tolerance={'save_every_steps': 4,
                                         'keep_last': 10})
    task.distribution['steps_per_execution'] = setting
    results[setting] = train_here(task)
    weights[setting] = tt.latest_checkpoint_tensors(task.checkpoint_dir)
    # Beside them: the progress marker and the data's shard index.
    split = os.path.basename(os.path.dirname(data['pattern']))
    assert sorted(os.listdir(task.checkpoint_dir)) == [
        store_lib.checkpoint_name(s) for s in (4, 8, 12, 13)] + [
            'progress.json', f'shard_index-{split}.json']
    ids[setting] = tt.ids_by_step(
        tt.read_id_log(task.hparams['id_log']))
  assert results[5].steps_per_execution == 5
  assert results[5].steps_by_call_length == {'1': 1, '4': 12}
  # 13 steps end before 'auto' has measured enough 4-step calls to choose.
  assert results['auto'].steps_per_execution is None
  assert results['auto'].steps_by_call_length == {'4': 12, '1': 1}
  for setting in (5, 'auto'):
    assert ids[setting] == ids[1]
    for name, value in weights[1].items():
      np.testing.assert_array_equal(weights[setting][name], value,
                                    err_msg=name)
