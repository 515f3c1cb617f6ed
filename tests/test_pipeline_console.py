"""The console of a pipeline run: a progress report; everything in the file."""

import inspect
import io
import logging
import warnings

from absl import logging as absl_logging
import pytest

from pipelines import console


@pytest.fixture
def configured(tmp_path):
  """configure(...) on the root logger, undone afterwards."""
  root = logging.getLogger()
  level = root.level
  installed = []

  def configure(verbose):
    stream = io.StringIO()
    log_file = tmp_path / f'run-{verbose}.log'
    installed.extend(console.configure(str(log_file), verbose=verbose,
                                       stream=stream))
    return stream, log_file

  yield configure
  for handler in installed:
    root.removeHandler(handler)
    handler.close()
  root.setLevel(level)
  logging.captureWarnings(False)


def _a_component_runs():
  """What a LocalDagRunner run logs around and inside one component."""
  absl_logging.info('Component %s is running.', 'Trainer')
  absl_logging.info('Running executor for %s with inputs %s', 'Trainer',
                    {'examples': ['<node proto and artifact dicts>']})
  logging.getLogger('apache_beam.runners.direct').info('Beam says hello')
  logging.getLogger('tfx_hpm.trainer').info(
      'Training step 500/1000 (50%%), loss %.4f', 0.4567)
  with warnings.catch_warnings():
    warnings.simplefilter('always')
    warnings.warn('a library deprecation', FutureWarning)
  absl_logging.warning('the schema has no domain for %s', 'tips')
  absl_logging.info('Component %s is finished.', 'Trainer')


def test_console_shows_progress_and_the_file_keeps_everything(configured):
  stream, log_file = configured(verbose=False)
  _a_component_runs()
  shown = stream.getvalue()
  lines = [line.split(' ', 1)[1] for line in shown.splitlines()]
  assert lines[:4] == [
      '[Trainer] started',
      '[Trainer] Training step 500/1000 (50%), loss 0.4567',
      '[Trainer] WARNING: the schema has no domain for tips',
  ] + [lines[3]], shown
  assert lines[3].startswith('[Trainer] done in ') and lines[3].endswith(' s')
  assert len(lines) == 4, shown
  for hidden in ('Running executor', 'Beam says hello', 'FutureWarning'):
    assert hidden not in shown
  kept = log_file.read_text()
  for line in ('Component Trainer is running.', 'Running executor for Trainer',
               'Beam says hello', 'Training step 500/1000',
               'FutureWarning: a library deprecation',
               'the schema has no domain', 'Component Trainer is finished.'):
    assert line in kept, kept


def test_verbose_console_shows_everything(configured):
  stream, log_file = configured(verbose=True)
  _a_component_runs()
  shown = stream.getvalue()
  assert shown == log_file.read_text()
  assert 'Running executor for Trainer' in shown
  assert 'Beam says hello' in shown and 'FutureWarning' in shown


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
