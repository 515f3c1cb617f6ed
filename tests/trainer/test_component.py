"""HighPerfTrainer construction: the stock contract, and early, clear errors."""

import dataclasses
import json
import os
import textwrap

from google.protobuf import json_format
import pytest
import tensorflow as tf
from tfx import v1 as tfx
from tfx.types import standard_artifacts
from tfx.types import standard_component_specs

from components import HighPerfTrainer
from components.records import training_result
from components.partitioner import spec_keys as partitioner_keys
from components.trainer.config import DistributionConfig
from components.trainer import executor
from components.trainer import fn_args as fn_args_lib
from components.trainer import model_run as model_run_lib
from components.trainer import spec_keys
from components.trainer.strategies import choice as strategy_lib
from components import types as hpm_types
from pipelines import data

# The stock TFX taxi module shipped with tfx (next to the taxi data).
STOCK_TAXI_MODULE = os.path.join(
    os.path.dirname(os.path.dirname(data.default_data_root())),
    'taxi_utils_native_keras.py')


def _channel(artifact_type):
  return tfx.dsl.Channel(type=artifact_type)


def _trainer(**overrides):
  kwargs = dict(
      examples=_channel(standard_artifacts.Examples),
      transform_graph=_channel(standard_artifacts.TransformGraph),
      schema=_channel(standard_artifacts.Schema),
      module_file=data.default_module_file(),
      train_args=tfx.proto.TrainArgs(num_steps=10),
      eval_args=tfx.proto.EvalArgs(num_steps=2))
  kwargs.update(overrides)
  return HighPerfTrainer(**kwargs)


def _module(tmp_path, source: str) -> str:
  path = tmp_path / 'user_module.py'
  path.write_text(textwrap.dedent(source))
  return str(path)


def _start_executor(trainer, tmp_path):
  """Runs the trainer's executor as an orchestrator would (protos as JSON).

  The inputs name no files: the tests using it fail before anything is read.
  """
  examples = standard_artifacts.Examples()
  examples.uri = str(tmp_path / 'examples')
  examples.split_names = json.dumps(['train', 'eval'])
  model, model_run = standard_artifacts.Model(), standard_artifacts.ModelRun()
  model.uri = str(tmp_path / 'model')
  model_run.uri = str(tmp_path / 'model_run')
  properties = {
      key: (json_format.MessageToJson(value, preserving_proto_field_name=True)
            if hasattr(value, 'DESCRIPTOR') else value)
      for key, value in trainer.exec_properties.items() if value is not None}
  executor.Executor().Do(
      {standard_component_specs.EXAMPLES_KEY: [examples]},
      {standard_component_specs.MODEL_KEY: [model],
       standard_component_specs.MODEL_RUN_KEY: [model_run]},
      properties)


def test_drop_in_spec_and_exec_properties():
  tuned = _channel(hpm_types.TunedInputPipeline)
  trainer = _trainer(
      distribution={'strategy': 'mirrored', 'logical_cpu_devices': 2},
      fault_tolerance={'save_every_steps': 5}, tuned_input_pipeline=tuned,
      custom_config={'batch_size': 8})
  stock = tfx.components.Trainer(
      examples=_channel(standard_artifacts.Examples),
      module_file=data.default_module_file())
  assert set(stock.spec.PARAMETERS) < set(trainer.spec.PARAMETERS)
  assert set(stock.spec.INPUTS) < set(trainer.spec.INPUTS)
  assert set(trainer.outputs) == {standard_component_specs.MODEL_KEY,
                                  standard_component_specs.MODEL_RUN_KEY}
  assert trainer.outputs[standard_component_specs.MODEL_KEY].type is (
      standard_artifacts.Model)
  assert trainer.inputs[spec_keys.TUNED_INPUT_PIPELINE_KEY] is tuned
  distribution = json.loads(
      trainer.exec_properties[spec_keys.DISTRIBUTION_KEY])
  assert distribution['strategy'] == 'mirrored'
  assert distribution['logical_cpu_devices'] == 2
  fault = json.loads(trainer.exec_properties[spec_keys.FAULT_TOLERANCE_KEY])
  assert fault['save_every_steps'] == 5
  assert json.loads(trainer.exec_properties[
      standard_component_specs.CUSTOM_CONFIG_KEY]) == {'batch_size': 8}
  assert trainer.executor_spec.executor_class is executor.Executor


def test_spec_keys_keep_their_names():
  # Pipelines, MLMD records and the Kubeflow IR name them.
  spec, stock = HighPerfTrainer.SPEC_CLASS, standard_component_specs.TrainerSpec
  assert set(spec.PARAMETERS) - set(stock.PARAMETERS) == {
      'distribution', 'fault_tolerance', 'component_class'}
  assert set(spec.INPUTS) - set(stock.INPUTS) == {
      'tuned_input_pipeline', 'partition_plan'}
  assert spec.OUTPUTS == stock.OUTPUTS


def test_mode_follows_the_module():
  check = executor.check_module_contract
  assert check(STOCK_TAXI_MODULE, None, None, 'auto') == 'run_fn'
  assert check(data.default_module_file(), None, None, 'auto') == 'managed'
  assert check(data.default_module_file(), None, None, 'run_fn') == 'run_fn'
  assert check(None, 'pipelines.taxi_module', None, 'auto') == 'managed'
  assert check(None, None, 'pipelines.taxi_module.run_fn', 'auto') == 'run_fn'
  # A stock module needs no training length (its run_fn decides).
  trainer = _trainer(module_file=STOCK_TAXI_MODULE,
                     train_args=tfx.proto.TrainArgs())
  assert trainer.exec_properties[
      standard_component_specs.MODULE_FILE_KEY] == STOCK_TAXI_MODULE


def test_run_fn_path_parameter(tmp_path):
  trainer = _trainer(module_file=None, run_fn='pipelines.taxi_module.run_fn')
  assert trainer.exec_properties[standard_component_specs.RUN_FN_KEY] == (
      'pipelines.taxi_module.run_fn')
  with pytest.raises(ValueError, match=r"run_fn 'pipelines.taxi_module.nope'"):
    _start_executor(
        _trainer(module_file=None, run_fn='pipelines.taxi_module.nope'),
        tmp_path)


@pytest.mark.parametrize('distribution,expected', [
    ({'strategy': 'horovod'}, "strategy='horovod' is not one of ('auto', "),
    ({'strategy': 'mirrored', 'num_ps': 1}, 'num_ps=1 needs a strategy with '
     'parameter servers'),
    ({'strategy': 'multi_worker_mirrored', 'num_workers': 0},
     'num_workers=0 must be an integer >= 1'),
    ({'strategy': 'mirrored', 'logical_cpu_devices': 2,
      'global_batch_size': 33}, 'global_batch_size=33 does not divide evenly '
     'by the 2 replicas'),
    ({'gradient_accumulation_steps': 0},
     'gradient_accumulation_steps=0 must be an integer >= 1'),
    ({'launcher': 'ssh'}, "launcher='ssh' is not one of ('auto', "
     "'in_process', 'local', 'ray')"),
    ({'launcher': 'ray', 'ray': {'placement': 'RANDOM'}},
     "ray.placement='RANDOM' is not one of ('SPREAD', 'PACK')"),
    ({'num_gpus': 2}, "Unknown distribution option(s) ['num_gpus']"),
    ({'precision': 'float8'}, "precision='float8' is not one of ('float32', "
     "'mixed_bfloat16', 'mixed_float16', 'auto')"),
    ({'xla': 'yes'}, "xla='yes' is not one of ('off', 'on', 'auto')"),
    ({'offload': {'cells': 'all'}},
     "offload.cells='all' must be an integer >= 0 or 'auto'"),
])
def test_bad_distribution_fails_at_construction(distribution, expected):
  with pytest.raises(ValueError) as error:
    _trainer(distribution=distribution)
  assert expected in str(error.value)


def _partitioner(batch_size):
  from components import GPipePartitioner  # pylint: disable=g-import-not-at-top
  return GPipePartitioner(config={'batch_size': batch_size, 'num_stages': 2},
                          module_path='pipelines.taxi_module')


def test_plan_with_another_batch_fails_at_construction():
  plan = _partitioner(64).outputs[partitioner_keys.PARTITION_PLAN_KEY]
  with pytest.raises(ValueError, match=r'partition plan is made for '
                     r"batch_size 64, but the trainer's global batch is 32"):
    _trainer(partition_plan=plan, distribution={'global_batch_size': 32})
  # The default batch (32 per replica, one pipeline) against the plan's.
  with pytest.raises(ValueError, match="global batch is 32"):
    _trainer(partition_plan=plan)
  _trainer(partition_plan=plan, distribution={'global_batch_size': 64})
  _trainer(partition_plan=plan, distribution={'per_replica_batch_size': 64})


@pytest.mark.parametrize('distribution,expected', [
    ({'strategy': 'mirrored', 'global_batch_size': 64},
     "strategy must be one of ('auto', 'one_device'), got 'mirrored'"),
    ({'gradient_accumulation_steps': 2, 'global_batch_size': 64},
     'gradient_accumulation_steps=2 with a partition plan'),
])
def test_plan_needs_one_pipeline_at_construction(distribution, expected):
  plan = _partitioner(64).outputs[partitioner_keys.PARTITION_PLAN_KEY]
  with pytest.raises(ValueError) as error:
    _trainer(partition_plan=plan, distribution=distribution)
  assert expected in str(error.value)


def test_plan_from_outside_the_pipeline_is_checked_at_run_time():
  # Its batch is unknown here; the strategy is still checked.
  _trainer(partition_plan=_channel(hpm_types.PartitionPlan),
           distribution={'global_batch_size': 48})
  with pytest.raises(ValueError, match='strategy must be one of'):
    _trainer(partition_plan=_channel(hpm_types.PartitionPlan),
             distribution={'strategy': 'central_storage'})


def test_bad_fault_tolerance_fails_at_construction():
  with pytest.raises(ValueError, match='max_restarts=-1'):
    _trainer(fault_tolerance={'max_restarts': -1})


def test_module_without_entry_points_fails_when_the_executor_starts(
    tmp_path):
  only_run_fn = _module(tmp_path, """
      def run_fn(fn_args):
        pass
      """)
  with pytest.raises(ValueError,
                     match="mode='managed' needs build_model.*user_module.py"):
    _start_executor(_trainer(module_file=only_run_fn,
                             distribution={'mode': 'managed'}), tmp_path)
  neither = _module(tmp_path, 'VALUE = 1\n')
  with pytest.raises(ValueError, match='defines neither build_model'):
    _start_executor(_trainer(module_file=neither), tmp_path)
  only_build_model = _module(tmp_path, """
      def build_model(hparams):
        return None
      """)
  with pytest.raises(ValueError, match="mode='run_fn' needs run_fn"):
    _start_executor(_trainer(module_file=only_build_model,
                             distribution={'mode': 'run_fn'}), tmp_path)
  # Nothing started: no decision, no task, no model.
  assert not (tmp_path / 'model').exists()
  assert os.listdir(tmp_path / 'model_run') == []


def test_an_elastic_run_fn_fails_when_the_executor_starts(tmp_path):
  only_run_fn = _module(tmp_path, """
      def run_fn(fn_args):
        pass
      """)
  with pytest.raises(ValueError, match=r'min_workers=1 < num_workers=2 needs '
                     'managed mode.*allowed in run_fn mode: min_workers=2'):
    _start_executor(_trainer(module_file=only_run_fn, distribution={
        'strategy': 'multi_worker_mirrored', 'launcher': 'ray',
        'num_workers': 2, 'min_workers': 1}), tmp_path)
  assert os.listdir(tmp_path / 'model_run') == []


def test_missing_module_fails_when_the_executor_starts(tmp_path):
  missing = str(tmp_path / 'nowhere.py')
  trainer = _trainer(module_file=missing)
  assert trainer.exec_properties[
      standard_component_specs.MODULE_FILE_KEY] == missing
  with pytest.raises(ValueError, match=f"module_file '{missing}' does not "
                     'exist'):
    _start_executor(trainer, tmp_path)
  with pytest.raises(ValueError, match="'pipelines.no_such_module' .* is not "
                     'an importable module'):
    _start_executor(_trainer(module_file='pipelines.no_such_module'),
                    tmp_path)


def test_importable_module_name_becomes_module_path():
  """As the Kubeflow runner passes it: the module installed in the image."""
  trainer = _trainer(module_file='pipelines.taxi_module')
  properties = trainer.exec_properties
  assert properties[standard_component_specs.MODULE_PATH_KEY] == (
      'pipelines.taxi_module')
  assert properties[standard_component_specs.MODULE_FILE_KEY] is None


def test_module_file_and_run_fn_are_exclusive():
  with pytest.raises(ValueError, match="Exactly one of 'module_file' or "
                     "'run_fn'"):
    _trainer(run_fn='pipelines.taxi_module.run_fn')
  with pytest.raises(ValueError, match="Exactly one of 'module_file' or "
                     "'run_fn'"):
    _trainer(module_file=None)


def test_managed_mode_needs_a_training_length(tmp_path):
  # Configured as managed: known at construction.
  with pytest.raises(ValueError, match='Managed mode needs '
                     'train_args.num_steps > 0 or distribution train_epochs'):
    _trainer(train_args=tfx.proto.TrainArgs(),
             distribution={'mode': 'managed'})
  # 'auto' is managed for this module: known once the executor loads it.
  with pytest.raises(ValueError, match='Managed mode needs '
                     'train_args.num_steps > 0 or distribution train_epochs'):
    _start_executor(_trainer(train_args=tfx.proto.TrainArgs()), tmp_path)
  _trainer(train_args=tfx.proto.TrainArgs(), distribution={'train_epochs': 1})
  with pytest.raises(ValueError, match='set only one'):
    _trainer(distribution={'train_epochs': 1})


def test_auto_shard_policy_fits_the_file_count(tmp_path):
  policy = tf.data.experimental.AutoShardPolicy
  assert fn_args_lib.auto_shard_policy(4, 2) == policy.FILE
  assert fn_args_lib.auto_shard_policy(2, 2) == policy.FILE
  assert fn_args_lib.auto_shard_policy(1, 2) == policy.DATA
  path = str(tmp_path / 'one.tfrecord')
  with tf.io.TFRecordWriter(path) as writer:
    writer.write(b'x')
  factory = fn_args_lib.with_auto_shard(
      lambda patterns, options, schema: tf.data.TFRecordDataset(patterns), 2)
  dataset = factory([path], None, None)
  assert (dataset.options().experimental_distribute.auto_shard_policy ==
          policy.DATA)


def test_dataset_factory_batches_the_global_batch(tmp_path):
  options = tf.io.TFRecordOptions(compression_type='GZIP')
  with tf.io.TFRecordWriter(str(tmp_path / 'part-0.gz'), options) as writer:
    for i in range(10):
      writer.write(tf.train.Example(features=tf.train.Features(feature={
          'x': tf.train.Feature(float_list=tf.train.FloatList(value=[i])),
          'label': tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
      })).SerializeToString())
  spec = {'x': tf.io.FixedLenFeature([1], tf.float32),
          'label': tf.io.FixedLenFeature([], tf.int64)}
  factory = fn_args_lib.DatasetFactory(
      tf.distribute.OneDeviceStrategy('/cpu:0'), spec, None,
      global_batch_size=4)
  batches = list(factory([str(tmp_path / 'part-*')], 'label', shuffle=False,
                         num_epochs=1))
  assert len(batches) == 2  # 10 examples, batches of 4, remainder dropped.
  features, labels = batches[0]
  assert labels.numpy().tolist() == [0, 1, 2, 3]
  assert features['x'].shape == (4, 1)
  bigger = list(factory([str(tmp_path / 'part-*')], None, batch_size=5,
                        shuffle=False, num_epochs=1))
  assert [b['label'].shape[0] for b in bigger] == [5, 5]


def test_seed_and_determinism_are_recorded_on_model_run(tmp_path):
  model_run = standard_artifacts.ModelRun()
  model_run.uri = str(tmp_path)
  config = DistributionConfig(
      strategy='one_device', seed=42, deterministic=True)
  model_run_lib.record_decision(
      model_run, config, 'requested', strategy_lib.Environment())
  assert model_run.get_int_custom_property('seed') == 42
  assert model_run.get_int_custom_property('deterministic') == 1
  with open(tmp_path / model_run_lib.DECISION_FILE) as f:
    decision = json.load(f)
  assert decision['config']['seed'] == 42
  assert decision['config']['deterministic'] is True

  unseeded = standard_artifacts.ModelRun()
  unseeded.uri = str(tmp_path / 'unseeded')
  model_run_lib.record_decision(
      unseeded, DistributionConfig(strategy='one_device'),
      'requested', strategy_lib.Environment())
  assert not unseeded.has_custom_property('seed')
  assert unseeded.get_int_custom_property('deterministic') == 0


def _managed_result(**loop_facts) -> training_result.TrainingResult:
  """A managed training's result whose loop reports only `loop_facts`."""
  loop = {f.name: None for f in dataclasses.fields(training_result.LoopReport)}
  return training_result.TrainingResult(
      mode='managed', strategy='one_device', steps=1500, num_replicas=1,
      num_workers=1, per_replica_batch_size=4, global_batch_size=4,
      train_steps=1500, eval_steps=2, seed=None, deterministic=False,
      intra_op_threads={}, train_wall_s=1.5, worker_imports_s=2.0,
      worker_setup_s=0.1, loop=training_result.LoopReport(
          **{**loop, 'resume_events': [], **loop_facts}))


def test_a_result_without_a_loss_is_stored_in_mlmd(tmp_path):
  """An attempt resumed at the last step trains none: its loss is NaN,
  which MLMD's SQLite refuses (the run failed); the other numbers go in."""
  # pylint: disable-next=g-import-not-at-top
  from ml_metadata.metadata_store import metadata_store
  from ml_metadata.proto import metadata_store_pb2  # pylint: disable=g-import-not-at-top
  model_run = standard_artifacts.ModelRun()
  model_run.uri = str(tmp_path)
  result = _managed_result(train_loss=float('nan'), examples_per_sec=0.0)
  model_run_lib.record_result(model_run, result, {})
  config = metadata_store_pb2.ConnectionConfig()
  config.sqlite.filename_uri = str(tmp_path / 'metadata.db')
  store = metadata_store.MetadataStore(config)
  artifact = model_run.mlmd_artifact
  artifact.type_id = store.put_artifact_type(model_run.artifact_type)
  [artifact_id] = store.put_artifacts([artifact])
  [stored] = store.get_artifacts_by_id([artifact_id])
  assert 'train_loss' not in stored.custom_properties
  assert stored.custom_properties['train_wall_s'].double_value == 1.5
  assert stored.custom_properties['train_steps'].int_value == 1500


def test_the_offload_record_is_on_model_run(tmp_path):
  model_run = standard_artifacts.ModelRun()
  model_run.uri = str(tmp_path)
  offload = {'cells': {'cell-0': 'localhost:1', 'cell-1': 'localhost:2'},
             'lost': {'cell-0': 'its process is gone'},
             'partitions': {'0': 'cell-1'},
             'events': [{'event': 'lost', 'cell': 'cell-0', 'position': 7}]}
  model_run_lib.record_result(model_run, _managed_result(offload=offload),
                              {})
  assert json.loads(model_run.get_string_custom_property(
      'offload')) == offload


def test_skipped_unreadable_records_are_on_model_run(tmp_path):
  model_run = standard_artifacts.ModelRun()
  model_run.uri = str(tmp_path)
  skipped = [{'path': '/d/train-03.gz', 'position': 40, 'skipped': None,
              'error': 'incorrect data check'}]
  model_run_lib.record_result(
      model_run, _managed_result(unreadable_records=skipped), {})
  assert json.loads(model_run.get_string_custom_property(
      'unreadable_records')) == skipped
