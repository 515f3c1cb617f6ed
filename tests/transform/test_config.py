"""TuningConfig validation and OptimizedTransform construction (fast)."""

import json

import pytest
from tfx import v1 as tfx
from tfx.proto import transform_pb2
from tfx.types import standard_component_specs

from components import drop_in
from components import OptimizedTransform
from components.transform.config import TuningConfig
from components.transform import spec_keys
from components.types import TunedInputPipeline


def _channels():
  return dict(
      examples=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Examples),
      schema=tfx.dsl.Channel(type=tfx.types.standard_artifacts.Schema))


@pytest.mark.parametrize('values, message', [
    ({'time_budget_s': -1}, r'time_budget_s must be a positive number.*-1'),
    ({'time_budget_s': 0}, r'time_budget_s must be a positive'),
    ({'ram_budget_bytes': -5}, r'ram_budget_bytes must be a positive int.*-5'),
    ({'ram_budget_bytes': 0}, r'ram_budget_bytes must be a positive int'),
    ({'batch_size': 0}, r'batch_size must be a positive int or None, got 0'),
    ({'trainer_batch_size': -1}, r'trainer_batch_size must be a positive int'),
    ({'trainer_examples': 0}, r'trainer_examples must be a positive int or '
     'None, got 0'),
    ({'max_spend_fraction': 0}, r'max_spend_fraction must be a number in '
     r'\(0, 1\], got 0'),
    ({'max_spend_fraction': 1.5}, r'max_spend_fraction .*, got 1.5'),
    ({'max_spend_fraction': float('nan')}, r'max_spend_fraction .*, got nan'),
    ({'input_bound_ratio': 0}, r'input_bound_ratio must be a positive number'),
    ({'early_stop': 1}, r'early_stop must be a bool'),
    ({'reuse': 'no'}, r'reuse must be a bool'),
    ({'num_output_shards': -2}, r'num_output_shards must be an int >= 0'),
    ({'max_candidates': 0}, r'max_candidates must be a positive int'),
    ({'measure_seconds': 20}, r'measure_seconds must be positive and at most'),
    ({'cache': 'ssd'},
     r"cache must be one of \('auto', 'memory', 'disk', 'none'\), got 'ssd'"),
    ({'cache': 'disk'}, r"cache='disk' needs cache_dir"),
    ({'materialize': 'never'},
     r"materialize must be one of \('auto', 'always', 'on_the_fly'\)"),
    ({'allow_nondeterministic': 'yes'}, r'allow_nondeterministic must be a'),
    ({'tune_split': ''}, r'tune_split must be a split name'),
    ({'cache_size': 1}, r"Unknown tuning option\(s\) \['cache_size'\]"),
    # Non-finite numbers pass `<= 0` checks, so each is named on its own.
    ({'time_budget_s': float('nan')}, r'time_budget_s .*\(finite\), got nan'),
    ({'time_budget_s': float('inf')}, r'time_budget_s .*\(finite\), got inf'),
    ({'measure_seconds': float('nan')}, r'measure_seconds .*, got nan'),
    ({'input_bound_ratio': float('nan')}, r'input_bound_ratio .*, got nan'),
    ({'input_bound_ratio': float('inf')}, r'input_bound_ratio .*, got inf'),
    ({'time_budget_s': '8'}, r"time_budget_s .*, got '8'"),
    ({'measure_seconds': True}, r'measure_seconds .*, got True'),
    ({'ram_budget_bytes': 1e9}, r'ram_budget_bytes must be a positive int'),
    ({'batch_size': float('nan')}, r'batch_size must be a positive int'),
    ({'num_output_shards': 4.0}, r'num_output_shards must be an int >= 0'),
    ({'max_candidates': float('inf')}, r'max_candidates must be a positive'),
    ({'cache_dir': 7}, r'cache_dir must be a local folder path .* got 7'),
    ({'cache_dir': ''}, r"cache_dir must be a local folder path .* got ''"),
    ({'cache': None}, r'cache must be one of'),
    ({'materialize': 1}, r'materialize must be one of'),
    ({'tune_split': 3}, r'tune_split must be a split name'),
])
def test_bad_tuning_fails_at_construction(values, message):
  with pytest.raises(ValueError, match=message):
    TuningConfig.from_dict(values)
  with pytest.raises(ValueError, match=message):
    TuningConfig.from_json(json.dumps(values))
  with pytest.raises(ValueError, match=message):
    OptimizedTransform(**_channels(), module_file='m.py', tuning=values)


@pytest.mark.parametrize('analyze, transform, message', [
    ([], ['train'], r'splits_config.analyze is empty'),
    (['train'], ['eval'], r"tune_split='train' is not transformed.*\['eval'\]"),
])
def test_bad_splits_fail_at_construction(analyze, transform, message):
  with pytest.raises(ValueError, match=message):
    OptimizedTransform(
        **_channels(), module_file='m.py',
        splits_config=transform_pb2.SplitsConfig(analyze=analyze,
                                                 transform=transform),
        tuning={'tune_split': 'train'})


def test_default_tune_split_follows_the_splits_config():
  """Any splits_config the stock Transform takes is taken (drop-in)."""
  assert TuningConfig().split_to_tune(['train', 'eval']) == 'train'
  assert TuningConfig().split_to_tune(['eval', 'test']) == 'eval'
  assert TuningConfig().split_to_tune([]) is None
  assert TuningConfig(tune_split='test').split_to_tune(['train']) is None
  for transform in (['eval'], []):
    OptimizedTransform(**_channels(), module_file='m.py',
                       splits_config=transform_pb2.SplitsConfig(
                           analyze=['train'], transform=transform))


def test_materialize_false_cannot_read_materialized():
  with pytest.raises(ValueError, match="materialize='always' needs"):
    OptimizedTransform(**_channels(), module_file='m.py', materialize=False,
                       tuning={'materialize': 'always'})


def test_stock_argument_checks_still_apply():
  with pytest.raises(ValueError, match='Exactly one of'):
    OptimizedTransform(**_channels())


def test_tuning_accepts_dict_json_and_dataclass():
  config = TuningConfig(time_budget_s=5, cache='none')
  for value in (config, config.to_dict(), config.to_json()):
    assert TuningConfig.parse(value) == config
  assert TuningConfig.parse(None) == TuningConfig()
  with pytest.raises(ValueError, match='tuning must be a TuningConfig'):
    TuningConfig.parse(5)


def test_same_spec_as_stock_transform_plus_tuning():
  kwargs = dict(
      module_file='m.py',
      splits_config=transform_pb2.SplitsConfig(analyze=['train'],
                                               transform=['train', 'eval']),
      custom_config={'k': 1},
      disable_statistics=True)
  stock = tfx.components.Transform(**_channels(), **kwargs)
  ours = OptimizedTransform(**_channels(), **kwargs,
                            tuning={'time_budget_s': 4.0})
  # The names that pipelines, MLMD records and the Kubeflow IR use.
  assert set(ours.outputs) == set(stock.outputs) | {'tuned_input_pipeline'}
  assert set(ours.exec_properties) == set(stock.exec_properties) | {
      'tuning', 'component_class'}
  assert ours.outputs[spec_keys.TUNED_INPUT_PIPELINE_KEY].type is (
      TunedInputPipeline)
  assert set(ours.inputs) == set(stock.inputs)
  tuning = json.loads(ours.exec_properties.pop(spec_keys.TUNING_KEY))
  # Recorded under the stock execution type; this says which class ran.
  assert ours.exec_properties.pop(drop_in.COMPONENT_CLASS_KEY) == (
      'components.transform.component.OptimizedTransform')
  assert ours.exec_properties == stock.exec_properties
  assert tuning['time_budget_s'] == 4.0
  assert TuningConfig.from_dict(tuning).cache == 'auto'
  # The output channels belong to our component.
  assert ours.outputs[standard_component_specs.TRANSFORMED_EXAMPLES_KEY
                     ].producer_component_id == ours.id


def test_help_shows_the_docstring():
  assert TuningConfig.__doc__.startswith(
      "How OptimizedTransform measures and tunes the trainer's input")
  assert 'early_stop:' in TuningConfig.__doc__


def test_measured_batch_is_the_trainers_and_a_mismatch_is_named():
  assert TuningConfig(trainer_batch_size=32).measure_batch_size == 32
  assert TuningConfig(trainer_batch_size=32).batch_mismatch() is None
  assert TuningConfig(batch_size=64, trainer_batch_size=64).batch_mismatch() \
      is None
  assert TuningConfig(batch_size=256, trainer_batch_size=32).batch_mismatch() \
      == 'measured at batch 256 but the trainer reads 32 examples per step'
  unknown = TuningConfig()
  assert unknown.measure_batch_size == 256
  assert "trainer's batch is unknown" in unknown.batch_mismatch()
  # An explicit batch without a trainer batch is the user's choice.
  assert TuningConfig(batch_size=64).batch_mismatch() is None


@pytest.mark.parametrize('distribution, batch', [
    ({}, 32),  # The default per-replica batch, one device.
    ({'global_batch_size': 256}, 256),
    ({'strategy': 'mirrored', 'logical_cpu_devices': 2,
      'global_batch_size': 64, 'gradient_accumulation_steps': 2}, 64),
])
def test_hpm_factories_pass_the_trainer_batch_into_tuning(distribution,
                                                          batch):
  from pipelines import taxi_pipeline  # pylint: disable=g-import-not-at-top
  make = taxi_pipeline.hpm_factories(distribution=distribution)[
      'make_transform']
  transform = make(_channels()['examples'], _channels()['schema'], 'm.py')
  tuning = TuningConfig.from_json(
      transform.exec_properties[spec_keys.TUNING_KEY])
  assert tuning.trainer_batch_size == batch
  assert tuning.measure_batch_size == batch and tuning.batch_mismatch() is None
  assert tuning.trainer_examples is None  # The train steps are not known.
  make = taxi_pipeline.hpm_factories(distribution=distribution,
                                     train_steps=1000)['make_transform']
  assert TuningConfig.from_json(make(
      _channels()['examples'], _channels()['schema'],
      'm.py').exec_properties[spec_keys.TUNING_KEY]).trainer_examples == (
          1000 * batch)
  # A measurement batch of the user's that differs is kept, and flagged.
  make = taxi_pipeline.hpm_factories(distribution=distribution,
                                     tuning={'batch_size': 512})[
                                         'make_transform']
  tuning = TuningConfig.from_json(make(
      _channels()['examples'], _channels()['schema'],
      'm.py').exec_properties[spec_keys.TUNING_KEY])
  assert tuning.measure_batch_size == 512
  assert tuning.batch_mismatch() == (
      f'measured at batch 512 but the trainer reads {batch} examples per step')
