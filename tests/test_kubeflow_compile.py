"""The pipeline compiles for Kubeflow Pipelines v2 and the spec parses."""

from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2
import pytest

from kubeflow import runner

STOCK_EXECUTORS = {
    'CsvExampleGen', 'StatisticsGen', 'SchemaGen', 'ExampleValidator',
    'Transform', 'Trainer', 'Evaluator', 'Pusher'
}


def _compile(tmp_path, stock, gpipe_stages=0):
  path = runner.compile_pipeline(
      output=str(tmp_path / 'pipeline.json'),
      image='example.com/tfx-hpm:test',
      pipeline_root=str(tmp_path / 'root'),
      data_root='/tfx-hpm/data/taxi',
      module='pipelines.taxi_module',
      serving_model_dir=str(tmp_path / 'serving'),
      stock=stock, gpipe_stages=gpipe_stages)
  with open(path) as f:
    job = json_format.Parse(f.read(), pipeline_spec_pb2.PipelineJob(),
                            ignore_unknown_fields=False)
  spec = json_format.ParseDict(
      json_format.MessageToDict(job.pipeline_spec),
      pipeline_spec_pb2.PipelineSpec())
  return job, spec


@pytest.mark.parametrize('stock', [True, False], ids=['stock', 'hpm'])
def test_compiled_spec_is_a_pipeline_job_with_every_component(tmp_path, stock):
  job, spec = _compile(tmp_path, stock)
  tasks = set(spec.root.dag.tasks)
  assert STOCK_EXECUTORS <= tasks, tasks
  for name in STOCK_EXECUTORS:
    executor = spec.deployment_spec['executors'][f'{name}_executor']
    assert executor['container']['image'] == 'example.com/tfx-hpm:test'
  assert job.runtime_config.gcs_output_directory == str(tmp_path / 'root')
  if not stock:
    trainer = spec.components['Trainer']
    assert 'tuned_input_pipeline' in trainer.input_definitions.artifacts
    executor = json_format.MessageToJson(
        spec.deployment_spec['executors']['Trainer_executor'])
    assert 'components.trainer.executor' in executor
    assert 'tfx_hpm.TunedInputPipeline' in json_format.MessageToJson(
        trainer.input_definitions)


def test_pipeline_with_gpipe_partitioner_compiles(tmp_path):
  _, spec = _compile(tmp_path, stock=False, gpipe_stages=2)
  assert {'GPipePartitioner', 'Trainer'} <= set(spec.root.dag.tasks)
  trainer_inputs = spec.root.dag.tasks['Trainer'].inputs.artifacts
  assert trainer_inputs['partition_plan'].task_output_artifact.producer_task \
      == 'GPipePartitioner'
