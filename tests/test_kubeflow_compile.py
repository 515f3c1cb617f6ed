"""The pipeline compiles for Kubeflow Pipelines v2 (spec 2.1) and the spec
carries the image, entrypoint, resources, Beam args and checkpoint root."""

import json
import os
import re
import subprocess

from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2
import pytest

from components.trainer import executor as trainer_executor
from components.trainer import spec_keys as trainer_keys
from kubeflow import compiler
from kubeflow import resources
from kubeflow import runner
from tests.support import lanes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STOCK_EXECUTORS = {
    'CsvExampleGen', 'StatisticsGen', 'SchemaGen', 'ExampleValidator',
    'Transform', 'Trainer', 'Evaluator', 'Pusher'
}
BEAM_TASKS = {'CsvExampleGen', 'StatisticsGen', 'Transform', 'Evaluator'}


def _parse(path):
  with open(path) as f:
    text = f.read()
  job = json_format.Parse(text, pipeline_spec_pb2.PipelineJob(),
                          ignore_unknown_fields=False)
  spec = json_format.ParseDict(
      json_format.MessageToDict(job.pipeline_spec),
      pipeline_spec_pb2.PipelineSpec())
  return job, spec, json.loads(text)['pipelineSpec']


def _compile(tmp_path, stock, gpipe_stages=0):
  path = compiler.compile_pipeline(
      output=str(tmp_path / 'pipeline.json'),
      image='example.com/tfx-hpm:test',
      pipeline_root=str(tmp_path / 'root'),
      data_root='/tfx-hpm/data/taxi',
      module='pipelines.taxi_module',
      serving_model_dir=str(tmp_path / 'serving'),
      stock=stock, gpipe_stages=gpipe_stages)
  return _parse(path)


def _containers(raw_spec):
  return {name[:-len('_executor')]: executor['container']
          for name, executor in raw_spec['deploymentSpec']['executors'].items()
          if 'container' in executor}


def _fault_tolerance(raw_spec):
  parameter = raw_spec['root']['dag']['tasks']['Trainer']['inputs'][
      'parameters'][trainer_keys.FAULT_TOLERANCE_KEY]
  return json.loads(parameter['runtimeValue']['constant'])


@pytest.mark.parametrize('stock', [True, False], ids=['stock', 'hpm'])
def test_compiled_spec_is_a_pipeline_job_with_every_component(tmp_path, stock):
  job, spec, raw = _compile(tmp_path, stock)
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
    # The trainer keys it by pipeline, node and fingerprint itself; the
    # task's env tells it the pipeline and node, which TFX's KFP entrypoint
    # leaves out of its context.
    assert _fault_tolerance(raw)['backup_root'] == os.path.join(
        str(tmp_path / 'root'), '_hpm_checkpoints')
    assert _containers(raw)['Trainer']['env'] == [
        {'name': trainer_executor.PIPELINE_NAME_ENV, 'value': 'taxi-hpm'},
        {'name': trainer_executor.NODE_ID_ENV, 'value': 'Trainer'}]
  # Pipeline spec 2.1, the form open-source KFP 2.x runs: constants as
  # `runtimeValue.constant` (2.0's `constantValue` fails in KFP's driver)
  # and the inputs spec for TFX's entrypoint (it reads `parameterValues`
  # only with it).
  assert raw['schemaVersion'] == '2.1.0'
  assert 'constantValue' not in json.dumps(raw)
  for name, container in _containers(raw).items():
    assert container['command'] == list(compiler.ENTRYPOINT_COMMAND), name
    args = container['args']
    assert args[args.index('--json_serialized_invocation_args') + 1] == '{{$}}'
    inputs_spec = json_format.Parse(
        args[args.index('--json_serialized_inputs_spec_args') + 1],
        pipeline_spec_pb2.ComponentInputsSpec())
    assert set(inputs_spec.parameters) == set(
        spec.components[name].input_definitions.parameters), name
    assert args[-2:] == list(compiler.DEFAULT_BEAM_PIPELINE_ARGS), name
    assert 'resources' not in container, name
    if stock or name != 'Trainer':
      assert 'env' not in container, name
  hook = _containers(raw)['CsvExampleGen']['lifecycle']['preCacheCheck']
  assert '--json_serialized_inputs_spec_args' in hook['args']


def test_pipeline_with_gpipe_partitioner_compiles(tmp_path):
  _, spec, _ = _compile(tmp_path, stock=False, gpipe_stages=2)
  assert {'GPipePartitioner', 'Trainer'} <= set(spec.root.dag.tasks)
  trainer_inputs = spec.root.dag.tasks['Trainer'].inputs.artifacts
  plan = trainer_inputs[trainer_keys.PARTITION_PLAN_KEY]
  assert plan.task_output_artifact.producer_task == 'GPipePartitioner'


def test_flags_set_resources_beam_args_and_checkpoint_root(tmp_path, capsys):
  output = tmp_path / 'flags.json'
  beam_args = ['--runner=DataflowRunner', '--project=my-project',
               '--region=us-central1',
               '--temp_location=gs://my-bucket/tmp']
  assert runner.main([
      '--output', str(output), '--pipeline-root', 'gs://bucket/root',
      '--trainer-cpu', '8', '--trainer-memory', '32Gi',
      '--trainer-gpu-count', '2', '--beam-cpu', '500m', '--beam-memory', '4G',
      '--checkpoint-root', 'gs://bucket/ckpt',
      *[f'--beam-pipeline-arg={a}' for a in beam_args]]) == 0
  assert f'Wrote {output}' in capsys.readouterr().out
  _, spec, raw = _parse(str(output))
  containers = _containers(raw)
  trainer = containers['Trainer']['resources']
  assert trainer['cpuRequest'] == trainer['cpuLimit'] == 8
  assert trainer['memoryRequest'] == trainer['memoryLimit'] == pytest.approx(
      32 * 2**30 / 1e9)
  assert trainer['accelerator'] == {'type': 'nvidia.com/gpu', 'count': '2'}
  for name in BEAM_TASKS:  # CsvExampleGen's is added after TFX's compile.
    assert containers[name]['resources'] == {
        'cpuRequest': 0.5, 'cpuLimit': 0.5, 'memoryRequest': 4.0,
        'memoryLimit': 4.0}, name
  for name in set(containers) - BEAM_TASKS - {'Trainer'}:
    assert 'resources' not in containers[name], name
  for name, container in containers.items():
    assert container['args'][-len(beam_args):] == beam_args, name
    assert not set(compiler.DEFAULT_BEAM_PIPELINE_ARGS) & set(
        container['args']), name
  assert _fault_tolerance(raw)['backup_root'] == 'gs://bucket/ckpt'
  assert raw['schemaVersion'] == '2.1.0'
  # Proto form as KFP reads it.
  trainer_resources = json_format.ParseDict(
      containers['Trainer']['resources'],
      pipeline_spec_pb2.PipelineDeploymentConfig.PipelineContainerSpec
      .ResourceSpec())
  assert trainer_resources.accelerator.count == 2
  assert set(spec.root.dag.tasks) >= STOCK_EXECUTORS


def test_ray_address_sends_the_trainer_to_a_ray_cluster(tmp_path):
  output = tmp_path / 'ray.json'
  assert runner.main([
      '--output', str(output), '--pipeline-root', 'gs://bucket/root',
      '--ray-address', 'ray://taxi-ray-head-svc:10001',
      '--distribution', '{"strategy": "multi_worker_mirrored", '
      '"num_workers": 2, "min_workers": 1}']) == 0
  _, _, raw = _parse(str(output))
  parameter = raw['root']['dag']['tasks']['Trainer']['inputs']['parameters'][
      trainer_keys.DISTRIBUTION_KEY]
  distribution = json.loads(parameter['runtimeValue']['constant'])
  assert distribution['launcher'] == 'ray'
  assert distribution['ray']['address'] == 'ray://taxi-ray-head-svc:10001'
  assert distribution['num_workers'] == 2
  # Elastic on the Ray cluster: the Trainer task gets min_workers as given.
  assert distribution['min_workers'] == 1


def test_no_baseline_compiles_without_resolver_tasks(tmp_path):
  """Open-source KFP 2.x refuses `resolver` executors; --no-baseline has
  none."""
  output = tmp_path / 'no_baseline.json'
  assert runner.main(['--output', str(output), '--no-baseline']) == 0
  _, spec, raw = _parse(str(output))
  kinds = {name: next(iter(executor))
           for name, executor in raw['deploymentSpec']['executors'].items()}
  assert set(kinds.values()) == {'container'}, kinds
  assert STOCK_EXECUTORS == set(spec.root.dag.tasks)
  assert 'baseline_model' not in spec.root.dag.tasks['Evaluator'].inputs \
      .artifacts
  eval_config = spec.root.dag.tasks['Evaluator'].inputs.parameters[
      'eval_config'].runtime_value.constant.string_value
  assert 'change_threshold' not in eval_config
  _, default_spec, _ = _compile(tmp_path, stock=False)
  assert {'latest_blessed_model_resolver-model-blessing-resolver',
          'latest_blessed_model_resolver-model-resolver'} <= set(
              default_spec.root.dag.tasks)


@pytest.mark.parametrize('flags, message', [
    (['--trainer-cpu', '0'], 'more than 0 CPUs'),
    (['--trainer-cpu', 'four'], 'expected CPUs'),
    (['--trainer-memory', '16Q'], 'expected a size'),
    (['--beam-memory', '0G'], 'more than 0 bytes'),
    (['--trainer-gpu-type', 'nvidia.com/gpu'], 'needs --trainer-gpu-count'),
    (['--trainer-gpu-count', '-1'], '>= 0'),
    (['--beam-pipeline-arg', 'runner'], 'must be a flag'),
    (['--checkpoint-root', ' '], 'non-empty'),
    (['--stock', '--checkpoint-root', 'gs://b/c'], 'HighPerfTrainer setting'),
    (['--distribution', '[1]'], 'JSON object'),
    (['--distribution', '{'], 'Expecting'),
    (['--stock', '--ray-address', 'ray://head:10001'],
     'HighPerfTrainer setting'),
    (['--ray-address', 'ray://head:10001', '--distribution',
      '{"launcher": "local"}'], "sets launcher='local'"),
    (['--ray-address', 'ray://head:10001', '--distribution',
      '{"ray": {"placement": "STRICT"}}'], "ray.placement='STRICT'"),
    (['--ray-address', 'ray://head:10001', '--distribution',
      '{"strategy": "multi_worker_mirrored", "num_workers": 2, '
      '"min_workers": 3}'], 'min_workers=3 must be an integer in [1, '
     'num_workers=2]'),
    (['--distribution', '{"strategy": "multi_worker_mirrored", '
      '"num_workers": 2, "min_workers": 1}'],
     "a launcher on a Ray cluster ('ray',)"),
], ids=lambda v: v if isinstance(v, str) else ' '.join(v))
def test_bad_flags_fail_before_compiling(tmp_path, capsys, flags, message):
  output = tmp_path / 'never.json'
  with pytest.raises(SystemExit) as exit_info:
    runner.main(['--output', str(output), *flags])
  assert exit_info.value.code == 2
  assert message in capsys.readouterr().err
  assert not output.exists()


def test_resource_units():
  assert resources.parse_cpu('500m', 'f') == 0.5
  assert resources.parse_cpu('2', 'f') == 2.0
  assert resources.parse_memory('16', 'f') == 16.0
  assert resources.parse_memory('512M', 'f') == 0.512
  assert resources.parse_memory('1Gi', 'f') == 2**30 / 1e9
  with pytest.raises(ValueError, match='GPU count needs a GPU type'):
    resources.Resources(gpu_count=1)
  with pytest.raises(ValueError, match='without a GPU count'):
    resources.Resources(gpu_type='nvidia.com/gpu')


def test_default_image_is_what_make_image_builds():
  with open(os.path.join(REPO, 'Makefile')) as f:
    makefile = f.read()
  (image,) = re.findall(r'^IMAGE \?= (\S+)$', makefile, re.M)
  assert image == compiler.DEFAULT_IMAGE
  assert re.search(r'^image:', makefile, re.M)
  assert runner._parser().parse_args([]).image == compiler.DEFAULT_IMAGE  # pylint: disable=protected-access


def test_dockerfile_installs_the_lock_the_package_and_the_data():
  """Static check of kubeflow/Dockerfile (no image is built here)."""
  with open(os.path.join(REPO, 'kubeflow', 'Dockerfile')) as f:
    lines = [line.strip() for line in f.read().replace('\\\n', ' ').split(
        '\n') if line.strip() and not line.strip().startswith('#')]
  instructions = [line.split(None, 1) for line in lines]
  froms = [args for op, args in instructions if op == 'FROM']
  assert froms[-1] == '${BASE_IMAGE}', froms
  args = dict(arg.split('=', 1) for op, arg in instructions if op == 'ARG')
  # The defaults are the TFX 1.16 lane's.
  assert args['BASE_IMAGE'] == 'python:3.10-slim'
  assert args['LOCK'] == 'requirements-tfx1.16.lock'
  assert args['BEAM_VERSION'] == lanes.pins('1.16')['apache-beam']
  text = '\n'.join(lines)
  lock = text.index('COPY ${LOCK} ./requirements.lock')
  deps = text.index('pip install --no-cache-dir --no-deps -r requirements.lock')
  package = text.index(
      'pip install --no-cache-dir --no-deps --no-build-isolation')
  assert lock < deps < package
  assert any(op == 'ENV' and 'TF_USE_LEGACY_KERAS=1' in args.split()
             for op, args in instructions)
  assert compiler.IMAGE_DATA_ROOT in text
  # Everything setup.py packages is copied before the package is installed.
  for name in ('setup.py', 'components', 'pipelines', 'kubeflow',
               'benchmarks'):
    assert re.search(rf'^COPY .*\b{name}\b', text[:package], re.M), name
  # Each lock pins what the package needs at build time (no isolation).
  for lane in lanes.LANES:
    assert {'setuptools', 'wheel'} <= set(lanes.pins(lane))


@pytest.mark.parametrize('lane, python, base', [
    ('1.16', '3.10', 'python:3.10-slim'),
    # The 1.21 wheels need glibc >= 2.38: Debian 13.
    ('1.21', '3.11', 'python:3.11-slim-trixie')])
def test_make_image_builds_each_lanes_image(lane, python, base):
  """`make image TFX=...` passes the lane's Python, base, lock and Beam."""
  proc = subprocess.run(
      ['make', '-n', 'image', f'TFX={lane}', 'CONTAINER_TOOL=docker'],
      capture_output=True, text=True, timeout=60, cwd=REPO, check=True)
  [build] = [line for line in proc.stdout.splitlines()
             if line.startswith('docker build')]
  assert f'--build-arg PYTHON_VERSION={python}' in build
  assert f'--build-arg BASE_IMAGE={base}' in build
  assert f'--build-arg LOCK=requirements-tfx{lane}.lock' in build
  assert f"grep '^apache-beam==' requirements-tfx{lane}.lock" in build
