"""HighPerfTrainer's outputs against the stock Trainer's, and warm start.

One pipeline on the session's taxi upstream runs three trainers on the same
Transform output: the stock Trainer with TFX's own taxi Keras module (the
reference: `pipelines/taxi_module.py` exports through our code, so it cannot
be one), HighPerfTrainer with that same module (`run_fn` mode: its export is
the module's own) and HighPerfTrainer in managed mode (`make run`'s
Trainer), whose `base_model` comes from a resolver of its own latest model,
as TFX documents warm starts. The pipeline runs twice with caching on: the
second run executes only the managed trainer, which now has a base model.

Every difference between what the stock Trainer leaves and what ours leave
(files and formats under `model/` and `model_run/`, MLMD properties, what
loading the model offers) must be listed in the README's drop-in section
(`tests/support/output_conformance.py`); ours may add.
"""

import json
import os

import pytest
import tensorflow as tf
from tfx import v1 as tfx
from tfx.types import standard_component_specs

from components import HighPerfTrainer
from components.records import training_result
from pipelines import taxi_pipeline
from tests.support import mlmd
from tests.support import output_conformance
from components.testing import taxi_runs

pytestmark = [pytest.mark.slow, pytest.mark.extended]

README = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'README.md')
STOCK_TAXI_MODULE = os.path.join(
    os.path.dirname(tfx.__file__), '..', 'examples', 'chicago_taxi_pipeline',
    'taxi_utils_native_keras.py')
# The managed trainer's first run is long enough for its loss to fall well
# below a fresh model's; batch 256 keeps a batch's loss close to the mean.
TRAIN_STEPS = 300
BATCH = 256
STOCK_STEPS = 100
EVAL_STEPS = 5
STOCK_NODE = 'StockTrainer'
RUN_FN_NODE = 'StockModuleTrainer'
MANAGED_NODE = taxi_pipeline.TRAINER_ID


def _pipeline(root: str, data_root: str) -> tfx.dsl.Pipeline:
  example_gen, statistics, schema = taxi_pipeline.upstream(data_root)
  schema_channel = schema.outputs[standard_component_specs.SCHEMA_KEY]
  transform = taxi_pipeline.stock_transform(
      example_gen.outputs[standard_component_specs.EXAMPLES_KEY],
      schema_channel, taxi_runs.MODULE).with_id(taxi_pipeline.TRANSFORM_ID)
  inputs = dict(
      examples=transform.outputs[
          standard_component_specs.TRANSFORMED_EXAMPLES_KEY],
      transform_graph=transform.outputs[
          standard_component_specs.TRANSFORM_GRAPH_KEY],
      schema=schema_channel,
      eval_args=tfx.proto.EvalArgs(num_steps=EVAL_STEPS))
  stock = tfx.components.Trainer(
      module_file=STOCK_TAXI_MODULE,
      train_args=tfx.proto.TrainArgs(num_steps=STOCK_STEPS),
      **inputs).with_id(STOCK_NODE)
  run_fn = HighPerfTrainer(
      module_file=STOCK_TAXI_MODULE,
      train_args=tfx.proto.TrainArgs(num_steps=STOCK_STEPS),
      **inputs).with_id(RUN_FN_NODE)
  latest_model = tfx.dsl.Resolver(
      strategy_class=tfx.dsl.experimental.LatestArtifactStrategy,
      model=tfx.dsl.Channel(
          type=tfx.types.standard_artifacts.Model,
          producer_component_id=MANAGED_NODE,
          output_key=standard_component_specs.MODEL_KEY)).with_id(
              'latest_model_resolver')
  managed = HighPerfTrainer(
      module_file=taxi_runs.MODULE,
      base_model=latest_model.outputs['model'],
      train_args=tfx.proto.TrainArgs(num_steps=TRAIN_STEPS),
      distribution={'per_replica_batch_size': BATCH},
      **inputs).with_id(MANAGED_NODE)
  return tfx.dsl.Pipeline(
      pipeline_name=taxi_runs.NAME, pipeline_root=root,
      components=[example_gen, statistics, schema, transform, stock, run_fn,
                  latest_model, managed],
      enable_cache=True,
      metadata_connection_config=(
          tfx.orchestration.metadata.sqlite_metadata_connection_config(
              os.path.join(root, taxi_runs.METADATA))),
      beam_pipeline_args=['--direct_running_mode=in_memory',
                          '--direct_num_workers=1'])


@pytest.fixture(scope='module')
def runs(tmp_path_factory, taxi_upstream, taxi_sample_dir):
  """Both runs; returns (metadata path, the managed trainer's two
  ModelRun artifacts, first run first)."""
  root = str(tmp_path_factory.mktemp('outputs_vs_stock'))
  taxi_runs.start_from(taxi_upstream, root)
  for _ in range(2):
    tfx.orchestration.LocalDagRunner().run(_pipeline(root, taxi_sample_dir))
  metadata_path = os.path.join(root, taxi_runs.METADATA)
  model_runs = sorted(
      (a for a in mlmd.read_only_store(metadata_path).get_artifacts_by_type(
          'ModelRun') if f'/{MANAGED_NODE}/' in a.uri), key=lambda a: a.id)
  return metadata_path, model_runs


def _differences(metadata_path: str, node: str):
  stock = output_conformance.node_outputs(metadata_path, taxi_runs.NAME,
                                          STOCK_NODE)
  ours = output_conformance.node_outputs(metadata_path, taxi_runs.NAME, node)
  return output_conformance.compare_outputs(
      stock, ours,
      saved_models={standard_component_specs.MODEL_KEY: 'Format-Serving'})


def test_run_fn_mode_leaves_what_the_stock_trainer_leaves_and_more(runs):
  """The module's own export, untouched; model_run gains our records."""
  metadata_path, _ = runs
  differences, additions = _differences(metadata_path, RUN_FN_NODE)
  assert differences == [], differences
  assert not [a for a in additions if a.startswith('model:')], additions
  assert 'model_run: training_result.json added (text)' in additions


def test_managed_mode_differs_from_stock_only_where_the_readme_says(runs):
  metadata_path, _ = runs
  differences, additions = _differences(metadata_path, MANAGED_NODE)
  output_conformance.assert_documented(differences, README,
                                       'HighPerfTrainer')
  # Beyond stock: Keras loads the managed export.
  assert 'model: keras load added (works)' in additions, additions


def _first_logged_loss(model_run_uri: str) -> float:
  losses = {}
  folder = os.path.join(model_run_uri, 'train')
  for name in tf.io.gfile.listdir(folder):
    for record in tf.data.TFRecordDataset(os.path.join(folder, name)):
      event = tf.compat.v1.Event.FromString(record.numpy())
      for value in event.summary.value:
        if value.tag == 'loss':
          losses[event.step] = float(tf.make_ndarray(value.tensor))
  return losses[min(losses)]


def test_warm_start_begins_near_the_previous_models_loss(runs):
  metadata_path, (first, second) = runs
  store = mlmd.read_only_store(metadata_path)
  first_model = min((a for a in store.get_artifacts_by_type('Model')
                     if f'/{MANAGED_NODE}/' in a.uri), key=lambda a: a.id)
  assert 'warm_start' not in first.custom_properties
  warm = json.loads(second.custom_properties['warm_start'].string_value)
  assert warm['base_model'] == os.path.join(first_model.uri, 'Format-Serving')
  assert warm['weights'] > 0
  fresh_start = _first_logged_loss(first.uri)
  trained = training_result.read(first.uri).loop.train_loss
  warm_start = _first_logged_loss(second.uri)
  print(f'first logged loss: fresh {fresh_start:.3f}, warm {warm_start:.3f};'
        f' the base model ended at {trained:.3f}')
  assert fresh_start - trained > 0.1  # A real gap to tell them apart.
  assert abs(warm_start - trained) < (fresh_start - trained) / 3
