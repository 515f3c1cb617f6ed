"""GPipePartitioner: validation at construction, the executor, a pipeline."""

import json
import os
import subprocess
import sys
import textwrap

from ml_metadata import metadata_store
from ml_metadata.proto import metadata_store_pb2
import pytest
from tfx import types
from tfx.types import standard_artifacts

from components import types as hpm_types
from components.partitioner import config as config_lib
from components.partitioner import executor
from components.partitioner import partition
from components.partitioner import plan as plan_lib
from components.partitioner import report
from components.partitioner.component import GPipePartitioner

TAXI_MODULE = 'pipelines.taxi_module'
TAXI_LAYER_CALLS = 21  # 3 deep-input + 4 hidden + 13 wide + 1 output calls.

SMALL_MODULE = textwrap.dedent('''
    import tensorflow as tf

    def build_model(hparams):
      x = tf.keras.Input((6,), name='x')
      width = hparams.get('width', 32)
      a = tf.keras.layers.Dense(width, name='a')(x)
      b = tf.keras.layers.Dense(width, activation='relu', name='b')(a)
      c = tf.keras.layers.Dense(width, activation='relu', name='c')(b)
      added = tf.keras.layers.Add(name='add')([a, c])
      model = tf.keras.Model(x, tf.keras.layers.Dense(1, name='out')(added))
      model.compile(optimizer='adam', loss='mse')
      return model
''')


@pytest.fixture
def small_module(tmp_path):
  path = tmp_path / 'small_module.py'
  path.write_text(SMALL_MODULE)
  return str(path)


# --------------------------------------------------- construction-time checks


@pytest.mark.parametrize('overrides,message', [
    ({'num_microbatches': 0}, r"num_microbatches must be a positive int or "
                              r"'auto', got 0"),
    ({'num_stages': 0}, r"num_stages must be a positive int or 'auto'"),
    ({'batch_size': 40, 'num_microbatches': 16},
     r'batch_size 40 is not divisible by num_microbatches 16'),
    ({'num_stages': TAXI_LAYER_CALLS + 1, 'num_microbatches': 4},
     rf'exceeds the {TAXI_LAYER_CALLS} partitionable layers'),
    ({'remat': 'sometimes'}, r"remat must be one of \('always', "
                             r"'except_last', 'never'\), got 'sometimes'"),
    ({'remat': 'never', 'offload_activations': True},
     r'offload_activations .* needs remat'),
    ({'batch_size': 8, 'num_stages': 4},
     r"needs a divisor of batch_size 8 that is at least 4 x 4"),
    ({'memory_budget_bytes': -5}, r'memory_budget_bytes must be a positive'),
    ({'profile_repeats': 0}, r'profile_repeats must be a positive int'),
    ({'stages': 2}, r"Unknown GPipePartitioner config option\(s\) \['stages'\]"),
])
def test_bad_parameters_fail_at_construction(overrides, message):
  config = {'batch_size': 64, 'num_stages': 2, **overrides}
  with pytest.raises(ValueError, match=message):
    GPipePartitioner(config=config, module_path=TAXI_MODULE)


def test_missing_batch_size_fails_at_construction():
  with pytest.raises(ValueError, match='config needs batch_size'):
    GPipePartitioner(config={'num_stages': 2}, module_path=TAXI_MODULE)


def test_module_must_be_given_exactly_once(small_module):
  config = {'batch_size': 32}
  with pytest.raises(ValueError, match='exactly one of module_file'):
    GPipePartitioner(config=config)
  with pytest.raises(ValueError, match='exactly one of module_file'):
    GPipePartitioner(config=config, module_file=small_module,
                     module_path=TAXI_MODULE)


def test_examples_need_the_transform_graph():
  with pytest.raises(ValueError, match='pass transform_graph too'):
    GPipePartitioner(
        config={'batch_size': 32}, module_path=TAXI_MODULE,
        examples=types.Channel(type=standard_artifacts.Examples))


def test_valid_construction_records_the_config():
  config = config_lib.PartitionerConfig(batch_size=64, num_stages=4,
                                        remat='always')
  component = GPipePartitioner(config=config, module_path=TAXI_MODULE)
  stored = config_lib.PartitionerConfig.from_json(
      component.exec_properties[executor.CONFIG_KEY])
  assert stored == config
  assert stored.resolve_num_microbatches(4) == 16  # Auto: >= 4 x stages.
  assert component.outputs[executor.PARTITION_PLAN_KEY].type is (
      hpm_types.PartitionPlan)


# ----------------------------------------------------------------- executor


def _run_executor(module_file, output_dir, **config):
  artifact = hpm_types.PartitionPlan()
  artifact.uri = str(output_dir)
  exec_properties = {
      'module_file': module_file,
      executor.CONFIG_KEY: config_lib.PartitionerConfig(**config).to_json(),
  }
  executor.Executor().Do({}, {executor.PARTITION_PLAN_KEY: [artifact]},
                         exec_properties)
  return artifact


def test_executor_writes_plan_profile_and_report(small_module, tmp_path):
  artifact = _run_executor(small_module, tmp_path / 'plan', batch_size=32,
                           num_stages=2, profile_repeats=2,
                           hparams={'width': 16})
  uri = artifact.uri
  for name in (plan_lib.PLAN_FILE, plan_lib.PROFILE_FILE, report.REPORT_MD,
               report.STAGE_COSTS_PNG, report.SCHEDULE_PNG):
    assert os.path.getsize(os.path.join(uri, name)) > 0, name
  with open(os.path.join(uri, plan_lib.PLAN_FILE)) as f:
    plan = json.load(f)
  with open(os.path.join(uri, plan_lib.PROFILE_FILE)) as f:
    profile = plan_lib.ModelProfile.from_json(f.read())
  assert plan['num_stages'] == 2 and plan['num_microbatches'] == 8
  assert plan['microbatch_size'] == 4 == profile.microbatch_size
  assert plan['layer_signature'] == ['Dense', 'Dense', 'Dense', 'Add',
                                     'Dense']
  assert plan['config']['hparams'] == {'width': 16}
  assert profile.layers[0].parameter_bytes == 4 * (6 * 16 + 16)
  # The plan is the optimum for the profile it ships with.
  costs = plan_lib.layer_costs(profile, 8, 'except_last')
  assert plan['predicted']['slowest_stage_seconds'] == pytest.approx(
      partition.optimal_partition(costs, 2).bottleneck)
  assert artifact.get_int_custom_property('num_stages') == 2
  assert artifact.get_int_custom_property('num_microbatches') == 8
  assert json.loads(artifact.get_string_custom_property('boundaries')) == (
      plan['boundaries'])
  assert artifact.get_float_custom_property('bubble_fraction') == (
      pytest.approx(1 / 9))


def test_executor_auto_stages_use_the_visible_devices(small_module, tmp_path):
  artifact = _run_executor(small_module, tmp_path / 'plan', batch_size=32,
                           profile_repeats=1)
  expected = min(executor.available_devices(), 5)
  assert artifact.get_int_custom_property('num_stages') == expected


def test_executor_infeasible_budget_names_the_smallest(small_module,
                                                       tmp_path):
  with pytest.raises(partition.InfeasibleBudgetError,
                     match='smallest budget that works is') as error:
    _run_executor(small_module, tmp_path / 'plan', batch_size=32,
                  num_stages=2, profile_repeats=1, memory_budget_bytes=1000)
  # That budget then works.
  artifact = _run_executor(
      small_module, tmp_path / 'plan2', batch_size=32, num_stages=2,
      profile_repeats=1,
      memory_budget_bytes=int(error.value.min_budget) + 1)
  assert artifact.get_int_custom_property('peak_memory_bytes') <= (
      error.value.min_budget + 1)


# ----------------------------------------------------------------- pipeline

PIPELINE_SCRIPT = textwrap.dedent('''
    import sys
    from tfx import v1 as tfx
    from components import GPipePartitioner
    from pipelines import taxi_pipeline

    data_root, pipeline_root, serving_dir = sys.argv[1:4]

    def add_partitioner(transformed_examples, transform_outputs, module_file):
      partitioner = GPipePartitioner(
          module_file=module_file,
          config={'batch_size': 32, 'num_stages': 2, 'profile_repeats': 2},
          examples=transformed_examples,
          transform_graph=transform_outputs['transform_graph'])
      return [partitioner], {
          'partition_plan': partitioner.outputs['partition_plan']}

    pipeline = taxi_pipeline.create_pipeline(
        pipeline_name='gpipe_e2e', pipeline_root=pipeline_root,
        serving_model_dir=serving_dir, data_root=data_root,
        train_steps=600, eval_steps=5, accuracy_threshold=0.78,
        extra_trainer_inputs=add_partitioner,
        **taxi_pipeline.hpm_factories(
            distribution={'global_batch_size': 32}))
    tfx.orchestration.LocalDagRunner().run(pipeline)
''')


def _artifacts_of_type(metadata_path, type_name):
  connection = metadata_store_pb2.ConnectionConfig()
  connection.sqlite.filename_uri = metadata_path
  connection.sqlite.connection_mode = 1  # Read-only.
  return metadata_store.MetadataStore(connection).get_artifacts_by_type(
      type_name)


@pytest.mark.slow
def test_pipeline_transform_partitioner_trainer_evaluator(tmp_path,
                                                          taxi_sample_dir):
  # pylint: disable-next=g-import-not-at-top
  from pipelines import summary  # Loads TFMA: only this slow test needs it.
  root = tmp_path / 'root'
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, TF_USE_LEGACY_KERAS='1', PYTHONPATH=repo)
  proc = subprocess.run(
      [sys.executable, '-c', PIPELINE_SCRIPT, taxi_sample_dir, str(root),
       str(tmp_path / 'serving')],
      cwd=repo, env=env, capture_output=True, text=True, timeout=1200)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]

  metadata_path = str(root / 'metadata.db')
  run = summary.read_run(metadata_path)
  states = {e.node_id: e.state for e in run.executions}
  assert {'Transform', 'GPipePartitioner', 'Trainer', 'Evaluator'} <= set(
      states)
  assert all(state == 'COMPLETE' for state in states.values()), states
  # The GPipe-trained model beats the majority class (~0.767 on the sample's
  # eval split) by the bound the Evaluator blessed it at (0.796 measured).
  assert run.blessed is True
  assert run.metrics['binary_accuracy'] >= 0.78, run.metrics

  (plan_artifact,) = _artifacts_of_type(metadata_path, 'tfx_hpm.PartitionPlan')
  properties = plan_artifact.custom_properties
  assert properties['num_stages'].int_value == 2
  assert properties['num_microbatches'].int_value == 8
  with open(os.path.join(plan_artifact.uri, plan_lib.PLAN_FILE)) as f:
    plan = json.load(f)
  # Profiled on real transformed examples: 4 per micro-batch of the 32.
  assert plan['microbatch_size'] == 4
  assert len(plan['layer_signature']) == TAXI_LAYER_CALLS
  assert os.path.getsize(os.path.join(plan_artifact.uri,
                                      report.SCHEDULE_PNG)) > 0

  # The trainer executed the plan: GPipe over the plan's stages.
  (model_run,) = _artifacts_of_type(metadata_path, 'ModelRun')
  with open(os.path.join(model_run.uri, 'training_result.json')) as f:
    result = json.load(f)
  assert result['pipeline_parallel'] == {
      'num_stages': 2, 'num_microbatches': 8,
      'boundaries': plan['boundaries'], 'remat': plan['remat']}
  assert result['steps'] == 600
