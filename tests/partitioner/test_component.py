"""GPipePartitioner: validation at construction and the executor.

Its pipeline run (Transform -> GPipePartitioner -> Trainer -> Evaluator on gs://)
is tests/test_gcs_pipeline.py::test_hpm_pipeline_with_gpipe_on_gcs.
"""

import json
import os
import textwrap

import pytest
from tfx import types
from tfx.types import standard_artifacts
from tfx.types import standard_component_specs

from components.partitioner.component import GPipePartitioner
from components.partitioner import config as config_lib
from components.partitioner import executor
from components.partitioner import partition
from components.partitioner import plan as plan_lib
from components.partitioner import report
from components.partitioner import spec_keys
from components.records import partition_plan
from components import types as hpm_types

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
    ({'remat': 'sometimes'}, r"remat must be one of \('always', "
                             r"'except_last', 'never'\), got 'sometimes'"),
    ({'remat': 'never', 'offload_activations': True},
     r'offload_activations .* needs remat'),
    ({'memory_budget_bytes': -5}, r'memory_budget_bytes must be a positive'),
    ({'data_parallel_replicas': 0},
     r'data_parallel_replicas must be a positive int, got 0'),
    ({'batch_size': 30, 'data_parallel_replicas': 4},
     r'batch_size 30 is not divisible by data_parallel_replicas 4'),
    ({'data_parallel_replicas': 2, 'num_microbatches': 64},
     r'batch_size 64 is not divisible by num_microbatches 64 x '
     r'data_parallel_replicas 2; .* Divisors of 32: '),
    ({'measure_schedule': 'yes'}, r"measure_schedule must be a bool, got "
                                  r"'yes'"),
    ({'schedule': 'pipedream'},
     r"schedule must be one of \('gpipe', '1f1b', 'auto'\), got "
     r"'pipedream'"),
    ({'profile_repeats': 0}, r'profile_repeats must be a positive int'),
    ({'stages': 2},
     r"Unknown GPipePartitioner config option\(s\) \['stages'\]"),
    # Non-finite numbers and wrong types, option by option.
    ({'batch_size': float('nan')},
     r'batch_size must be a positive int, got nan'),
    ({'batch_size': 64.0}, r'batch_size must be a positive int, got 64.0'),
    ({'num_stages': float('inf')}, r"num_stages must be a positive int or "),
    ({'num_microbatches': 'all'}, r"num_microbatches must be a positive int "),
    ({'data_parallel_replicas': True},
     r'data_parallel_replicas must be a positive int, got True'),
    ({'memory_budget_bytes': float('inf')},
     r'memory_budget_bytes must be a positive int or None, got inf'),
    ({'remat': None}, r'remat must be one of'),
    ({'schedule': 1}, r'schedule must be one of'),
    ({'offload_activations': 1}, r'offload_activations must be a bool'),
    ({'profile_repeats': float('nan')}, r'profile_repeats must be a positive'),
    ({'hparams': [1]}, r'hparams must be a dict'),
    ({'hparams': {'lr': float('nan')}},
     r"hparams\['lr'\] must be a finite number, got nan"),
    ({'hparams': {'sizes': [8, float('inf')]}},
     r"hparams\['sizes'\]\[1\] must be a finite number, got inf"),
    ({'hparams': {1: 2}}, r'hparams keys must be strings, got 1'),
    ({'hparams': {'f': print}}, r"hparams\['f'\] must hold only JSON values"),
    ({'sample_split': 0}, r'sample_split must be a split name, got 0'),
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


def test_spec_keys_keep_their_names():
  # Pipelines, MLMD records and the Kubeflow IR name them.
  spec = GPipePartitioner.SPEC_CLASS
  assert set(spec.PARAMETERS) == {'module_file', 'module_path', 'config'}
  assert set(spec.INPUTS) == {'examples', 'transform_graph'}
  assert set(spec.OUTPUTS) == {'partition_plan'}


def test_valid_construction_records_the_config():
  config = config_lib.PartitionerConfig(batch_size=64, num_stages=4,
                                        remat='always')
  component = GPipePartitioner(config=config, module_path=TAXI_MODULE)
  stored = config_lib.PartitionerConfig.from_json(
      component.exec_properties[spec_keys.CONFIG_KEY])
  assert stored == config
  # Auto: every divisor of the batch, both schedules, are candidates.
  assert stored.microbatch_counts() == [1, 2, 4, 8, 16, 32, 64]
  assert stored.schedule_names() == ['gpipe', '1f1b']
  assert component.outputs[spec_keys.PARTITION_PLAN_KEY].type is (
      hpm_types.PartitionPlan)


# ----------------------------------------------------------------- executor


def _run_executor(module_file, output_dir, **config):
  artifact = hpm_types.PartitionPlan()
  artifact.uri = str(output_dir)
  exec_properties = {
      standard_component_specs.MODULE_FILE_KEY: module_file,
      spec_keys.CONFIG_KEY: config_lib.PartitionerConfig(**config).to_json(),
  }
  executor.Executor().Do({}, {spec_keys.PARTITION_PLAN_KEY: [artifact]},
                         exec_properties)
  return artifact


def test_too_many_stages_fail_when_the_executor_starts(tmp_path):
  """Construction runs no user code; the executor's first step does."""
  config = {'batch_size': 64, 'num_stages': TAXI_LAYER_CALLS + 1,
            'num_microbatches': 4}
  GPipePartitioner(config=config, module_path=TAXI_MODULE)
  artifact = hpm_types.PartitionPlan()
  artifact.uri = str(tmp_path / 'plan')
  with pytest.raises(ValueError, match=rf'exceeds the {TAXI_LAYER_CALLS} '
                     'partitionable layers'):
    executor.Executor().Do({}, {spec_keys.PARTITION_PLAN_KEY: [artifact]}, {
        standard_component_specs.MODULE_PATH_KEY: TAXI_MODULE,
        spec_keys.CONFIG_KEY: config_lib.PartitionerConfig(**config).to_json()})
  assert not os.path.exists(artifact.uri)


def test_executor_writes_plan_profile_and_report(small_module, tmp_path):
  artifact = _run_executor(small_module, tmp_path / 'plan', batch_size=32,
                           num_stages=2, num_microbatches=8,
                           schedule='gpipe', profile_repeats=2,
                           hparams={'width': 16})
  uri = artifact.uri
  for name in (partition_plan.PLAN_FILE, plan_lib.PROFILE_FILE,
               report.REPORT_MD,
               report.STAGE_COSTS_PNG, report.SCHEDULE_PNG):
    assert os.path.getsize(os.path.join(uri, name)) > 0, name
  with open(os.path.join(uri, partition_plan.PLAN_FILE)) as f:
    plan = json.load(f)
  with open(os.path.join(uri, plan_lib.PROFILE_FILE)) as f:
    profile = plan_lib.ModelProfile.from_json(f.read())
  assert plan['num_stages'] == 2 and plan['num_microbatches'] == 8
  assert plan['schedule'] == 'gpipe'
  assert plan['microbatch_size'] == 4 == profile.microbatch_size
  assert plan['choice']['measured_microbatch_sizes'] == [4]
  assert plan['layer_signature'] == ['Dense', 'Dense', 'Dense', 'Add',
                                     'Dense']
  assert plan['config']['hparams'] == {'width': 16}
  assert profile.layers[0].parameter_bytes == 4 * (6 * 16 + 16)
  # The plan is the optimum for the profile it ships with.
  costs = plan_lib.layer_costs(profile, 2, 8, 'except_last', 'gpipe')
  assert plan['predicted']['slowest_stage_seconds'] == pytest.approx(
      partition.optimal_partition(costs, 2).bottleneck)
  assert artifact.get_int_custom_property('num_stages') == 2
  assert artifact.get_int_custom_property('num_microbatches') == 8
  assert artifact.get_string_custom_property('schedule') == 'gpipe'
  assert json.loads(artifact.get_string_custom_property('boundaries')) == (
      plan['boundaries'])
  assert artifact.get_float_custom_property('bubble_fraction') == (
      pytest.approx(1 / 9))


def test_executor_auto_picks_the_fastest_microbatches_and_schedule(
    small_module, tmp_path):
  artifact = _run_executor(small_module, tmp_path / 'plan', batch_size=16,
                           num_stages=2, profile_repeats=2)
  with open(os.path.join(artifact.uri, partition_plan.PLAN_FILE)) as f:
    plan = json.load(f)
  choice = plan['choice']
  # Measured at the smallest and the largest micro-batch.
  assert choice['measured_microbatch_sizes'] == [1, 16]
  rows = choice['candidates']
  assert {(r['num_microbatches'], r['schedule']) for r in rows} == {
      (m, s) for m in (1, 2, 4, 8, 16) for s in ('gpipe', '1f1b')}
  fastest = min(r['step_seconds'] for r in rows)
  assert plan['predicted']['step_seconds'] == pytest.approx(fastest)
  assert plan['batch_size'] == 16
  assert plan['microbatch_size'] * plan['num_microbatches'] == 16
  text = open(os.path.join(artifact.uri, report.REPORT_MD)).read()
  assert '## Choice of M and schedule' in text and choice['reason'] in text
  assert choice['reason'].startswith(
      f"M={plan['num_microbatches']}, {plan['schedule']}: the shortest")


def test_executor_auto_stages_use_the_visible_devices(small_module, tmp_path):
  artifact = _run_executor(small_module, tmp_path / 'plan', batch_size=32,
                           profile_repeats=1)
  expected = min(executor.available_devices(), 5)
  assert artifact.get_int_custom_property('num_stages') == expected


def test_executor_plans_data_parallel_copies(small_module, tmp_path):
  artifact = _run_executor(small_module, tmp_path / 'plan', batch_size=32,
                           num_stages=2, num_microbatches=4,
                           data_parallel_replicas=2, profile_repeats=1)
  with open(os.path.join(artifact.uri, partition_plan.PLAN_FILE)) as f:
    plan = json.load(f)
  # Each of the 2 copies: 16 examples in 4 micro-batches of 4.
  assert plan['data_parallel_replicas'] == 2
  assert plan['batch_size'] == 32 and plan['microbatch_size'] == 4
  assert plan['choice']['measured_microbatch_sizes'] == [4]
  assert artifact.get_int_custom_property('data_parallel_replicas') == 2


def test_executor_measures_the_schedule_in_a_real_step(small_module,
                                                      tmp_path):
  artifact = _run_executor(small_module, tmp_path / 'plan', batch_size=16,
                           num_stages=2, num_microbatches=4, schedule='1f1b',
                           profile_repeats=1, measure_schedule=True)
  with open(os.path.join(artifact.uri, partition_plan.PLAN_FILE)) as f:
    plan = json.load(f)
  measured = plan['measured']
  assert len(set(measured['devices'])) == 2
  # Every stage ran every micro-batch's forward and backward, each backward
  # starting after its forward did (control dependencies order them).
  spans = {(t['stage'], t['microbatch'], t['phase']): (t['start'], t['end'])
           for t in measured['tasks']}
  assert set(spans) == {(s, m, p) for s in (0, 1) for m in range(4)
                        for p in ('forward', 'backward')}
  for s in (0, 1):
    for m in range(4):
      assert spans[(s, m, 'forward')][0] < spans[(s, m, 'backward')][0]
  assert 0.0 < measured['idle_fraction'] < 1.0
  assert artifact.get_float_custom_property('measured_idle_fraction') == (
      pytest.approx(measured['idle_fraction']))
  text = open(os.path.join(artifact.uri, report.REPORT_MD)).read()
  assert f"![measured schedule]({report.MEASURED_SCHEDULE_PNG})" in text
  assert os.path.getsize(os.path.join(artifact.uri,
                                      report.MEASURED_SCHEDULE_PNG)) > 5000


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
