"""Filesystem-agnostic components: artifact I/O on ram://, drop-in executors.

TensorFlow's `ram://` filesystem stands in for an object store here: it is not
the local disk, so any `open`/`os.path` on an artifact path fails. It lives in
one process, so these tests train in the executor's process
(`launcher='in_process'`), and OptimizedTransform's stock Beam part, which
cannot reach it, runs on the local disk; the slow gs:// tests cover the
child-process launchers and the whole Transform against a real GCS API.
"""

import glob
import json
import os
import threading
import time
import uuid
from typing import Dict

import apache_beam as beam
from google.protobuf import json_format
import pytest
import tensorflow as tf
import tensorflow_transform as tft
import tensorflow_transform.beam as tft_beam
from tensorflow_transform.tf_metadata import dataset_metadata
from tensorflow_transform.tf_metadata import metadata_io
from tensorflow_transform.tf_metadata import schema_utils
from tfx import v1 as tfx
from tfx.components.transform import executor_utils
from tfx.types import standard_artifacts
from tfx.types import standard_component_specs
from tfx.utils import import_utils

from components import HighPerfTrainer
from components import OptimizedTransform
from components.partitioner import executor as partitioner_executor
from components.partitioner import spec_keys as partitioner_keys
from components.records import partition_plan
from components.records import training_result
from components.records import tuned_input_pipeline
from components import storage
from components.trainer.checkpoint import store as store_lib
from components.trainer.cluster import tf_cluster
from components.trainer import executor as trainer_executor
from components.trainer.launchers import backends
from components.trainer import model_run as trainer_model_run
from components.trainer import spec_keys as trainer_keys
from components.trainer.config import DistributionConfig
from components.transform import artifact as transform_artifact
from components.transform.config import TuningConfig
from components.transform import executor as transform_executor
from components.transform import spec_keys as transform_keys
from components.transform import tuner
from components.transform import tuning_inputs
from components.transform import tuning_step
from components import types as hpm_types
from components.testing import id_recording_module
from components.testing import trainer_testing as tt

ID_MODULE_FILE = os.path.join(tt.REPO_ROOT, 'components/testing',
                              'id_recording_module.py')


def _ram(name: str) -> str:
  return f'ram://{name}-{uuid.uuid4().hex}'


# ------------------------------------------------------------ storage helpers


def test_json_round_trip_and_atomic_write_on_ram():
  path = os.path.join(_ram('json'), 'a', 'value.json')
  assert storage.read_json(path) is None
  storage.write_json(path, {'step': 3}, atomic=True)
  assert storage.read_json(path) == {'step': 3}
  storage.write_json(path, {'step': 4}, atomic=True)
  assert storage.read_json(path) == {'step': 4}
  # No temporary object is left beside the target.
  assert tf.io.gfile.listdir(os.path.dirname(path)) == ['value.json']


def test_local_atomic_write_leaves_no_temporary_file(tmp_path):
  path = str(tmp_path / 'progress.json')
  storage.write_json(path, [1, 2], atomic=True)
  assert storage.read_json(path) == [1, 2]
  assert os.listdir(tmp_path) == ['progress.json']


def test_upload_tree_copies_nested_files(tmp_path):
  (tmp_path / 'attempt-0').mkdir()
  (tmp_path / 'attempt-0' / 'worker-0.log').write_text('step 1\n')
  (tmp_path / 'top.txt').write_text('x')
  destination = _ram('logs')
  storage.upload_tree(str(tmp_path), destination)
  assert storage.read_text(os.path.join(destination, 'top.txt')) == 'x'
  assert storage.read_text(
      os.path.join(destination, 'attempt-0', 'worker-0.log')) == 'step 1\n'


def test_is_local():
  assert storage.is_local('/tmp/x') and storage.is_local('file:///tmp/x')
  assert not storage.is_local('gs://bucket/x')
  assert not storage.is_local('ram://x')


def test_newest_first_breaks_same_second_ties_by_execution_id(tmp_path):
  # tf.io.gfile gives local mtimes in whole seconds: same mtime, any order.
  paths = []
  for execution in ('9', '10', '2'):
    run = tmp_path / 'Trainer' / 'model_run' / execution
    run.mkdir(parents=True)
    (run / 'result.json').write_text('{}')
    os.utime(run / 'result.json', (1_700_000_000, 1_700_000_000))
    paths.append(str(run / 'result.json'))
  expected = [paths[1], paths[0], paths[2]]
  assert storage.newest_first(paths) == expected
  assert storage.newest_first(list(reversed(paths))) == expected


def test_unwritable_path_fails_naming_path_and_error(tmp_path):
  blocker = tmp_path / 'a_file'
  blocker.write_text('not a folder')
  target = str(blocker / 'root')
  with pytest.raises(storage.StorageNotWritableError) as e:
    storage.check_writable(target, 'checkpoint directory')
  assert target in str(e.value) and 'checkpoint directory' in str(e.value)
  assert blocker.read_text() == 'not a folder'  # Nothing lost.


def test_checkpoints_publish_and_restore_on_ram():
  directory = _ram('checkpoints')
  variable = tf.Variable([1.0, 2.0])
  store = store_lib.CheckpointStore(
      directory, tf.train.Checkpoint(v=variable), keep_last=2)
  for step in (1, 2, 3):
    variable.assign([float(step), float(step)])
    store.save(step)
  assert [store_lib.step_of(p) for p in store.checkpoint_dirs()] == [3, 2]
  # A checkpoint whose manifest was never written is skipped on restore.
  partial = os.path.join(directory, store_lib.checkpoint_name(4))
  tf.io.gfile.makedirs(partial)
  with tf.io.gfile.GFile(os.path.join(partial, 'ckpt.index'), 'wb') as f:
    f.write(b'partial')
  variable.assign([0.0, 0.0])
  restored = store.restore_latest()
  assert restored.step == 3
  assert variable.numpy().tolist() == [3.0, 3.0]


@pytest.mark.parametrize('error', [
    tf.errors.UnavailableError(None, None, 'unavailable'),
    tf.errors.DeadlineExceededError(None, None, 'deadline'),
    ConnectionResetError('reset'),
], ids=lambda e: type(e).__name__)
def test_retrying_retries_transient_errors_then_gives_up(error):
  calls, retried = [], []

  def flaky():
    calls.append(1)
    if len(calls) < 3:
      raise error
    return 'done'

  policy = storage.RetryPolicy(attempts=3, first_delay_s=0.0)
  assert storage.retrying(flaky, 'op', policy,
                          lambda what, e: retried.append((what, e))) == 'done'
  assert retried == [('op', error), ('op', error)]
  calls.clear()
  with pytest.raises(type(error)):
    storage.retrying(flaky, 'op', storage.RetryPolicy(attempts=2,
                                                      first_delay_s=0.0))
  assert len(calls) == 2


def test_retrying_does_not_retry_what_is_not_transient():
  calls = []

  def missing():
    calls.append(1)
    raise tf.errors.NotFoundError(None, None, 'no such object')

  with pytest.raises(tf.errors.NotFoundError):
    storage.retrying(missing, 'op', storage.RetryPolicy(first_delay_s=0.0))
  assert calls == [1]


# ------------------------------------------------------------ executors


def _examples_and_schema(root: str):
  """An Examples artifact (train and eval splits) and a Schema artifact."""
  examples = standard_artifacts.Examples()
  examples.uri = os.path.join(root, 'examples')
  examples.split_names = json.dumps(['train', 'eval'])
  for split in ('train', 'eval'):
    tt.write_id_dataset(os.path.join(examples.uri, f'Split-{split}'), 32)
  schema = standard_artifacts.Schema()
  schema.uri = os.path.join(root, 'schema')
  os.makedirs(schema.uri)
  os.replace(os.path.join(examples.uri, 'Split-train', 'schema.pbtxt'),
             os.path.join(schema.uri, 'schema.pbtxt'))
  os.remove(os.path.join(examples.uri, 'Split-eval', 'schema.pbtxt'))
  return examples, schema


def _runtime_properties(component) -> dict:
  """Exec properties as an orchestrator passes them: protos as JSON."""
  return {
      key: (json_format.MessageToJson(value, preserving_proto_field_name=True)
            if hasattr(value, 'DESCRIPTOR') else value)
      for key, value in component.exec_properties.items()
      if value is not None
  }


def _trainer_outputs(model_uri: str, model_run_uri: str):
  model = standard_artifacts.Model()
  model.uri = model_uri
  model_run = standard_artifacts.ModelRun()
  model_run.uri = model_run_uri
  return {standard_component_specs.MODEL_KEY: [model],
          standard_component_specs.MODEL_RUN_KEY: [model_run]}


def _input_dict(examples, schema):
  """A Trainer's or Transform's input dict with these artifacts."""
  return {standard_component_specs.EXAMPLES_KEY: [examples],
          standard_component_specs.SCHEMA_KEY: [schema]}


def _stock_trainer_properties(**overrides):
  """What the stock Trainer passes its executor, plus `overrides`."""
  channel = tfx.dsl.Channel
  stock = tfx.components.Trainer(
      examples=channel(type=standard_artifacts.Examples),
      schema=channel(type=standard_artifacts.Schema),
      module_file=ID_MODULE_FILE,
      train_args=tfx.proto.TrainArgs(num_steps=4),
      eval_args=tfx.proto.EvalArgs(num_steps=1))
  return {**_runtime_properties(stock), **overrides}


def test_trainer_executor_runs_with_every_output_on_ram(tmp_path, monkeypatch):
  # As in a task compiled by kubeflow.runner: no pipeline or node in the
  # executor's context, both in the container's env.
  monkeypatch.setenv(trainer_executor.PIPELINE_NAME_ENV, 'ram-pipeline')
  monkeypatch.setenv(trainer_executor.NODE_ID_ENV, 'RamTrainer')
  examples, schema = _examples_and_schema(str(tmp_path))
  model_uri, model_run_uri = _ram('model'), _ram('model_run')
  backup_root = _ram('backups')
  outputs = _trainer_outputs(model_uri, model_run_uri)
  properties = _stock_trainer_properties(**{
      trainer_keys.DISTRIBUTION_KEY: json.dumps({
          'launcher': 'in_process', 'per_replica_batch_size': 4}),
      trainer_keys.FAULT_TOLERANCE_KEY: json.dumps({
          'backup_root': backup_root, 'save_every_steps': 2,
          'delete_after_export': False}),
  })
  validations = []
  validate = DistributionConfig.validate
  monkeypatch.setattr(DistributionConfig, 'validate', lambda config: (
      validations.append(config.strategy), validate(config))[1])
  trainer_executor.Executor().Do(
      _input_dict(examples, schema), outputs, properties)
  # The executor and the training in its process share one validation.
  assert validations == ['auto']

  serving = os.path.join(model_uri, 'Format-Serving')
  loaded = tf.saved_model.load(serving)
  assert 'serving_default' in loaded.signatures
  result = training_result.read(model_run_uri)
  assert result.steps == 4 and result.loop.exported is True
  decision = storage.read_json(os.path.join(
      model_run_uri, trainer_model_run.DECISION_FILE))
  assert decision['strategy'] == 'one_device'
  assert tf.io.gfile.exists(os.path.join(model_run_uri,
                                         tf_cluster.TASK_FILE_NAME))
  assert tf.io.gfile.glob(os.path.join(model_run_uri, 'train', '*'))
  # Published checkpoints, with manifests, on the ram:// backup root.
  [checkpoint_dir] = tf.io.gfile.glob(
      os.path.join(backup_root, 'ram-pipeline', 'RamTrainer', '*'))
  store = store_lib.CheckpointStore(checkpoint_dir,
                                        tf.train.Checkpoint())
  newest = store.checkpoint_dirs()[0]
  assert store_lib.step_of(newest) == 4
  assert store.verify(newest)['step'] == 4
  model_run = outputs[standard_component_specs.MODEL_RUN_KEY][0]
  assert model_run.get_int_custom_property('train_steps') == 4


def test_trainer_executor_runs_with_only_the_stock_exec_properties(tmp_path):
  """The drop-in: no distribution or fault_tolerance property at all."""
  examples, schema = _examples_and_schema(str(tmp_path))
  outputs = _trainer_outputs(str(tmp_path / 'Trainer' / 'model' / '1'),
                             str(tmp_path / 'Trainer' / 'model_run' / '1'))
  properties = _stock_trainer_properties()
  assert trainer_keys.DISTRIBUTION_KEY not in properties
  trainer_executor.Executor().Do(
      _input_dict(examples, schema), outputs, properties)
  model_run = outputs[standard_component_specs.MODEL_RUN_KEY][0]
  assert model_run.get_string_custom_property('launcher') == 'local'
  assert 'shared storage' in model_run.get_string_custom_property(
      'launcher_reason')
  assert model_run.get_int_custom_property('train_steps') == 4
  logs = os.path.join(model_run.uri, backends.CLUSTER_LOG_DIR,
                      'attempt-0')
  assert os.listdir(logs) == ['trainer.log']
  assert tf.saved_model.load(os.path.join(
      outputs[standard_component_specs.MODEL_KEY][0].uri, 'Format-Serving'))


def test_trainer_fails_before_training_when_outputs_are_unwritable(tmp_path):
  examples, schema = _examples_and_schema(str(tmp_path))
  blocker = tmp_path / 'not_a_folder'
  blocker.write_text('')
  outputs = _trainer_outputs(str(blocker / 'model'),
                             str(blocker / 'model_run'))
  with pytest.raises(storage.StorageNotWritableError,
                     match='model_run output at .*not_a_folder/model_run'):
    trainer_executor.Executor().Do(
        _input_dict(examples, schema), outputs,
        _stock_trainer_properties())


def test_partitioner_executor_writes_its_plan_to_ram(tmp_path):
  module = tmp_path / 'deep_module.py'
  module.write_text(
      'import tensorflow as tf\n'
      'def build_model(hparams):\n'
      '  inputs = tf.keras.Input(shape=(6,), name="x")\n'
      '  x = inputs\n'
      '  for _ in range(4):\n'
      '    x = tf.keras.layers.Dense(8, activation="relu")(x)\n'
      '  model = tf.keras.Model(inputs, tf.keras.layers.Dense(1)(x))\n'
      '  model.compile(optimizer="sgd", loss="mse")\n'
      '  return model\n')
  artifact = hpm_types.PartitionPlan()
  artifact.uri = _ram('plan')
  partitioner_executor.Executor().Do(
      {}, {partitioner_keys.PARTITION_PLAN_KEY: [artifact]},
      {standard_component_specs.MODULE_FILE_KEY: str(module),
       partitioner_keys.CONFIG_KEY: json.dumps(
           {'batch_size': 16, 'num_stages': 2, 'profile_repeats': 1})})
  plan = partition_plan.read_dict(artifact.uri)
  assert plan['num_stages'] == 2
  assert tf.io.gfile.exists(os.path.join(artifact.uri, 'report.md'))


def test_drop_ins_keep_the_stock_node_ids():
  channel = tfx.dsl.Channel
  trainer = HighPerfTrainer(
      examples=channel(type=standard_artifacts.Examples),
      module_file=ID_MODULE_FILE,
      train_args=tfx.proto.TrainArgs(num_steps=1))
  transform = OptimizedTransform(
      examples=channel(type=standard_artifacts.Examples),
      schema=channel(type=standard_artifacts.Schema),
      module_file=ID_MODULE_FILE)
  assert trainer.id == 'Trainer' and transform.id == 'Transform'
  assert trainer.with_id('MyTrainer').id == 'MyTrainer'
  assert transform.with_id('MyTransform').id == 'MyTransform'


def test_local_launcher_rejects_outputs_other_processes_cannot_see(tmp_path):
  """Asked for explicitly, child processes stay an error on ram://."""
  examples, schema = _examples_and_schema(str(tmp_path))
  outputs = _trainer_outputs(_ram('model'), str(tmp_path / 'model_run'))
  with pytest.raises(ValueError, match=r"launcher='local'.*ram://"):
    trainer_executor.Executor().Do(
        _input_dict(examples, schema), outputs,
        _stock_trainer_properties(**{
            trainer_keys.DISTRIBUTION_KEY: json.dumps(
                {'launcher': 'local'})}))
  assert outputs[standard_component_specs.MODEL_RUN_KEY][
      0].get_string_custom_property(
      'launcher_reason') == 'requested'


def test_stock_properties_on_ram_train_in_the_executors_process(tmp_path):
  """As the stock Trainer: no launcher given, outputs on ram:// just work;
  the launcher decision and its reason are recorded on model_run."""
  examples, schema = _examples_and_schema(str(tmp_path))
  model_uri = _ram('model')
  outputs = _trainer_outputs(model_uri, str(tmp_path / 'model_run'))
  properties = _stock_trainer_properties()
  assert trainer_keys.DISTRIBUTION_KEY not in properties
  trainer_executor.Executor().Do(
      _input_dict(examples, schema), outputs, properties)
  model_run = outputs[standard_component_specs.MODEL_RUN_KEY][0]
  assert model_run.get_string_custom_property('launcher') == 'in_process'
  reason = model_run.get_string_custom_property('launcher_reason')
  assert "['model']" in reason and model_uri in reason
  assert "executor's process" in reason
  assert model_run.get_int_custom_property('train_steps') == 4
  # No cluster was started, so no cluster logs.
  assert not os.path.exists(os.path.join(
      model_run.uri, backends.CLUSTER_LOG_DIR))
  decision = storage.read_json(os.path.join(
      model_run.uri, trainer_model_run.DECISION_FILE))
  assert decision['launcher'] == 'in_process'
  assert decision['launcher_reason'] == reason
  assert tf.saved_model.load(os.path.join(model_uri, 'Format-Serving'))


# ---------------------------------------------------- OptimizedTransform

_PREPROCESSING_MODULE = '''
import tensorflow_transform as tft


def preprocessing_fn(inputs):
  return {'id': inputs['id'], 'x': tft.scale_to_z_score(inputs['x']),
          'label': inputs['label']}
'''


@pytest.fixture(name='preprocessing_module')
def fixture_preprocessing_module(tmp_path):
  path = tmp_path / 'preprocessing_module.py'
  path.write_text(_PREPROCESSING_MODULE)
  return str(path)


def _transform_properties(component_class, module_file, **kwargs):
  channel = tfx.dsl.Channel
  return _runtime_properties(component_class(
      examples=channel(type=standard_artifacts.Examples),
      schema=channel(type=standard_artifacts.Schema),
      module_file=module_file, **kwargs))


def _transform_outputs(root: str, execution: int = 1):
  """An artifact per OptimizedTransform output, `<root>/Transform/<key>/<n>`."""
  channel = tfx.dsl.Channel
  component = OptimizedTransform(
      examples=channel(type=standard_artifacts.Examples),
      schema=channel(type=standard_artifacts.Schema), module_file='unused')
  outputs = {}
  for key, output in component.outputs.items():
    artifact = output.type()
    artifact.uri = os.path.join(root, component.id, key, str(execution))
    outputs[key] = [artifact]
  return outputs


def _write_transform_graph(module_file: str, examples, out_dir: str) -> None:
  """The module's transform graph, analyzed on the train split, with the raw
  metadata, as the stock Transform writes it."""
  preprocessing_fn = import_utils.import_func_from_source(module_file,
                                                          'preprocessing_fn')
  spec = id_recording_module.FEATURE_SPEC
  rows = list(tf.data.TFRecordDataset(
      tf.io.gfile.glob(os.path.join(examples.uri, 'Split-train', '*')),
      'GZIP').map(lambda r: tf.io.parse_single_example(r, spec))
              .as_numpy_iterator())
  metadata = dataset_metadata.DatasetMetadata(
      schema_utils.schema_from_feature_spec(spec))
  with beam.Pipeline(argv=['--direct_running_mode=in_memory',
                           '--direct_num_workers=1']) as pipeline:
    with tft_beam.Context(temp_dir=os.path.join(out_dir, 'tmp'),
                          force_tf_compat_v1=False):
      transform_fn = ((pipeline | beam.Create(rows), metadata)
                      | tft_beam.AnalyzeDataset(preprocessing_fn))
      _ = transform_fn | tft_beam.WriteTransformFn(out_dir)
  tf.io.gfile.rmtree(os.path.join(out_dir, 'tmp'))
  metadata_io.write_metadata(metadata, os.path.join(
      out_dir, tft.TFTransformOutput.RAW_METADATA_DIR))


def _write_transformed_examples(graph_uri: str, examples, transformed,
                                num_files: int = 2) -> Dict[str, int]:
  """Writes what the stock Transform materializes; returns its counters."""
  output = tft.TFTransformOutput(graph_uri)
  layer = output.transform_features_layer()
  counts = {}
  for split, path in zip(('train', 'eval'), executor_utils.GetSplitPaths(
      [transformed])):
    records = tf.data.TFRecordDataset(tf.io.gfile.glob(os.path.join(
        examples.uri, f'Split-{split}', '*')), 'GZIP')
    raw = next(iter(records.batch(10_000).map(
        lambda r: tf.io.parse_example(r, output.raw_feature_spec()))))
    rows = {k: v.numpy() for k, v in layer(raw).items()}
    count = len(rows['id'])
    options = tf.io.TFRecordOptions(compression_type='GZIP')
    for k in range(num_files):
      with tf.io.TFRecordWriter(
          f'{path}-{k:05d}-of-{num_files:05d}.gz', options) as writer:
        for i in range(count * k // num_files, count * (k + 1) // num_files):
          writer.write(tf.train.Example(features=tf.train.Features(feature={
              'id': tf.train.Feature(
                  int64_list=tf.train.Int64List(value=[rows['id'][i]])),
              'x': tf.train.Feature(
                  float_list=tf.train.FloatList(value=rows['x'][i])),
              'label': tf.train.Feature(
                  float_list=tf.train.FloatList(value=[rows['label'][i]])),
          })).SerializeToString())
    counts[path] = count
  return counts


def test_transform_tuning_runs_with_every_input_and_output_on_ram(
    tmp_path, preprocessing_module):
  """What OptimizedTransform adds after the stock Transform, on ram://.

  The stock part stays on the local disk: it runs in Beam, whose filesystems
  (local, gs://, s3://, hdfs://) do not know TensorFlow's process-local
  ram://, so the stock Transform cannot write there at all (the slow gs://
  tests run it whole on an object store). What it leaves is made here as it
  writes it (the analyzed transform graph with its metadata, sharded
  transformed examples, the sharded write's example counters), on ram://
  with the raw examples. Our part then runs twice on it: split sizes from
  the counters, readers measured on the materialized and (second run) the
  raw examples through the transform graph, report and tuned config
  written, the previous training and the previous tuning found and read.
  """
  local_examples, _ = _examples_and_schema(str(tmp_path))
  root = _ram('transform_root')
  examples = standard_artifacts.Examples()
  examples.uri = os.path.join(root, 'CsvExampleGen', 'examples', '1')
  examples.split_names = local_examples.split_names
  storage.upload_tree(local_examples.uri, examples.uri)
  # A training result of another batch: its rate is not the consumer's.
  training_uri = os.path.join(root, 'Trainer', 'model_run', '1')
  training_result.publish_steady_rate(
      root, training_result.SteadyRate(100.0, 8, training_uri))
  batch = 16
  graph_dir = str(tmp_path / 'transform_graph')
  _write_transform_graph(preprocessing_module, local_examples, graph_dir)
  tuned_uris = []
  # The first run reads the materialized examples, the second transforms
  # the raw ones on the fly with the transform graph.
  for execution, placement in ((1, 'always'), (2, 'on_the_fly')):
    properties = _transform_properties(
        OptimizedTransform, preprocessing_module,
        tuning={'time_budget_s': 3.0, 'batch_size': batch,
                'materialize': placement, 'num_output_shards': 2})
    outputs = _transform_outputs(root, execution)
    (graph,) = outputs[standard_component_specs.TRANSFORM_GRAPH_KEY]
    (transformed,) = outputs[
        standard_component_specs.TRANSFORMED_EXAMPLES_KEY]
    storage.upload_tree(graph_dir, graph.uri)
    executor_utils.SetSplitNames(['train', 'eval'], [transformed])
    counts = _write_transformed_examples(graph.uri, examples, transformed)
    inputs = {standard_component_specs.EXAMPLES_KEY: [examples]}
    (tuned,) = outputs[transform_keys.TUNED_INPUT_PIPELINE_KEY]
    plan = tuning_inputs.plan(
        TuningConfig.from_json(properties[transform_keys.TUNING_KEY]),
        tuned.uri, inputs, outputs, properties, None)
    transform_artifact.write(tuned, tuning_step.tune(
        plan, tuning_step.StockTransform(1.0, counts, time.monotonic()),
        tuning_inputs.transformed_data(plan.tuning, inputs, outputs,
                                       properties, counts)))

    tuned_uris.append(tuned.uri)
    assert sorted(tf.io.gfile.listdir(tuned.uri)) == [
        'candidates.png', tuned_input_pipeline.CONFIG_FILE, 'fingerprint.json',
        'report.md']
    config = tuned_input_pipeline.read(tuned.uri)
    if placement == 'always':
      assert config.transform_placement == 'materialized'
    else:
      assert config.transform_placement == 'on_the_fly'
      assert config.transform_graph_uri == graph.uri
    assert tuned.get_int_custom_property('num_examples') == 32  # Counted.
    assert tuned.get_int_custom_property('batch_size') == batch
    assert tuned.get_float_custom_property('examples_per_sec') > 0
    report = storage.read_text(os.path.join(tuned.uri, 'report.md'))
    assert ('examples per split (Beam counter): Split-eval: 32, '
            'Split-train: 32') in report
    assert f'the previous training ({training_uri}) read batches of 8' in (
        report)
  # The second run found the first one's tuning beside its own output.
  assert f'the previous tuning {tuned_uris[0]}' in report


def test_transform_fails_before_the_transform_when_its_output_is_unwritable(
    tmp_path, preprocessing_module):
  blocker = tmp_path / 'not_a_folder'
  blocker.write_text('')
  outputs = _transform_outputs(str(blocker))
  with pytest.raises(storage.StorageNotWritableError,
                     match='tuned_input_pipeline output at .*not_a_folder/'
                     'Transform/tuned_input_pipeline/1'):
    transform_executor.Executor().Do(
        {}, outputs,
        _transform_properties(OptimizedTransform, preprocessing_module))
  assert blocker.read_text() == ''


@pytest.mark.slow
@pytest.mark.extended
def test_transform_executor_runs_with_only_the_stock_exec_properties(
    tmp_path, preprocessing_module):
  """The drop-in: no `tuning` property, so every tuning default applies."""
  examples, schema = _examples_and_schema(str(tmp_path))
  properties = _transform_properties(tfx.components.Transform,
                                     preprocessing_module)
  assert transform_keys.TUNING_KEY not in properties
  outputs = _transform_outputs(str(tmp_path))
  transform_executor.Executor(transform_executor.Executor.Context(
      beam_pipeline_args=['--direct_running_mode=in_memory',
                          '--direct_num_workers=1'],
      tmp_dir=str(tmp_path / 'beam_tmp'), unique_id='1')).Do(
          _input_dict(examples, schema), outputs, properties)

  defaults = TuningConfig()
  (transformed,) = outputs[standard_component_specs.TRANSFORMED_EXAMPLES_KEY]
  for split in ('train', 'eval'):
    files = glob.glob(os.path.join(transformed.uri, f'Split-{split}', '*'))
    assert len(files) == defaults.num_output_shards, files
  (tuned,) = outputs[transform_keys.TUNED_INPUT_PIPELINE_KEY]
  assert tuned.get_int_custom_property('batch_size') == (
      defaults.measure_batch_size)
  assert tuned.get_int_custom_property('num_examples') == 32
  assert tuned.get_string_custom_property('decision') in (
      tuner.SEARCHED, tuner.STOPPED_EARLY)
  tuned_input_pipeline.read(tuned.uri)
  (graph,) = outputs[standard_component_specs.TRANSFORM_GRAPH_KEY]
  assert tft.TFTransformOutput(graph.uri).transformed_feature_spec().keys() \
      == {'id', 'x', 'label'}


def _read_while_rewritten(path, values, atomic, paced=False):
  """Writes each of `values` to `path` in turn while a thread reads it as
  JSON; what the reader saw. `paced`: each write waits for a read to end
  since the last one (a loaded machine schedules the reader late), so
  every version is read at least once while the next is written."""
  storage.write_json(path, values[0], atomic)
  seen, stop = [], threading.Event()

  def read():
    while not stop.is_set():
      seen.append(storage.read_json(path))

  reader = threading.Thread(target=read)
  reader.start()
  try:
    for value in values[1:]:
      reads = len(seen)
      while paced and len(seen) == reads and reader.is_alive():
        time.sleep(0.001)
      storage.write_json(path, value, atomic)
  finally:
    stop.set()
    reader.join()
  return seen


def test_a_rewritten_ram_file_is_never_missing_to_a_reader():
  """TF's ram:// appends on rewrite; replacing the file must still leave a
  reader the old or the new content, never nothing (a lease read as free)."""
  path = f'ram://hpm-{uuid.uuid4().hex}/lease.json'
  seen = _read_while_rewritten(path, [{'beat': b} for b in range(300)], True)
  assert seen and None not in seen
  assert storage.read_json(path) == {'beat': 299}


@pytest.mark.slow
def test_a_record_rewritten_longer_on_gcs_is_read_whole(gcs_bucket):
  """The chief rewrites events.json one event longer while a worker reads it
  (a relaunch's restore): every read is one version, whole, never the new
  one cut to the old length (GFile.read() asked the size first)."""
  path = f'{gcs_bucket}/torn-{uuid.uuid4().hex}/events.json'
  seen = _read_while_rewritten(
      path, [list(range(count)) for count in range(1, 80)], False,
      paced=True)
  assert len(set(map(len, seen))) > 20  # Reads of many versions.
  assert all(events == list(range(len(events))) for events in seen)
  assert storage.read_json(path) == list(range(79))
