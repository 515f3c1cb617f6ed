"""End to end: the taxi pipeline runs under LocalDagRunner and pushes a model
that serves raw tf.Examples."""

import glob
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from pipelines import summary
from tests.support import console_report

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
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
  return root, proc


def _raw_eval_examples(root, count=16):
  files = glob.glob(str(root / 'CsvExampleGen' / 'examples' / '*' /
                        'Split-eval' / '*'))
  assert files, 'CsvExampleGen wrote no eval split'
  dataset = tf.data.TFRecordDataset(files, compression_type='GZIP')
  return [record.numpy() for record in dataset.take(count)]


def test_pipeline_runs_and_pushed_model_serves_raw_examples(
    tmp_path, taxi_sample_dir):
  """The tfx-hpm pipeline as `make run` runs it. (The stock variant runs in
  tests/test_gcs_pipeline.py::test_stock_pipeline_on_gcs.)"""
  root, proc = _run_pipeline(tmp_path, taxi_sample_dir)
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
  [log_file] = glob.glob(str(root / 'logs' / '*.log'))
  console_report.assert_progress_report(proc.stderr, stdout, log_file, 'hpm',
                                        TRAIN_STEPS)
  assert run.pushed_model and os.path.isdir(run.pushed_model)

  model = tf.saved_model.load(run.pushed_model)
  serve = model.signatures['serving_default']
  examples = _raw_eval_examples(root)
  outputs = serve(examples=tf.constant(examples))['outputs'].numpy()
  assert outputs.shape[0] == len(examples)
  assert ((outputs >= 0) & (outputs <= 1)).all()
  transformed = model.signatures['transform_features'](
      examples=tf.constant(examples))
  assert 'tips_xf' in transformed
