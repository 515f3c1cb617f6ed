"""The compiled KFP v2 pipeline runs the way a KFP backend runs it.

The slow test compiles the tfx-hpm taxi pipeline and executes it with
tests/support/kfp_backend.py (the OSS KFP driver + launcher, emulated): each
task's container command as its own process, artifacts under a gs:// pipeline
root on the local GCS emulator. The fast tests pin down the harness itself and
the container entrypoint (kubeflow/entrypoint.py) on what KFP hands it.
"""

import json
import os
import re
import subprocess
import sys
import uuid

from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2 as pb
import pytest
from tfx.types import standard_component_specs

from kubeflow import entrypoint
from tests.support import kfp_backend

# The slow run, on the 2000-row sample: predicting "no tip" for everyone
# scores 0.767 on its eval split (686 examples); the model reached 0.784 after
# 200 steps and 0.797 after 600 (harness runs with a local root).
TRAIN_STEPS = 600
EVAL_STEPS = 50
ACCURACY_BOUND = 0.78

_EXAMPLES_SCHEMA = ('title: tfx.Examples\ntype: object\nproperties:\n  span:\n'
                    '    type: integer\n  version:\n    type: integer\n'
                    '  split_names:\n    type: string\n')


# --- The entrypoint on KFP's ExecutorInput -----------------------------------


def _oss_executor_input(uri='gs://b/root/p/run/CsvExampleGen/examples'):
  """An input artifact as OSS KFP's driver passes it: rebuilt from MLMD,
  named by its id, typed `{instanceSchema: ""}`."""
  return json.dumps({
      'inputs': {
          'artifacts': {'examples': {'artifacts': [{
              'name': '7', 'uri': uri, 'type': {'instanceSchema': ''},
              'metadata': {'split_names': '["train", "eval"]', 'span': 0.0,
                           'display_name': 'examples'}}]}},
          'parameterValues': {'exclude_splits': '[]'}},
      'outputs': {'outputFile': '/tmp/kfp_outputs/output_metadata.json'}})


def _inputs_spec():
  return json.dumps({
      'artifacts': {'examples': {'artifactType': {
          'instanceSchema': _EXAMPLES_SCHEMA}}},
      'parameters': {'exclude_splits': {'parameterType': 'STRING'}}})


def test_tfx_entrypoint_rejects_oss_input_artifacts_and_ours_repairs_them():
  from tfx.orchestration.kubeflow.v2.container import (  # pylint: disable=g-import-not-at-top
      kubeflow_v2_entrypoint_utils as utils)
  raw = json_format.Parse(_oss_executor_input(), pb.ExecutorInput())
  # tensorflow/tfx#7768: TFX 1.16 cannot take an untyped artifact.
  with pytest.raises(AttributeError):
    utils.parse_raw_artifact_dict(raw.inputs.artifacts)

  repaired = json_format.Parse(
      entrypoint.repair_executor_input(_oss_executor_input(), _inputs_spec()),
      pb.ExecutorInput())
  (examples,) = utils.parse_raw_artifact_dict(
      repaired.inputs.artifacts)['examples']
  assert type(examples).__name__ == 'Examples'
  assert examples.uri == 'gs://b/root/p/run/CsvExampleGen/examples'
  assert examples.split_names == '["train", "eval"]'
  assert repaired.inputs.parameter_values['exclude_splits'].string_value == '[]'


def test_entrypoint_leaves_typed_artifacts_and_needs_the_inputs_spec():
  typed = json.loads(_oss_executor_input())
  typed['inputs']['artifacts']['examples']['artifacts'][0]['type'] = {
      'schemaTitle': 'tfx.Examples'}
  assert entrypoint.repair_executor_input(json.dumps(typed), None) == \
      json.dumps(typed)
  with pytest.raises(ValueError, match='use_pipeline_spec_2_1=True'):
    entrypoint.repair_executor_input(_oss_executor_input(), None)


def test_the_backends_executor_logs_output_breaks_tfx_and_ours_drops_it():
  """KFP backend 2.16 adds `executor-logs` (system.Artifact) to every
  container task's outputs; TFX cannot import that class."""
  from tfx.orchestration.kubeflow.v2.container import (  # pylint: disable=g-import-not-at-top
      kubeflow_v2_entrypoint_utils as utils)
  executor_input = json.loads(_oss_executor_input())
  executor_input['outputs']['artifacts'] = {
      'model': {'artifacts': [{'name': 'model', 'uri': 'gs://b/t/u/model',
                               'type': {'schemaTitle': 'tfx.Model'}}]},
      'executor-logs': {'artifacts': [{
          'name': 'executor-logs', 'uri': 'gs://b/t/u/executor-logs-0',
          'type': {'schemaTitle': 'system.Artifact'}}]}}
  raw = json_format.Parse(json.dumps(executor_input), pb.ExecutorInput())
  with pytest.raises(ImportError, match='system.Artifact'):
    utils.parse_raw_artifact_dict(raw.outputs.artifacts)
  repaired = json_format.Parse(entrypoint.repair_executor_input(
      json.dumps(executor_input), _inputs_spec()), pb.ExecutorInput())
  outputs = utils.parse_raw_artifact_dict(repaired.outputs.artifacts)
  assert list(outputs) == ['model']
  assert type(outputs['model'][0]).__name__ == 'Model'


def test_entrypoint_repairs_both_flag_forms():
  argv = ['--executor_class_path', 'x.Executor',
          '--json_serialized_invocation_args', _oss_executor_input(),
          f'--json_serialized_inputs_spec_args={_inputs_spec()}',
          '--direct_num_workers=0']
  for args in (argv, [argv[0], argv[1], '='.join(argv[2:4]), *argv[4:]]):
    repaired = entrypoint.repair_argv(args)
    value = next(a for a in repaired if '"inputs"' in a).split(
        'invocation_args=')[-1]
    executor_input = json_format.Parse(value, pb.ExecutorInput())
    assert executor_input.inputs.artifacts['examples'].artifacts[
        0].type.instance_schema == _EXAMPLES_SCHEMA
    assert repaired[-1] == '--direct_num_workers=0'


def test_entrypoint_makes_project_artifact_types_importable(monkeypatch):
  from tfx.utils import import_utils  # pylint: disable=g-import-not-at-top
  from components import patches  # pylint: disable=g-import-not-at-top
  from components import types as hpm_types  # pylint: disable=g-import-not-at-top
  monkeypatch.delitem(sys.modules, 'tfx_hpm', raising=False)
  with patches.installed(patches.ARTIFACT_TYPES_BY_TITLE):
    assert import_utils.import_class_by_path(
        'tfx_hpm.TunedInputPipeline') is hpm_types.TunedInputPipeline
    assert import_utils.import_class_by_path(
        'tfx_hpm.PartitionPlan') is hpm_types.PartitionPlan
  assert 'tfx_hpm' not in sys.modules  # Gone with the last user.


def _executor_input(outputs, output_file):
  """An ExecutorInput whose outputs are {key: (schema title, uri)}."""
  return json.dumps({
      'inputs': {'parameterValues': {}},
      'outputs': {
          'artifacts': {key: {'artifacts': [{
              'name': key, 'uri': uri, 'type': {'schemaTitle': title}}]}
                        for key, (title, uri) in outputs.items()},
          'outputFile': output_file}})


def test_entrypoint_fails_on_an_unwritable_output_before_the_executor(
    tmp_path):
  """Run as the container runs it: the executor never starts."""
  blocker = tmp_path / 'not_a_folder'
  blocker.write_text('')
  model_uri = str(blocker / 'Trainer' / 'model')
  output_file = tmp_path / 'kfp_outputs' / 'output_metadata.json'
  executor_input = _executor_input(
      {'model': ('tfx.Model', model_uri),
       'model_run': ('tfx.ModelRun',
                     str(tmp_path / 'Trainer' / 'model_run'))},
      str(output_file))
  proc = subprocess.run(
      [sys.executable, '-m', 'kubeflow.entrypoint', '--executor_class_path',
       'components.trainer.executor.Executor',
       '--json_serialized_invocation_args', executor_input],
      capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode != 0
  assert (f"StorageNotWritableError: Cannot write the model output at "
          f"'{model_uri}'") in proc.stderr, proc.stderr[-3000:]
  # The storage's own error, named.
  assert 'FailedPreconditionError' in proc.stderr
  assert f'{blocker} is not a directory' in proc.stderr
  assert 'Starting executor' not in proc.stderr
  assert not output_file.exists()
  assert blocker.read_text() == ''


def test_entrypoint_probes_a_value_artifact_beside_its_file(tmp_path):
  model_uri = str(tmp_path / 'Trainer' / 'model')
  value_uri = str(tmp_path / 'Check' / 'result' / 'value')
  entrypoint.check_outputs_writable(_executor_input(
      {'model': ('tfx.Model', model_uri), 'result': ('tfx.String', value_uri)},
      str(tmp_path / 'output_metadata.json')))
  # Probed and removed; a value artifact's URI stays free for its file.
  assert os.listdir(model_uri) == []
  assert os.listdir(os.path.dirname(value_uri)) == []


# --- The harness on small jobs -----------------------------------------------

_PRODUCER = r'''
import json, os, sys
ei = json.loads(sys.argv[1])
out = ei['outputs']['artifacts']['data']['artifacts'][0]
os.makedirs(out['uri'], exist_ok=True)
with open(os.path.join(out['uri'], 'rows.txt'), 'w') as f:
  f.write(sys.argv[2])
os.makedirs(os.path.dirname(ei['outputs']['outputFile']), exist_ok=True)
with open(ei['outputs']['outputFile'], 'w') as f:
  json.dump({'artifacts': {'data': {'artifacts': [
      {'uri': out['uri'], 'metadata': {'rows': 3, 'ok': True}}]}}}, f)
'''
_CONSUMER = r'''
import json, os, sys
ei = json.loads(sys.argv[1])
out = ei['outputs']['artifacts']['seen']['artifacts'][0]
os.makedirs(out['uri'], exist_ok=True)
with open(os.path.join(out['uri'], 'input.json'), 'w') as f:
  json.dump({'executor_input': ei, 'uri_arg': sys.argv[2],
             'cwd': os.getcwd(), 'env': os.environ.get('HARNESS_ENV')}, f)
'''


def _container_job(root, producer_code=_PRODUCER):
  def component(inputs, outputs, label):
    return {
        'executorLabel': label,
        'inputDefinitions': inputs,
        'outputDefinitions': {'artifacts': {
            name: {'artifactType': {'schemaTitle': title}}
            for name, title in outputs.items()}},
    }
  return {
      'displayName': 'harness',
      'runtimeConfig': {'gcsOutputDirectory': root},
      'pipelineSpec': {
          'pipelineInfo': {'name': 'harness-test'},
          'schemaVersion': '2.1.0',
          'components': {
              'producer': component(
                  {'parameters': {'rows': {'parameterType': 'STRING'},
                                  'unused': {'parameterType': 'STRING',
                                             'defaultValue': 'dflt'}}},
                  {'data': 'system.Dataset'}, 'producer_executor'),
              'consumer': component(
                  {'artifacts': {'data': {'artifactType': {
                      'schemaTitle': 'system.Dataset'}}}},
                  {'seen': 'system.Artifact'}, 'consumer_executor'),
          },
          'deploymentSpec': {'executors': {
              'producer_executor': {'container': {
                  'image': 'x', 'command': ['python', '-c', producer_code],
                  'args': ['{{$}}', "{{$.inputs.parameters['rows']}}"]}},
              'consumer_executor': {'container': {
                  'image': 'x', 'command': ['python', '-c', _CONSUMER],
                  'args': ['{{$}}', "{{$.inputs.artifacts['data'].uri}}"],
                  'env': [{'name': 'HARNESS_ENV', 'value': 'from the spec'}]}},
          }},
          'root': {'dag': {'tasks': {
              # Listed consumer first: the order comes from the inputs.
              'consumer': {
                  'componentRef': {'name': 'consumer'},
                  'taskInfo': {'name': 'consumer'},
                  'inputs': {'artifacts': {'data': {'taskOutputArtifact': {
                      'producerTask': 'producer',
                      'outputArtifactKey': 'data'}}}}},
              'producer': {
                  'componentRef': {'name': 'producer'},
                  'taskInfo': {'name': 'producer'},
                  'inputs': {'parameters': {'rows': {
                      'runtimeValue': {'constant': '3'}}}}},
          }}},
      },
  }


def _write(tmp_path, job):
  path = tmp_path / 'job.json'
  path.write_text(json.dumps(job))
  return str(path)


def test_harness_passes_outputs_downstream_as_the_kfp_driver_does(tmp_path):
  root = str(tmp_path / 'root')
  backend = kfp_backend.KfpBackend(
      _write(tmp_path, _container_job(root)), str(tmp_path / 'work'),
      run_id='run1', echo=False)
  assert backend.task_order() == ['producer', 'consumer']
  results = backend.run()

  (data,) = results['producer'].outputs['data']
  data_uri = data.uri
  # KFP 2.16: each execution's outputs under a task root of its own.
  assert re.fullmatch(rf'{re.escape(root)}/harness-test/run1/producer/'
                      r'[0-9a-f-]{36}/data', data_uri), data_uri
  assert dict(data.metadata) == {'rows': 3.0, 'ok': True}
  with open(os.path.join(data_uri, 'rows.txt')) as f:
    assert f.read() == '3'
  producer_input = results['producer'].executor_input
  assert producer_input.inputs.parameter_values['rows'].string_value == '3'
  assert not producer_input.inputs.parameters  # KFP 2.x leaves it empty.

  (seen_artifact,) = results['consumer'].outputs['seen']
  with open(os.path.join(seen_artifact.uri, 'input.json')) as f:
    seen = json.load(f)
  # The backend's own output, beside the component's, holds the task log.
  logs = seen['executor_input']['outputs']['artifacts']['executor-logs'][
      'artifacts'][0]
  assert logs['type'] == {'schemaTitle': 'system.Artifact'}
  assert logs['uri'] == os.path.dirname(seen_artifact.uri) + (
      '/executor-logs-0')
  (producer_logs,) = results['producer'].outputs['executor-logs']
  with open(producer_logs.uri) as f:
    assert f.read().startswith('$ ' + sys.executable)
  (received,) = seen['executor_input']['inputs']['artifacts']['data'][
      'artifacts']
  # As the driver rebuilds it from MLMD: id as name, custom properties as
  # metadata (a bool stored as int, display_name added), no schema.
  assert received == {
      'name': '1', 'uri': data_uri, 'type': {'instanceSchema': ''},
      'metadata': {'rows': 3.0, 'ok': 1.0, 'display_name': 'data'}}
  assert seen['uri_arg'] == data_uri
  assert seen['env'] == 'from the spec'
  assert seen['cwd'] == os.path.join(str(tmp_path / 'work'), 'run1',
                                     'consumer')
  assert seen['executor_input']['outputs']['outputFile'] == os.path.join(
      seen['cwd'], 'tmp', 'kfp_outputs', 'output_metadata.json')
  assert results['consumer'].argv[0] == sys.executable


def test_harness_imports_an_artifact_for_its_consumer(tmp_path):
  job = _container_job(str(tmp_path / 'root'))
  spec = job['pipelineSpec']
  spec['components']['producer'] = {
      'executorLabel': 'producer_executor',
      'outputDefinitions': {'artifacts': {'data': {'artifactType': {
          'schemaTitle': 'system.Dataset'}}}}}
  spec['deploymentSpec']['executors']['producer_executor'] = {'importer': {
      'artifactUri': {'constant': 'gs://elsewhere/data'},
      'typeSchema': {'schemaTitle': 'system.Dataset'},
      'metadata': {'source': 'outside'}}}
  del spec['root']['dag']['tasks']['producer']['inputs']
  store = kfp_backend.ArtifactStore()
  for run_id in ('run1', 'run2'):
    results = kfp_backend.KfpBackend(
        _write(tmp_path, job), str(tmp_path / 'work'), run_id=run_id,
        store=store, echo=False).run()
    assert results['producer'].kind == 'importer'
    (seen,) = results['consumer'].outputs['seen']
    with open(os.path.join(seen.uri, 'input.json')) as f:
      (received,) = json.load(f)['executor_input']['inputs']['artifacts'][
          'data']['artifacts']
    assert received['uri'] == 'gs://elsewhere/data'
    # The importer records no display_name; KFP 2.16 records the store
    # session of a bucket URI.
    assert received['metadata'] == {
        'source': 'outside',
        'store_session_info': '{"Provider":"gs","Params":{"fromEnv":"true"}}'}
    # Not reimported: the second run gets the same artifact (MLMD id 1).
    assert received['name'] == '1'


def test_harness_fails_a_task_with_its_log(tmp_path):
  job = _container_job(str(tmp_path / 'root'),
                       producer_code='import sys; print("boom"); sys.exit(3)')
  backend = kfp_backend.KfpBackend(_write(tmp_path, job),
                                   str(tmp_path / 'work'), echo=False)
  with pytest.raises(kfp_backend.TaskFailed, match=r'producer failed \(3\)'
                     r'[\s\S]*boom'):
    backend.run()
  assert 'consumer' not in backend.results


def _resolver_job(root):
  """The two resolver tasks TFX 1.16 compiles LatestBlessedModelStrategy to."""
  def component(label, inputs, outputs):
    return {'executorLabel': label,
            'inputDefinitions': {'artifacts': {
                k: {'artifactType': {'instanceSchema': f'title: {v}\n'}}
                for k, v in inputs.items()}},
            'outputDefinitions': {'artifacts': {
                k: {'artifactType': {'instanceSchema': f'title: {v}\n'}}
                for k, v in outputs.items()}}}
  blessing, model = 'r-model-blessing-resolver', 'r-model-resolver'
  return {
      'runtimeConfig': {'gcsOutputDirectory': root},
      'pipelineSpec': {
          'pipelineInfo': {'name': 'resolver-test'},
          'components': {
              blessing: component(f'{blessing}_executor', {},
                                  {'model_blessing': 'tfx.ModelBlessing'}),
              model: component(f'{model}_executor',
                               {'input': 'tfx.ModelBlessing'},
                               {'model': 'tfx.Model'})},
          'deploymentSpec': {'executors': {
              f'{blessing}_executor': {'resolver': {'outputArtifactQueries': {
                  'model_blessing': {'filter': (
                      'schema_title="tfx.ModelBlessing" AND state=LIVE AND '
                      'metadata.blessed.number_value=1')}}}},
              f'{model}_executor': {'resolver': {'outputArtifactQueries': {
                  'model': {'filter': (
                      'schema_title="tfx.Model" AND state=LIVE AND '
                      'name="{{$.inputs.artifacts[\'input\'].metadata['
                      '\'current_model_id\']}}"')}}}}}},
          'root': {'dag': {'tasks': {
              blessing: {'componentRef': {'name': blessing},
                         'taskInfo': {'name': blessing}},
              model: {'componentRef': {'name': model},
                      'taskInfo': {'name': model},
                      'inputs': {'artifacts': {'input': {
                          'taskOutputArtifact': {
                              'producerTask': blessing,
                              'outputArtifactKey': 'model_blessing'}}}}}}}}}}


def _record(store, title, uri, **metadata):
  artifact = pb.RuntimeArtifact(uri=uri)
  artifact.type.schema_title = title
  artifact.metadata.update(metadata)
  return store.record('out', artifact, 'earlier', 'run0')


def test_resolver_finds_the_latest_blessed_model_or_nothing(tmp_path):
  job = _write(tmp_path, _resolver_job(str(tmp_path / 'root')))
  store = kfp_backend.ArtifactStore()
  first = kfp_backend.KfpBackend(job, str(tmp_path / 'w'), store=store,
                                 echo=False).run()
  assert first['r-model-blessing-resolver'].outputs['model_blessing'] == []
  assert first['r-model-resolver'].outputs['model'] == []

  old = _record(store, 'tfx.Model', 'gs://b/old/model')
  _record(store, 'tfx.ModelBlessing', 'gs://b/old/blessing', blessed=1,
          current_model_id=str(old.id))
  new = _record(store, 'tfx.Model', 'gs://b/new/model')
  _record(store, 'tfx.ModelBlessing', 'gs://b/new/blessing', blessed=0,
          current_model_id=str(new.id))
  second = kfp_backend.KfpBackend(job, str(tmp_path / 'w'), store=store,
                                  echo=False).run()
  (resolved,) = second['r-model-resolver'].outputs['model']
  assert resolved.uri == 'gs://b/old/model'  # The newest *blessed* one.
  assert resolved.name == str(old.id)


def test_harness_rejects_the_spec_2_0_constant_form(tmp_path):
  job = _container_job(str(tmp_path / 'root'))
  job['pipelineSpec']['root']['dag']['tasks']['producer']['inputs'][
      'parameters']['rows'] = {'runtimeValue': {
          'constantValue': {'stringValue': '3'}}}
  backend = kfp_backend.KfpBackend(_write(tmp_path, job),
                                   str(tmp_path / 'work'), echo=False)
  with pytest.raises(kfp_backend.TaskFailed, match='constant_value not '
                     'implemented'):
    backend.run()


# --- The tfx-hpm pipeline, end to end ----------------------------------------


# What the test reads back from gs://, in its own process: this pytest process
# stays free of TensorFlow, tfma and tfx.v1. With them loaded here, the
# interpreter crashed at exit after the test had passed (exit code 139: a
# segfault in protobuf's _message.so freeing a TF AttrValue during
# Py_FinalizeEx module cleanup; in 5 runs out of 5).
_VERIFY = r"""
import json, sys
import tensorflow as tf
import tensorflow_model_analysis as tfma
args = json.loads(sys.argv[1])
result = {}
eval_result = tfma.load_eval_result(args['evaluation'])
for slice_key, by_output in eval_result.slicing_metrics:
  if not slice_key:
    result['metrics'] = {
        name: value['doubleValue'] for output in by_output.values()
        for sub in output.values() for name, value in sub.items()
        if 'doubleValue' in value}
with tf.io.gfile.GFile(args['model_run'] + '/training_result.json') as f:
  result['checkpoint_dir'] = json.load(f)['checkpoint_dir']
files = tf.io.gfile.glob(args['examples'] + '/Split-eval/*')
raw = [r.numpy() for r in tf.data.TFRecordDataset(
    files, compression_type='GZIP').take(16)]
model = tf.saved_model.load(args['pushed'])
scores = model.signatures['serving_default'](
    examples=tf.constant(raw))['outputs'].numpy()
result.update(eval_files=len(files), examples=len(raw),
              scores=scores.reshape(-1).tolist())
print('VERIFY ' + json.dumps(result))
"""


def _check_in_child(env, **uris):
  proc = subprocess.run([sys.executable, '-c', _VERIFY, json.dumps(uris)],
                        env=env, capture_output=True, text=True, timeout=900,
                        check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
  (line,) = [out_line for out_line in proc.stdout.splitlines()
             if out_line.startswith('VERIFY ')]
  return json.loads(line[len('VERIFY '):])


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(2400)
def test_compiled_pipeline_runs_through_pusher_on_gcs(
    tmp_path, taxi_sample_dir, gcs_bucket):
  prefix = f'{gcs_bucket}/kfp-{uuid.uuid4().hex[:8]}'
  job_path = str(tmp_path / 'pipeline.json')
  compiled = subprocess.run(
      [sys.executable, '-m', 'kubeflow.runner', '--output', job_path,
       '--pipeline-root', f'{prefix}/root', '--data-root', taxi_sample_dir,
       '--serving-model-dir', f'{prefix}/serving_model',
       '--train-steps', str(TRAIN_STEPS), '--eval-steps', str(EVAL_STEPS),
       '--accuracy-threshold', str(ACCURACY_BOUND),
       # One in-process Beam worker per task: the default's worker processes
       # (one per core, each importing TensorFlow) only slow a 2,000-row run.
       '--beam-pipeline-arg=--direct_running_mode=in_memory',
       '--beam-pipeline-arg=--direct_num_workers=1'],
      capture_output=True, text=True, timeout=600, check=False)
  assert compiled.returncode == 0, compiled.stderr[-5000:]
  backend = kfp_backend.KfpBackend(job_path, str(tmp_path / 'pods'))
  try:
    results = backend.run()
  finally:
    print('task wall times (s):', json.dumps(backend.timings()))

  # Every task ran, in dependency order, as its own process.
  assert list(results) == backend.task_order()
  assert {'CsvExampleGen', 'StatisticsGen', 'SchemaGen', 'ExampleValidator',
          'Transform', 'Trainer', 'Evaluator', 'Pusher'} <= {
              name for name, r in results.items() if r.kind == 'container'}
  run_root = f'{prefix}/root/taxi-hpm/{backend.run_id}'
  for name, result in results.items():
    if result.kind == 'container':
      assert result.argv[0] == sys.executable, name
      assert result.argv[1:3] == ['-m', 'kubeflow.entrypoint'], name
      for artifacts in result.outputs.values():
        assert artifacts[0].uri.startswith(f'{run_root}/{name}/'), name
  # First run: the resolver finds no blessed model, so there is no baseline.
  resolvers = [r for r in results.values() if r.kind == 'resolver']
  assert len(resolvers) == 2
  assert all(a == [] for r in resolvers for a in r.outputs.values())
  evaluator_inputs = results['Evaluator'].executor_input.inputs.artifacts
  assert not evaluator_inputs[
      standard_component_specs.BASELINE_MODEL_KEY].artifacts

  (blessing,) = results['Evaluator'].outputs[
      standard_component_specs.BLESSING_KEY]
  assert blessing.metadata['blessed'] == 1
  (pushed,) = results['Pusher'].outputs[
      standard_component_specs.PUSHED_MODEL_KEY]
  assert pushed.metadata['pushed'] == 1
  destination = pushed.metadata['pushed_destination']
  assert destination.startswith(f'{prefix}/serving_model/')

  seen = _check_in_child(
      os.environ,
      evaluation=results['Evaluator'].outputs[
          standard_component_specs.EVALUATION_KEY][0].uri,
      model_run=results['Trainer'].outputs[
          standard_component_specs.MODEL_RUN_KEY][0].uri,
      examples=results['CsvExampleGen'].outputs[
          standard_component_specs.EXAMPLES_KEY][0].uri,
      pushed=destination)
  print('eval metrics:', json.dumps(seen['metrics']))
  assert seen['metrics']['binary_accuracy'] >= ACCURACY_BOUND, seen['metrics']
  # The trainer checkpointed outside the run's folder, keyed by pipeline
  # name and node (from the task's env) and its fingerprint, so a
  # resubmitted run finds the checkpoints.
  assert re.fullmatch(
      re.escape(f'{prefix}/root/_hpm_checkpoints/taxi-hpm/Trainer/') +
      '[0-9a-f]{16}', seen['checkpoint_dir']), seen
  # The pushed model serves raw serialized tf.Examples.
  assert seen['eval_files'] and seen['examples'] == 16
  assert len(seen['scores']) == 16
  assert all(0 <= score <= 1 for score in seen['scores'])
