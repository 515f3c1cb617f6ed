"""Drop-in for stock TFX pipelines: no I/O at construction, stock shapes.

Constructing our components (and compiling a pipeline for Kubeflow) must
work on a machine that cannot reach the pipeline's storage: here every
gs:// access raises, and importing the user's modules raises too.
"""

import importlib
import importlib.util
import json
import os

from ml_metadata import metadata_store
from ml_metadata.proto import metadata_store_pb2
import pytest
import tensorflow as tf
from tensorflow.python.lib.io import file_io
from tfx import v1 as tfx
from tfx.dsl.compiler import compiler
from tfx.dsl.components.base import base_component
from tfx.dsl.io import fileio
from tfx.orchestration import metadata
from tfx.orchestration.kubeflow.v2 import kubeflow_v2_dag_runner
from tfx.types import standard_artifacts
from tfx.types import standard_component_specs

from components import drop_in
from components import GPipePartitioner
from components import HighPerfTrainer
from components import OptimizedTransform
from components.partitioner import spec_keys as partitioner_keys
from components.trainer.cluster import tf_cluster
from pipelines import data
from tests.support import dropin_shapes
from tests.support import dropin_tuner_module

BUCKET = 'gs://no-such-bucket-tfx-hpm'
# User modules that must not be imported at construction.
USER_PACKAGE = 'tfx_hpm_user_code'


class GcsAccessed(AssertionError):
  """Raised for any gs:// access or user-module import (not an OSError, so
  that no caller mistakes it for a missing file)."""


def _guard(function, name):
  def guarded(*args, **kwargs):
    for arg in list(args) + list(kwargs.values()):
      if isinstance(arg, (str, bytes)) and (
          arg[:5] in ('gs://', b'gs://')):
        raise GcsAccessed(f'{name}({arg!r}) at construction')
    return function(*args, **kwargs)
  return guarded


@pytest.fixture
def no_storage_no_user_code(monkeypatch):
  """Every gs:// access through tf.io.gfile or TFX fileio, and every import
  of USER_PACKAGE, raises GcsAccessed."""
  for module in (tf.io.gfile, file_io):
    for name in dir(module):
      value = getattr(module, name)
      if not name.startswith('_') and callable(value):
        monkeypatch.setattr(module, name, _guard(value, name))
  monkeypatch.setattr(fileio, '_get_filesystem',
                      _guard(fileio._get_filesystem, 'fileio'))  # pylint: disable=protected-access

  def no_user_import(function):
    def guarded(name, *args, **kwargs):
      if name.split('.')[0] == USER_PACKAGE:
        raise GcsAccessed(f'imported user module {name!r}')
      return function(name, *args, **kwargs)
    return guarded

  monkeypatch.setattr(importlib, 'import_module',
                      no_user_import(importlib.import_module))
  monkeypatch.setattr(importlib.util, 'find_spec',
                      no_user_import(importlib.util.find_spec))
  monkeypatch.setattr(importlib.util, 'spec_from_file_location',
                      _guard(importlib.util.spec_from_file_location,
                             'spec_from_file_location'))


def _imported(artifact_type, name):
  return tfx.dsl.Importer(source_uri=f'{BUCKET}/{name}',
                          artifact_type=artifact_type).with_id(
                              f'import_{name}')


def test_guard_catches_gcs_access_and_user_imports(no_storage_no_user_code):
  """The fixture itself: the accesses construction must not make."""
  with pytest.raises(GcsAccessed):
    tf.io.gfile.exists(f'{BUCKET}/module.py')
  with pytest.raises(GcsAccessed):
    fileio.exists(f'{BUCKET}/module.py')
  with pytest.raises(GcsAccessed):
    importlib.import_module(f'{USER_PACKAGE}.trainer_module')


def test_components_construct_without_io_or_user_code(
    no_storage_no_user_code):
  examples = _imported(standard_artifacts.Examples, 'examples')
  schema = _imported(standard_artifacts.Schema, 'schema')
  transform = OptimizedTransform(
      examples=examples.outputs['result'], schema=schema.outputs['result'],
      module_file=f'{BUCKET}/preprocessing.py',
      tuning={'num_output_shards': 2})
  transformed_examples = transform.outputs[
      standard_component_specs.TRANSFORMED_EXAMPLES_KEY]
  transform_graph = transform.outputs[
      standard_component_specs.TRANSFORM_GRAPH_KEY]
  partitioner = GPipePartitioner(
      config={'batch_size': 64, 'num_stages': 2},
      module_file=f'{BUCKET}/model.py',
      examples=transformed_examples,
      transform_graph=transform_graph)
  GPipePartitioner(config={'batch_size': 64, 'num_stages': 2},
                   module_path=f'{USER_PACKAGE}.model')
  trainer = HighPerfTrainer(
      examples=transformed_examples,
      transform_graph=transform_graph,
      module_file=f'{BUCKET}/trainer.py',
      partition_plan=partitioner.outputs[partitioner_keys.PARTITION_PLAN_KEY],
      train_args=tfx.proto.TrainArgs(num_steps=10),
      distribution={'global_batch_size': 64})
  assert trainer.exec_properties[standard_component_specs.MODULE_FILE_KEY] == (
      f'{BUCKET}/trainer.py')
  # A module installed in the image, named, not imported.
  by_name = HighPerfTrainer(
      examples=examples.outputs['result'], schema=schema.outputs['result'],
      module_file=f'{USER_PACKAGE}.trainer_module')
  assert by_name.exec_properties[standard_component_specs.MODULE_PATH_KEY] == (
      f'{USER_PACKAGE}.trainer_module')
  HighPerfTrainer(examples=examples.outputs['result'],
                  run_fn=f'{USER_PACKAGE}.trainer_module.run_fn')
  # Config values are still checked here, without I/O.
  with pytest.raises(ValueError, match="strategy='horovod'"):
    HighPerfTrainer(examples=examples.outputs['result'],
                    module_file=f'{BUCKET}/trainer.py',
                    distribution={'strategy': 'horovod'})
  with pytest.raises(ValueError, match='batch_size 40 is not divisible'):
    GPipePartitioner(config={'batch_size': 40, 'num_microbatches': 16},
                     module_file=f'{BUCKET}/model.py')


# ------------------------------------------- Kubeflow compile, no storage


def _compile(pipeline, tmp_path):
  runner = kubeflow_v2_dag_runner.KubeflowV2DagRunner(
      config=kubeflow_v2_dag_runner.KubeflowV2DagRunnerConfig(
          default_image='tfx-hpm:test'),
      output_dir=str(tmp_path), output_filename='pipeline.json')
  return runner.run(pipeline, write_out=False)


@pytest.fixture
def no_module_packaging(monkeypatch):
  """As TFX's own Kubeflow V2 tests: compiling packages user modules (reads
  them); that packaging is the stock runner's, the same for every class."""
  monkeypatch.setattr(base_component.BaseComponent,
                      '_resolve_pip_dependencies', lambda self, root: None)


@pytest.mark.parametrize('ours', [False, True], ids=['stock', 'ours'])
def test_cached_shapes_compile_for_kubeflow_without_storage(
    ours, tmp_path, no_module_packaging, no_storage_no_user_code):
  pipeline = dropin_shapes.cached_pipeline(
      ours, f'{BUCKET}/data', f'{BUCKET}/root', f'{BUCKET}/serving',
      module_file=f'{BUCKET}/taxi_module.py',
      tuner_module=f'{BUCKET}/tuner_module.py')
  spec = _compile(pipeline, tmp_path)['pipelineSpec']
  tasks = spec['root']['dag']['tasks']
  assert set(tasks) >= {'CsvExampleGen', 'ImportSchemaGen', 'Transform',
                        'Tuner', 'Trainer', 'Evaluator', 'Pusher'}
  # The Pusher runs only for a blessed model.
  assert 'blessed' in tasks['Pusher']['triggerPolicy']['condition']
  trainer_inputs = tasks['Trainer']['inputs']['artifacts']
  assert trainer_inputs[standard_component_specs.HYPERPARAMETERS_KEY][
      'taskOutputArtifact'] == {
      'outputArtifactKey': 'best_hyperparameters', 'producerTask': 'Tuner'}
  params = spec['components']['Trainer']['inputDefinitions']['parameters']
  assert standard_component_specs.MODULE_FILE_KEY in params


def test_span_window_compiles_for_kubeflow_as_far_as_the_stock_pipeline(
    tmp_path, no_module_packaging, no_storage_no_user_code):
  """TFX's Kubeflow V2 compiler supports no span-range Resolver, for the
  stock Transform as for ours: the same error, before any storage access."""
  errors = []
  for ours in (False, True):
    pipeline = dropin_shapes.span_pipeline(
        ours, f'{BUCKET}/data', f'{BUCKET}/root',
        module_file=f'{BUCKET}/taxi_module.py')
    with pytest.raises(TypeError) as error:
      _compile(pipeline, tmp_path)
    errors.append(str(error.value))
  assert errors[0] == errors[1]
  assert 'SpanRangeStrategy' in errors[0]


def test_analyzer_cache_resolver_compiles_for_kubeflow_without_storage(
    tmp_path, no_module_packaging, no_storage_no_user_code):
  """The analyzer-cache Resolver alone (LatestArtifactStrategy, which TFX's
  Kubeflow V2 compiler supports) in front of OptimizedTransform."""
  pipeline = dropin_shapes.span_pipeline(
      True, f'{BUCKET}/data', f'{BUCKET}/root',
      module_file=f'{BUCKET}/taxi_module.py', span_window=False)
  tasks = _compile(pipeline, tmp_path)['pipelineSpec']['root']['dag'][
      'tasks']
  assert tasks['Transform']['inputs']['artifacts'][
      standard_component_specs.ANALYZER_CACHE_KEY]['taskOutputArtifact'][
          'producerTask'] == 'latest_analyzer_cache'


def test_stock_execution_types_in_the_pipeline_ir():
  """What MLMD records as the execution type (TFX's node_info.type.name):
  the stock one for our Transform and Trainer, ours for the partitioner."""
  pipeline = dropin_shapes.span_pipeline(True, '/data', '/root')
  pipeline.components.append(GPipePartitioner(
      config={'batch_size': 32, 'num_stages': 2},
      module_path='pipelines.taxi_module'))
  ir = compiler.Compiler().compile(pipeline)
  types = {node.pipeline_node.node_info.id:
           node.pipeline_node.node_info.type.name for node in ir.nodes}
  assert types['Transform'] == 'tfx.components.transform.component.Transform'
  assert types['Trainer'] == 'tfx.components.trainer.component.Trainer'
  assert types['GPipePartitioner'] == (
      'components.partitioner.component.GPipePartitioner')
  params = {node.pipeline_node.node_info.id: node.pipeline_node.parameters
            for node in ir.nodes}
  class_key = drop_in.COMPONENT_CLASS_KEY
  assert params['Trainer'].parameters[class_key].field_value \
      .string_value == 'components.trainer.component.HighPerfTrainer'
  assert params['Transform'].parameters[class_key].field_value \
      .string_value == 'components.transform.component.OptimizedTransform'


# ------------------------------------------------------ the shapes run

SAMPLE_ROWS = 500  # What the shapes need: every split and vocabulary filled.
CACHED_NODES = ('CsvExampleGen', 'ImportSchemaGen', 'Transform', 'Tuner',
                'Trainer', 'Evaluator', 'Pusher')
_STATES = {metadata_store_pb2.Execution.COMPLETE: 'COMPLETE',
           metadata_store_pb2.Execution.CACHED: 'CACHED'}


def _store(metadata_path):
  return metadata_store.MetadataStore(
      metadata.sqlite_metadata_connection_config(metadata_path))


def _node_of(store, execution) -> str:
  for context in store.get_contexts_by_execution(execution.id):
    if store.get_context_types_by_id([context.type_id])[0].name == 'node':
      return context.name.split('.', 1)[1]
  raise AssertionError(f'execution {execution.id} has no node context')


def _runs(store):
  """Per pipeline run, in order: {node id: execution}."""
  runs = sorted(store.get_contexts_by_type('pipeline_run'),
                key=lambda c: c.id)
  return [{_node_of(store, e): e
           for e in store.get_executions_by_context(run.id)}
          for run in runs]


def _artifacts(store, execution, event_type, key):
  events = [e for e in store.get_events_by_execution_ids([execution.id])
            if e.type == event_type and e.path.steps[0].key == key]
  return store.get_artifacts_by_id([e.artifact_id for e in events])


@pytest.mark.slow
@pytest.mark.extended
def test_tuner_cond_pusher_and_a_cached_rerun(tmp_path):
  """ImportSchemaGen, a Tuner's best_hyperparameters into HighPerfTrainer,
  a Pusher under Cond(blessed); a second run reuses every execution, as the
  stock components do (TFX's own taxi e2e test: unchanged inputs, cached
  executions, no new artifacts)."""
  data_root = data.write_sample(data.default_data_root(),
                                str(tmp_path / 'data'), SAMPLE_ROWS)
  metadata_path = str(tmp_path / 'metadata.db')
  serving = tmp_path / 'serving'
  artifact_counts = []
  for _ in range(2):
    tfx.orchestration.LocalDagRunner().run(dropin_shapes.cached_pipeline(
        True, data_root, str(tmp_path / 'root'), str(serving),
        metadata_path))
    artifact_counts.append(len(_store(metadata_path).get_artifacts()))

  store = _store(metadata_path)
  runs = _runs(store)
  states = [{node: _STATES.get(e.last_known_state, e.last_known_state)
             for node, e in run.items()} for run in runs]
  assert states == [dict.fromkeys(CACHED_NODES, 'COMPLETE'),
                    dict.fromkeys(CACHED_NODES, 'CACHED')]
  assert artifact_counts[0] == artifact_counts[1]
  # The Tuner's best values reached the managed loop's hparams.
  [best] = _artifacts(store, runs[0]['Tuner'],
                      metadata_store_pb2.Event.OUTPUT, 'best_hyperparameters')
  [model_run] = _artifacts(store, runs[0]['Trainer'],
                           metadata_store_pb2.Event.OUTPUT, 'model_run')
  with open(os.path.join(best.uri, 'best_hyperparameters.txt')) as f:
    tuned = json.load(f)
  tuned = tuned.get('values', tuned)
  assert tuned['learning_rate'] in dropin_tuner_module.LEARNING_RATES
  with open(os.path.join(model_run.uri, tf_cluster.TASK_FILE_NAME)) as f:
    task = json.load(f)
  assert task['hparams'] == {**dropin_shapes.HPARAMS, **tuned}
  # Blessed (threshold 0), so the conditional Pusher pushed.
  [blessing] = _artifacts(store, runs[0]['Evaluator'],
                          metadata_store_pb2.Event.OUTPUT, 'blessing')
  assert blessing.custom_properties['blessed'].int_value == 1
  [pushed] = _artifacts(store, runs[0]['Pusher'],
                        metadata_store_pb2.Event.OUTPUT, 'pushed_model')
  assert pushed.custom_properties['pushed'].int_value == 1
  assert os.listdir(serving)
  # Found as TFX's e2e tests find them: one execution per run.
  assert len(store.get_executions_by_type(
      'tfx.components.trainer.component.Trainer')) == 2


@pytest.mark.slow
@pytest.mark.extended
def test_span_window_and_analyzer_cache_across_two_runs(tmp_path):
  """Run 1 on span 1; run 2, after span 2 arrived, transforms both spans
  (the span-window Resolver) with run 1's analyzer cache."""
  data_root = tmp_path / 'spans'
  metadata_path = str(tmp_path / 'metadata.db')
  for span in (1, 2):
    data.write_sample(data.default_data_root(),
                      str(data_root / f'span-{span}'), SAMPLE_ROWS)
    tfx.orchestration.LocalDagRunner().run(dropin_shapes.span_pipeline(
        True, str(data_root), str(tmp_path / 'root'), metadata_path))

  store = _store(metadata_path)
  runs = _runs(store)
  assert len(runs) == 2
  components = ('CsvExampleGen', 'ImportSchemaGen', 'Transform', 'Trainer')
  complete, cached = (metadata_store_pb2.Execution.COMPLETE,
                      metadata_store_pb2.Execution.CACHED)
  # (The Resolver nodes record executions too; the first run's cache
  # Resolver finds no cache, as with the stock Transform.) The schema file is
  # unchanged, so the second run reuses its import.
  for run, schema_state in zip(runs, (complete, cached)):
    assert {node: run[node].last_known_state for node in components} == {
        **dict.fromkeys(components, complete), 'ImportSchemaGen': schema_state}
  input_event = metadata_store_pb2.Event.INPUT
  first, second = runs[0]['Transform'], runs[1]['Transform']
  # ExampleGen records the span as a custom property (its type's `span`
  # property stays unset), which is what SpanRangeStrategy reads.
  spans = [sorted(a.custom_properties['span'].int_value for a in
                  _artifacts(store, t, input_event,
                             standard_component_specs.EXAMPLES_KEY))
           for t in (first, second)]
  assert spans == [[1], [1, 2]]
  cache_key = standard_component_specs.ANALYZER_CACHE_KEY
  assert not _artifacts(store, first, input_event, cache_key)
  [cache_in] = _artifacts(store, second, input_event, cache_key)
  [cache_out] = _artifacts(
      store, first, metadata_store_pb2.Event.OUTPUT,
      standard_component_specs.UPDATED_ANALYZER_CACHE_KEY)
  assert cache_in.id == cache_out.id
  # The cache was used: the second run wrote its own, for both spans.
  [updated] = _artifacts(store, second, metadata_store_pb2.Event.OUTPUT,
                         'updated_analyzer_cache')
  assert tf.io.gfile.listdir(updated.uri)
