"""OptimizedTransform vs the stock Transform in real LocalDagRunner runs.

On the 2,000-row taxi sample, an OptimizedTransform and an OptimizedTransform
without materialization run on the same ExampleGen and SchemaGen outputs as
a stock Transform, on the session's taxi upstream (`taxi_upstream`: this
pipeline starts from its MLMD file with caching on, so it reuses its
ExampleGen .. SchemaGen). It runs twice in the same root, so the second run
finds the first run's tunings.
"""

import collections
import glob
import json
import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_transform as tft
from tfx import v1 as tfx
from tfx.types import standard_component_specs
from tfx_bsl.public import tfxio

from components.data import input_pipeline
from components.data.input_pipeline import InputPipelineConfig
from components.data import shard_index
from components import OptimizedTransform
from components.records import tuned_input_pipeline
from components.transform.config import TuningConfig
from components.transform import decisions
from components.transform import spec_keys
from components.transform import tuner
from components.types import TunedInputPipeline
from pipelines import data
from pipelines import taxi_module
from pipelines import taxi_pipeline
from tests.support import mlmd
from tests.support import output_conformance
from components.testing import taxi_runs

# Extended: the core set proves OptimizedTransform end to end in the gs://
# GPipe pipeline (tests/test_gcs_pipeline.py); this module adds its identity
# with the stock Transform and the tuning reuse (about 5 min).
pytestmark = [pytest.mark.slow, pytest.mark.extended]

README = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'README.md')
NUM_SHARDS = 4
BATCH = 64
TUNING = {'time_budget_s': 4.0, 'num_output_shards': NUM_SHARDS,
          'trainer_batch_size': BATCH}


@pytest.fixture(scope='module')
def run(tmp_path_factory, taxi_upstream, taxi_sample_dir):
  """Runs the pipeline twice; returns a function (node, output) -> uri."""
  root = str(tmp_path_factory.mktemp('transform_pipeline'))
  taxi_runs.start_from(taxi_upstream, root)

  def components(first_run: bool):
    example_gen, statistics, schema = taxi_pipeline.upstream(taxi_sample_dir)
    common = dict(
        examples=example_gen.outputs[standard_component_specs.EXAMPLES_KEY],
        schema=schema.outputs[standard_component_specs.SCHEMA_KEY],
        module_file=data.default_module_file())
    # Without early stop it always tunes, so its second run reuses.
    on_the_fly = OptimizedTransform(
        **common, materialize=False,
        tuning={**TUNING, 'early_stop': False}).with_id('OnTheFlyTransform')
    if not first_run:  # Same root, same data: only the reusing node.
      return [example_gen, statistics, schema, on_the_fly]
    return [
        example_gen, statistics, schema,
        # Here, not the upstream's: floats are only identical from the same
        # process (TF's op pool, set once per process, orders the analyzers'
        # sums; an earlier test in the upstream's process can have set it).
        tfx.components.Transform(**common).with_id('StockTransform'),
        OptimizedTransform(**common, tuning=TUNING).with_id(
            'OptimizedTransform'),
        on_the_fly,
    ]

  metadata_path = os.path.join(root, taxi_runs.METADATA)
  # The first run reuses the upstream's ExampleGen .. SchemaGen; the second
  # executes everything again (a cached OnTheFlyTransform would reuse
  # nothing of its own).
  for first_run in (True, False):
    tfx.orchestration.LocalDagRunner().run(tfx.dsl.Pipeline(
        pipeline_name=taxi_runs.NAME, pipeline_root=root,
        components=components(first_run), enable_cache=first_run,
        metadata_connection_config=(
            tfx.orchestration.metadata.sqlite_metadata_connection_config(
                metadata_path)),
        beam_pipeline_args=['--direct_running_mode=in_memory',
                            '--direct_num_workers=1']))

  # The first run's ExampleGen output is the upstream's.
  folders = {'CsvExampleGen': (taxi_upstream, 'CsvExampleGen')}

  def runs(node, output):
    """The node's output folders, first run first."""
    base, folder = folders.get(node, (root, node))
    paths = glob.glob(os.path.join(base, folder, output, '*'))
    return sorted(paths, key=lambda p: int(os.path.basename(p)))

  def uri(node, output):
    """The first run's output folder."""
    return runs(node, output)[0]

  uri.runs = runs
  uri.metadata_path = metadata_path
  return uri


def _records(split_dir):
  files = sorted(glob.glob(os.path.join(split_dir, '*')))
  return files, list(tf.data.TFRecordDataset(files, 'GZIP').as_numpy_iterator())


def _rows(dataset):
  """Multiset of examples as hashable rows (feature name, value) + label."""
  rows = collections.Counter()
  for features, label in dataset:
    size = int(label.shape[0])
    # Each value as a tuple: features are [batch] or [batch, 1].
    columns = [(k, v.numpy().reshape(size, -1).tolist())
               for k, v in sorted(features.items())]
    columns.append(('label', label.numpy().reshape(size, -1).tolist()))
    for i in range(size):
      rows[tuple((k, tuple(values[i])) for k, values in columns)] += 1
  return rows


def _stock_reader(split_dir, schema):
  return tfxio.TFExampleRecord(
      file_pattern=[os.path.join(split_dir, '*')], schema=schema
  ).TensorFlowDataset(tfxio.TensorFlowDatasetOptions(
      batch_size=64, num_epochs=1, shuffle=False,
      label_key=taxi_module.LABEL_KEY))


def _tuned_config_at(uri):
  return tuned_input_pipeline.read(uri)


def _tuned_config(run, node):
  return _tuned_config_at(run(node, 'tuned_input_pipeline'))


@pytest.mark.parametrize('split', ['train', 'eval'])
def test_transformed_examples_identical_to_stock(run, split):
  stock_files, stock = _records(
      os.path.join(run('StockTransform', 'transformed_examples'),
                   f'Split-{split}'))
  our_files, ours = _records(
      os.path.join(run('OptimizedTransform', 'transformed_examples'),
                   f'Split-{split}'))
  # The Beam write made NUM_SHARDS files, named as the stock ones are.
  assert len(our_files) == NUM_SHARDS > len(stock_files)
  assert [os.path.basename(f) for f in our_files] == [
      f'transformed_examples-{k:05d}-of-{NUM_SHARDS:05d}.gz'
      for k in range(NUM_SHARDS)]
  # The same tf.Examples (the feature map's serialized order may differ
  # between two Beam runs, and Beam spreads the records over the shards).
  assert len(ours) == len(stock) > 0
  # The shard index written with them counts each file's records.
  split_dir = os.path.dirname(our_files[0])
  index = shard_index.read(split_dir,
                           shard_index.artifact_index_path(split_dir))
  assert [s.name for s in index.shards] == [os.path.basename(f)
                                            for f in our_files]
  assert index.records == len(ours)
  canonical = lambda records: sorted(  # pylint: disable=g-long-lambda
      tf.train.Example.FromString(r).SerializeToString(deterministic=True)
      for r in records)
  assert canonical(ours) == canonical(stock)


def test_transform_graph_identical_to_stock(run):
  stock = tft.TFTransformOutput(run('StockTransform', 'transform_graph'))
  ours = tft.TFTransformOutput(run('OptimizedTransform', 'transform_graph'))
  assert ours.transformed_feature_spec() == stock.transformed_feature_spec()
  assert ours.raw_feature_spec() == stock.raw_feature_spec()
  assets = [os.path.join(run(node, 'transform_graph'), 'transform_fn',
                          'assets') for node in ('StockTransform',
                                                 'OptimizedTransform')]
  names = sorted(os.listdir(assets[0]))
  assert names and sorted(os.listdir(assets[1])) == names
  for name in names:  # The vocabularies.
    stock_asset, our_asset = (open(os.path.join(a, name), 'rb').read()
                              for a in assets)
    assert our_asset == stock_asset
  raw = next(iter(tf.data.TFRecordDataset(
      glob.glob(os.path.join(run('CsvExampleGen', 'examples'),
                             'Split-eval', '*')), 'GZIP').batch(200)))
  raw_features = tf.io.parse_example(raw, stock.raw_feature_spec())
  expected = stock.transform_raw_features(raw_features)
  actual = ours.transform_raw_features(raw_features)
  assert set(actual) == set(expected)
  for key in expected:
    np.testing.assert_array_equal(actual[key].numpy(), expected[key].numpy())


def test_every_stock_output_is_produced(run):
  for output in ('transform_graph', 'transformed_examples',
                 'updated_analyzer_cache', 'pre_transform_schema',
                 'pre_transform_stats', 'post_transform_schema',
                 'post_transform_stats', 'post_transform_anomalies'):
    stock = set(os.listdir(run('StockTransform', output)))
    ours = set(os.listdir(run('OptimizedTransform', output)))
    # Ours adds the shard index of each split it wrote.
    assert sorted(ours - stock) == (
        ['shard_index-eval.json', 'shard_index-train.json']
        if output == 'transformed_examples' else []), output
    assert stock <= ours
  assert not glob.glob(os.path.join(run.metadata_path, '..',
                                    'OnTheFlyTransform',
                                    'transformed_examples', '*', '*'))


def test_outputs_differ_from_stock_only_where_the_readme_says(run):
  """Files and formats of every stock output, their MLMD properties; the
  transform graph's SavedModel as a loader sees it (its signatures)."""
  stock = output_conformance.node_outputs(run.metadata_path, taxi_runs.NAME,
                                          'StockTransform')
  ours = output_conformance.node_outputs(run.metadata_path, taxi_runs.NAME,
                                         'OptimizedTransform')
  differences, _ = output_conformance.compare_outputs(
      stock, ours, saved_models={
          standard_component_specs.TRANSFORM_GRAPH_KEY: 'transform_fn'})
  output_conformance.assert_documented(differences, README,
                                       'OptimizedTransform')
  # What only ours has: the tuned input pipeline.
  tuned = spec_keys.TUNED_INPUT_PIPELINE_KEY
  assert tuned in ours and tuned not in stock


def test_tuned_pipeline_yields_stock_readers_multiset(run):
  schema = tft.TFTransformOutput(run(
      'StockTransform', 'transform_graph')).transformed_metadata.schema
  spec = tft.TFTransformOutput(run(
      'OptimizedTransform', 'transform_graph')).transformed_feature_spec()
  config = _tuned_config(run, 'OptimizedTransform')
  split_dir = os.path.join(run('OptimizedTransform', 'transformed_examples'),
                           'Split-train')

  def ours():
    return input_pipeline.build_dataset(
        [os.path.join(split_dir, '*')], spec, taxi_module.LABEL_KEY, 64,
        config, num_epochs=1, drop_remainder=False)

  stock_rows = _rows(_stock_reader(
      os.path.join(run('StockTransform', 'transformed_examples'),
                   'Split-train'), schema))
  our_rows = _rows(ours())
  assert sum(stock_rows.values()) > 1000
  assert our_rows == stock_rows
  if config.deterministic:
    first, second = ([b[1].numpy().tolist() for b in ours()] for _ in range(2))
    assert first == second


def test_on_the_fly_yields_the_materialized_tensors(run):
  graph = run('OptimizedTransform', 'transform_graph')
  spec = tft.TFTransformOutput(graph).transformed_feature_spec()
  raw_train = os.path.join(run('CsvExampleGen', 'examples'), 'Split-train',
                           '*')
  materialized = os.path.join(run('OptimizedTransform',
                                  'transformed_examples'), 'Split-train', '*')

  def rows(config):
    return _rows(input_pipeline.build_dataset(
        [materialized], spec, taxi_module.LABEL_KEY, 64, config,
        num_epochs=1, drop_remainder=False))

  on_the_fly = InputPipelineConfig(
      transform_placement='on_the_fly', transform_graph_uri=graph,
      raw_file_patterns={'train': [raw_train]})
  assert rows(on_the_fly) == rows(InputPipelineConfig())


def test_without_materialization_the_tuned_pipeline_transforms_on_the_fly(
    run):
  config = _tuned_config(run, 'OnTheFlyTransform')
  assert config.transform_placement == 'on_the_fly'
  assert config.transform_graph_uri == run('OnTheFlyTransform',
                                           'transform_graph')
  graph = tft.TFTransformOutput(config.transform_graph_uri)
  dataset = input_pipeline.build_dataset(
      ['unused'], graph.transformed_feature_spec(), taxi_module.LABEL_KEY, 64,
      config, num_epochs=1, drop_remainder=False, split='eval')
  materialized = input_pipeline.build_dataset(
      [os.path.join(run('OptimizedTransform', 'transformed_examples'),
                    'Split-eval', '*')], graph.transformed_feature_spec(),
      taxi_module.LABEL_KEY, 64, InputPipelineConfig(), num_epochs=1,
      drop_remainder=False)
  # Another Transform run: same examples, analyzers equal up to float noise.
  ours, theirs = (sorted(r) for r in (_rows(dataset), _rows(materialized)))
  assert len(ours) == len(theirs)
  np.testing.assert_allclose([[v for _, v in r] for r in ours],
                             [[v for _, v in r] for r in theirs], rtol=1e-5)


def _properties(run, uri):
  store = mlmd.read_only_store(run.metadata_path)
  [artifact] = [a for a in store.get_artifacts_by_type(
      TunedInputPipeline.TYPE_NAME)
                if a.uri == uri]
  return dict(artifact.custom_properties.items())


def test_artifact_has_config_report_chart_and_properties(run):
  uri = run('OptimizedTransform', 'tuned_input_pipeline')
  assert sorted(os.listdir(uri)) == ['candidates.png', 'config.json',
                                     'fingerprint.json', 'report.md']
  with open(os.path.join(uri, 'report.md')) as f:
    text = f.read()
  assert 'limited by: **' in text and 'decision: **' in text
  assert 'Batch mismatch' not in text
  props = _properties(run, uri)
  assert props['bottleneck_stage'].string_value in (
      'read', 'parse', 'transform', 'batch', 'not measured')
  assert props['transform_placement'].string_value == 'materialized'
  # Measured at the trainer's batch, the consumer too (the module has
  # build_model), and the decision follows the verdict.
  assert props['batch_size'].int_value == BATCH
  assert 'build_model' in props['consumer_source'].string_value
  reader = props['examples_per_sec'].double_value
  model = props['consumer_examples_per_sec'].double_value
  # The verdict's consumer rate is the one on the artifact.
  assert f"the consumer's {model:,.0f}" in text
  # Which one depends on this machine's speed; it follows the verdict.
  stopped = props['decision'].string_value == tuner.STOPPED_EARLY
  assert stopped == (props['input_bound'].int_value == 0)
  if stopped:
    assert props['num_candidates'].int_value == 1
    assert 'not input-bound' in text
    # The kept default reader outran the model by the configured ratio.
    assert reader >= TuningConfig(**TUNING).input_bound_ratio * model > 0
  else:
    assert props['decision'].string_value == tuner.SEARCHED
  # The example count is exact (the Beam write counted it).
  _, train = _records(os.path.join(
      run('StockTransform', 'transformed_examples'), 'Split-train'))
  assert props['num_examples'].int_value == len(train)
  with open(os.path.join(uri, 'fingerprint.json')) as f:
    fingerprint = json.load(f)
  assert fingerprint['num_examples'] == len(train)
  assert fingerprint['batch_size'] == BATCH


def test_second_run_reuses_the_unchanged_tuning(run):
  [first, second] = run.runs('OnTheFlyTransform', 'tuned_input_pipeline')
  assert _properties(run, first)['decision'].string_value == tuner.SEARCHED
  props = _properties(run, second)
  with open(os.path.join(second, 'report.md')) as f:
    text = f.read()
  assert first in text  # The reused artifact is named.
  assert props['decision'].string_value == tuner.REUSED, text
  # The same knobs and placement; the paths are this run's own.
  old, new = (_tuned_config_at(uri) for uri in (first, second))
  assert decisions.knob_changes(new) == decisions.knob_changes(old)
  assert new.transform_placement == old.transform_placement == 'on_the_fly'
  assert new.transform_graph_uri == run.runs('OnTheFlyTransform',
                                             'transform_graph')[1]
