"""End to end: the taxi pipeline runs under LocalDagRunner and pushes a model
that serves raw tf.Examples."""

import glob
import os
import re
import subprocess
import sys

from ml_metadata import metadata_store
import pytest
import tensorflow as tf
from tfx.orchestration import metadata

from pipelines import summary

pytestmark = pytest.mark.slow

# On the 2,000-row sample the eval split is 76.7% "no tip": a model that
# learned nothing scores ~0.767, so the bless bound must lie above that.
# After 600 steps both trainers reached 0.797 here (stock and hpm alike, as
# the same bound in test_gcs_pipeline.py and test_kubeflow_run.py found).
TRAIN_STEPS = 600
ACCURACY_THRESHOLD = 0.78


def _run_pipeline(tmp_path, data_root, *extra_flags):
  root = tmp_path / 'root'
  cmd = [sys.executable, '-m', 'pipelines.local_runner',
         '--data-root', data_root, '--pipeline-root', str(root),
         '--train-steps', str(TRAIN_STEPS), '--eval-steps', '5',
         '--accuracy-threshold', str(ACCURACY_THRESHOLD), *extra_flags]
  # As from a plain shell: the runner itself makes tf.keras Keras 2 (with
  # Keras 3 the stock module failed: 'Functional' object has no attribute
  # 'input_names').
  env = {k: v for k, v in os.environ.items() if k != 'TF_USE_LEGACY_KERAS'}
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                        env=env)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
  return root, proc


def _assert_console_is_a_progress_report(console, stdout, root, variant):
  """Per component: started, done in N s; the trainer's progress lines;
  TFX's INFO (node protos, artifact dicts) only in the log file."""
  for node in ('CsvExampleGen', 'Transform', 'Trainer', 'Evaluator',
               'Pusher'):
    assert f'[{node}] started' in console, console
    assert re.search(rf'\[{node}\] done in \d+\.\d s', console), console
  if variant == 'hpm':
    assert re.search(rf'\[Trainer\] Training step {TRAIN_STEPS}/'
                     rf'{TRAIN_STEPS} \(100%\), loss \d', console), console
  assert 'Running launcher for' not in console
  [log_file] = glob.glob(str(root / 'logs' / '*.log'))
  assert f'full log: {log_file}' in stdout
  with open(log_file) as f:
    log = f.read()
  assert 'Running launcher for' in log and '[Trainer] started' not in log


def _assert_found_by_the_stock_execution_types(root, variant):
  """As TFX's own e2e tests query MLMD; ours say who they are."""
  store = metadata_store.MetadataStore(
      metadata.sqlite_metadata_connection_config(str(root / 'metadata.db')))
  ours = {'Transform': 'components.transform.component.OptimizedTransform',
          'Trainer': 'components.trainer.component.HighPerfTrainer'}
  for node, stock_type in (
      ('Transform', 'tfx.components.transform.component.Transform'),
      ('Trainer', 'tfx.components.trainer.component.Trainer')):
    [execution] = store.get_executions_by_type(stock_type)
    recorded = execution.custom_properties.get('component_class')
    if variant == 'hpm':
      assert recorded.string_value == ours[node]
    else:
      assert recorded is None


def _raw_eval_examples(root, count=16):
  files = glob.glob(str(root / 'CsvExampleGen' / 'examples' / '*' /
                        'Split-eval' / '*'))
  assert files, 'CsvExampleGen wrote no eval split'
  dataset = tf.data.TFRecordDataset(files, compression_type='GZIP')
  return [record.numpy() for record in dataset.take(count)]


@pytest.mark.parametrize('variant', ['stock', 'hpm'])
def test_pipeline_runs_and_pushed_model_serves_raw_examples(
    tmp_path, taxi_sample_dir, variant):
  flags = ['--stock'] if variant == 'stock' else []
  root, proc = _run_pipeline(tmp_path, taxi_sample_dir, *flags)
  stdout = proc.stdout

  run = summary.read_run(str(root / 'metadata.db'))
  nodes = {e.node_id: e.state for e in run.executions}
  assert set(nodes) >= {'CsvExampleGen', 'StatisticsGen', 'SchemaGen',
                        'ExampleValidator', 'Transform', 'Trainer',
                        'Evaluator', 'Pusher'}
  assert all(state == 'COMPLETE' for state in nodes.values()), nodes
  assert run.blessed is True
  assert run.metrics['binary_accuracy'] >= ACCURACY_THRESHOLD, run.metrics
  assert '=== tfx-hpm pipeline summary ===' in stdout
  _assert_console_is_a_progress_report(proc.stderr, stdout, root, variant)
  assert run.pushed_model and os.path.isdir(run.pushed_model)
  _assert_found_by_the_stock_execution_types(root, variant)

  model = tf.saved_model.load(run.pushed_model)
  serve = model.signatures['serving_default']
  examples = _raw_eval_examples(root)
  outputs = serve(examples=tf.constant(examples))['outputs'].numpy()
  assert outputs.shape[0] == len(examples)
  assert ((outputs >= 0) & (outputs <= 1)).all()
  transformed = model.signatures['transform_features'](
      examples=tf.constant(examples))
  assert 'tips_xf' in transformed
