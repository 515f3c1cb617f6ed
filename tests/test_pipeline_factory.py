"""The taxi pipeline factory wires every component, stock or ours."""

import json
import os

import pytest
from tfx import v1 as tfx
from tfx.types import standard_component_specs

from pipelines import data
from pipelines import taxi_pipeline

EXPECTED_NODES = [
    'CsvExampleGen', 'StatisticsGen', 'SchemaGen', 'ExampleValidator',
    'Transform', 'Trainer', 'latest_blessed_model_resolver', 'Evaluator',
    'Pusher'
]


def _build(tmp_path, **kwargs):
  return taxi_pipeline.create_pipeline(
      pipeline_name='factory_test',
      pipeline_root=str(tmp_path / 'root'),
      serving_model_dir=str(tmp_path / 'serving'),
      **kwargs)


def test_stock_pipeline_has_every_component_in_order(tmp_path):
  pipeline = _build(tmp_path)
  ids = [c.id for c in pipeline.components]
  assert sorted(ids) == sorted(EXPECTED_NODES)
  # Topological: every upstream node precedes its downstream nodes.
  position = {node_id: i for i, node_id in enumerate(ids)}
  for component in pipeline.components:
    for upstream in component.upstream_nodes:
      assert position[upstream.id] < position[component.id]
  trainer = next(c for c in pipeline.components if c.id == 'Trainer')
  assert isinstance(trainer, tfx.components.Trainer)
  assert pipeline.metadata_connection_config.sqlite.filename_uri == str(
      tmp_path / 'root' / 'metadata.db')


def test_defaults_point_at_the_data_inside_the_tfx_wheel(tmp_path):
  pipeline = _build(tmp_path)
  example_gen = pipeline.components[0]
  input_base = example_gen.exec_properties[
      standard_component_specs.INPUT_BASE_KEY]
  assert input_base == data.default_data_root()
  assert os.path.isfile(os.path.join(input_base, 'data.csv'))
  transform = next(c for c in pipeline.components if c.id == 'Transform')
  assert transform.exec_properties[
      standard_component_specs.MODULE_FILE_KEY] == data.default_module_file()


def test_module_name_instead_of_file_uses_function_paths(tmp_path):
  pipeline = _build(tmp_path, module_file='pipelines.taxi_module')
  by_id = {c.id: c for c in pipeline.components}
  assert by_id['Transform'].exec_properties[
      standard_component_specs.PREPROCESSING_FN_KEY] == (
          'pipelines.taxi_module.preprocessing_fn')
  assert by_id['Trainer'].exec_properties[
      standard_component_specs.RUN_FN_KEY] == 'pipelines.taxi_module.run_fn'


def test_factories_replace_transform_and_trainer(tmp_path):
  seen = {}

  def make_trainer(inputs):
    seen['inputs'] = inputs
    return taxi_pipeline.stock_trainer(inputs)

  _build(tmp_path, make_trainer=make_trainer, train_steps=7, eval_steps=3)
  inputs = seen['inputs']
  assert (inputs.train_steps, inputs.eval_steps) == (7, 3)
  assert standard_component_specs.TRANSFORM_GRAPH_KEY in (
      inputs.transform_outputs)
  assert inputs.examples is inputs.transform_outputs[
      standard_component_specs.TRANSFORMED_EXAMPLES_KEY]


def test_write_sample_keeps_header_and_row_count(tmp_path):
  out = data.write_sample(data.default_data_root(), str(tmp_path), 25)
  with open(os.path.join(out, 'data.csv')) as f:
    lines = f.read().splitlines()
  assert len(lines) == 26
  assert lines[0].startswith('pickup_community_area,fare,')


@pytest.mark.parametrize('threshold', [0.0, 0.6])
def test_eval_config_threshold(threshold):
  config = taxi_pipeline.eval_config(threshold)
  metric = config.metrics_specs[0].metrics[0]
  assert metric.class_name == 'BinaryAccuracy'
  assert metric.threshold.value_threshold.lower_bound.value == threshold
  assert metric.threshold.HasField('change_threshold')


def test_without_baseline_each_model_is_judged_on_the_bound_alone(tmp_path):
  pipeline = _build(tmp_path, compare_to_baseline=False)
  ids = [c.id for c in pipeline.components]
  assert 'latest_blessed_model_resolver' not in ids
  evaluator = next(c for c in pipeline.components if c.id == 'Evaluator')
  assert standard_component_specs.BASELINE_MODEL_KEY not in evaluator.inputs
  config = json.loads(
      evaluator.exec_properties[standard_component_specs.EVAL_CONFIG_KEY])
  threshold = config['metrics_specs'][0]['metrics'][0]['threshold']
  assert 'change_threshold' not in threshold
  assert threshold['value_threshold']['lower_bound'] == 0.6


def test_module_file_builds_into_a_wheel_as_tfx_does_at_compile_time(tmp_path):
  # LocalDagRunner and KubeflowV2DagRunner package the module file with
  # bdist_wheel; a venv without the `wheel` package fails every pipeline run.
  from tfx.components.util import udf_utils
  wheel_path, module_path = udf_utils.package_user_module_file(
      'WheelCheck', data.default_module_file(), str(tmp_path))
  assert wheel_path.endswith('.whl') and os.path.exists(wheel_path)
  assert module_path.startswith('taxi_module@')
