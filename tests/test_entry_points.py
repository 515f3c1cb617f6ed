"""Our entry points work in a plain shell: without TF_USE_LEGACY_KERAS set
(Keras 3 would load, and TFX 1.16 needs tf-keras), and with a console as
clean as `make run`'s."""

import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _plain_env():
  """This environment without TF_USE_LEGACY_KERAS (the tests' conftest sets
  it for this process only)."""
  return {k: v for k, v in os.environ.items() if k != 'TF_USE_LEGACY_KERAS'}


@pytest.mark.parametrize('package', [
    'pipelines', 'benchmarks', 'kubeflow.runner', 'kubeflow.entrypoint',
    'components.trainer.process.entry'])
def test_importing_an_entry_package_makes_tf_keras_keras_2(package):
  """What `python -m <package>.<module>` imports first sets the variable
  before anything imports TensorFlow (`kubeflow` is a namespace package, so
  each of its entry modules does it itself)."""
  proc = subprocess.run(
      [sys.executable, '-c', f'import {package}\nimport tensorflow as tf\n'
       'print(tf.keras.Model.__module__)'],
      capture_output=True, text=True, timeout=300, env=_plain_env(),
      cwd=REPO_ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip().startswith('tf_keras.'), proc.stdout


def test_local_runner_help_in_a_plain_shell():
  proc = subprocess.run(
      [sys.executable, '-m', 'pipelines.local_runner', '--help'],
      capture_output=True, text=True, timeout=300, env=_plain_env(),
      cwd=REPO_ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert '--stock' in proc.stdout


def test_kubeflow_runner_console_shows_the_result_not_library_warnings(
    tmp_path):
  output = tmp_path / 'spec' / 'pipeline.json'
  proc = subprocess.run(
      [sys.executable, '-m', 'kubeflow.runner', '--output', str(output)],
      capture_output=True, text=True, timeout=300, env=_plain_env(),
      cwd=REPO_ROOT)
  assert proc.returncode == 0, proc.stderr[-3000:]
  log_file = tmp_path / 'spec' / 'pipeline.log'
  lines = proc.stdout.splitlines()
  assert lines[0] == f'Wrote {output}'
  assert len(lines) == 2 and proc.stderr == '', proc.stdout + proc.stderr
  log = log_file.read_text()
  # What would fill the console goes to the log: TensorFlow's C++ start-up
  # lines, and Python's warnings, counted on the console. TFX 1.16's stack
  # warns (FutureWarnings); TFX 1.21's compile warns nothing.
  assert 'cuda' in log.lower()
  warned = log.count(' W py.warnings ')
  if not warned:
    assert lines[1] == f'full log: {log_file}'
    return
  assert lines[1].startswith(f'full log: {log_file} (')
  assert lines[1].endswith(' warnings of TFX, TensorFlow and other '
                           'libraries there)')
  count = int(lines[1].split(' (')[1].split()[0])
  assert count >= warned
