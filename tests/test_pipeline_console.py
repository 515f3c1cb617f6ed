"""The console of a pipeline run: a progress report; everything in the file."""

import argparse
import inspect
import io
import logging
import os
import signal
import subprocess
import sys
import textwrap
import warnings

from absl import logging as absl_logging
import pytest

from components.trainer.cluster import supervisor
from pipelines import console

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def configured(tmp_path):
  """configure(...) on the root logger, undone afterwards."""
  root = logging.getLogger()
  level = root.level
  installed = []

  def configure(verbose):
    stream = io.StringIO()
    log_file = tmp_path / f'run-{verbose}.log'
    report, file_handler = console.configure(str(log_file), verbose=verbose,
                                             stream=stream)
    installed.extend([report, file_handler])
    return stream, log_file, report

  yield configure
  for handler in installed:
    root.removeHandler(handler)
    handler.close()
  root.setLevel(level)
  logging.captureWarnings(False)


def _a_component_runs():
  """What a LocalDagRunner run logs around and inside one component (this
  test module stands for TFX, Beam and TensorFlow code)."""
  absl_logging.info('Component %s is running.', 'Trainer')
  absl_logging.info('Running executor for %s with inputs %s', 'Trainer',
                    {'examples': ['<node proto and artifact dicts>']})
  logging.getLogger('apache_beam.runners.direct').info('Beam says hello')
  logging.getLogger('tfx_hpm.trainer').info(
      'Training step 500/1000 (50%%), loss %.4f', 0.4567)
  with warnings.catch_warnings():
    warnings.simplefilter('always')
    warnings.warn('a library deprecation', FutureWarning)
  absl_logging.warning('ArtifactQuery.property_predicate is not supported.')
  # A warning from our own code (absl, like TFX's).
  supervisor.SigtermForwarder()._forward(signal.SIGTERM, None)  # pylint: disable=protected-access
  absl_logging.error('an error from anywhere')
  absl_logging.info('Component %s is finished.', 'Trainer')


def test_console_shows_progress_and_the_file_keeps_everything(configured):
  stream, log_file, report = configured(verbose=False)
  _a_component_runs()
  shown = stream.getvalue()
  lines = [line.split(' ', 1)[1] for line in shown.splitlines()]
  assert lines[:4] == [
      '[Trainer] started',
      '[Trainer] Training step 500/1000 (50%), loss 0.4567',
      '[Trainer] WARNING: SIGTERM: forwarding the preemption notice to []',
      '[Trainer] ERROR: an error from anywhere',
  ], shown
  assert len(lines) == 5, shown
  assert lines[4].startswith('[Trainer] done in ') and lines[4].endswith(' s')
  for hidden in ('Running executor', 'Beam says hello', 'FutureWarning',
                 'property_predicate'):
    assert hidden not in shown
  assert report.warnings_in_file == 2  # The FutureWarning, TFX's warning.
  kept = log_file.read_text()
  for line in ('Component Trainer is running.', 'Running executor for Trainer',
               'Beam says hello', 'Training step 500/1000',
               'FutureWarning: a library deprecation', 'property_predicate',
               'SIGTERM: forwarding', 'an error from anywhere',
               'Component Trainer is finished.'):
    assert line in kept, kept


def test_verbose_console_shows_everything(configured):
  stream, log_file, _ = configured(verbose=True)
  _a_component_runs()
  shown = stream.getvalue()
  assert shown == log_file.read_text()
  assert 'Running executor for Trainer' in shown
  assert 'Beam says hello' in shown and 'FutureWarning' in shown


def test_output_outside_logging_goes_to_the_file(tmp_path):
  """TensorFlow's C++ lines and children's output (the module wheel build,
  pip) go to the log file; the report, prints and tracebacks to the
  console."""
  log_file = tmp_path / 'run.log'
  proc = subprocess.run([sys.executable, '-c', textwrap.dedent(f"""
      import logging, os, subprocess
      from pipelines import console
      console.redirect_output({str(log_file)!r})
      console.configure({str(log_file)!r})
      os.write(2, b'E cuda_fft.cc:479] Unable to register cuFFT factory\\n')
      subprocess.check_call(['echo', 'running bdist_wheel'])
      logging.getLogger('tfx_hpm.trainer').info('Training step 1/2')
      print('=== summary ===')
      raise ValueError('boom')
      """)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
                        check=False)
  assert proc.returncode == 1
  assert proc.stdout == '=== summary ===\n'
  assert 'Training step 1/2' in proc.stderr
  assert 'ValueError: boom' in proc.stderr
  assert 'cuFFT' not in proc.stderr and 'bdist_wheel' not in proc.stdout
  kept = log_file.read_text()
  assert 'Unable to register cuFFT factory' in kept
  assert 'running bdist_wheel' in kept and 'Training step 1/2' in kept


def test_tfx_logs_the_records_the_console_reads():
  """The start and end records are TFX's own, matched by format string."""
  # pylint: disable-next=g-import-not-at-top
  from tfx.orchestration.local import local_dag_runner
  source = inspect.getsource(local_dag_runner)
  assert "logging.info('Component %s is running.', node_id)" in source
  assert "logging.info('Component %s is finished.', node_id)" in source
  # pylint: disable-next=g-import-not-at-top
  from tfx.orchestration.beam import beam_dag_runner
  source = inspect.getsource(beam_dag_runner)
  assert "logging.info('node %s is running.', self._node_id)" in source
  assert "logging.info('node %s is finished.', self._node_id)" in source


@pytest.mark.parametrize('root,mlmd,logs', [
    ('root', 'root/metadata.db', 'root/logs'),
    ('gs://bucket/root', 'outputs/metadata/taxi_hpm.db', 'outputs/logs'),
])
def test_metadata_and_log_file_follow_the_pipeline_root(tmp_path, monkeypatch,
                                                        root, mlmd, logs):
  """A local root keeps MLMD and the log under it; a remote one in outputs/
  of the working directory (both absolute, as the runners print them)."""
  # pylint: disable-next=g-import-not-at-top
  from pipelines import cli
  monkeypatch.chdir(tmp_path)
  parser = argparse.ArgumentParser()
  cli.add_pipeline_flags(parser)
  args = parser.parse_args(['--pipeline-root', root])
  assert cli.metadata_path(args) == str(tmp_path / mlmd)
  log_file = cli.log_path(args)
  assert os.path.dirname(log_file) == str(tmp_path / logs)
  assert os.path.basename(log_file).startswith('taxi_hpm-')
  assert log_file.endswith('.log') and os.path.isdir(tmp_path / logs)
