"""What `pip install` puts where: our `kubeflow` modules join the namespace
the Kubeflow SDKs share (kubeflow.training, kubeflow.trainer) instead of
shadowing it."""

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile

import tfx

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ('components', 'pipelines', 'kubeflow', 'benchmarks')


def _build_wheel(tmp_path) -> str:
  """The tfx-hpm wheel, built from a copy (a build writes build/ in-tree)."""
  source = tmp_path / 'source'
  source.mkdir()
  shutil.copy(os.path.join(REPO, 'setup.py'), source)
  for name in PACKAGES:
    shutil.copytree(os.path.join(REPO, name), source / name,
                    ignore=shutil.ignore_patterns('__pycache__', 'results'))
  subprocess.run([sys.executable, '-m', 'pip', 'wheel', '--quiet', '--no-deps',
                  '--no-build-isolation', '-w', str(tmp_path / 'dist'),
                  str(source)], check=True)
  (wheel,) = (tmp_path / 'dist').iterdir()
  return str(wheel)


def test_installed_kubeflow_modules_leave_other_portions_importable(tmp_path):
  wheel = _build_wheel(tmp_path)
  names = zipfile.ZipFile(wheel).namelist()
  assert 'kubeflow/runner.py' in names and 'kubeflow/entrypoint.py' in names
  # A kubeflow/__init__.py would make ours a regular package that hides
  # every other kubeflow.* distribution.
  assert 'kubeflow/__init__.py' not in names
  assert {name.split('/')[0] for name in names
          if not name.startswith('tfx_hpm-')} == set(PACKAGES)

  target = tmp_path / 'installed'
  subprocess.run([sys.executable, '-m', 'pip', 'install', '--quiet',
                  '--no-deps', '--target', str(target), wheel], check=True)
  # Another distribution's portion, as kubeflow-training installs one.
  other = tmp_path / 'other' / 'kubeflow' / 'training'
  other.mkdir(parents=True)
  (other / '__init__.py').write_text('SDK = "kubeflow.training"\n')

  script = textwrap.dedent(f"""
      import runpy, sys
      import kubeflow.training
      assert kubeflow.training.SDK == 'kubeflow.training'
      import kubeflow.runner
      assert kubeflow.runner.__file__.startswith({str(target)!r}), (
          kubeflow.runner.__file__)
      sys.argv = ['kubeflow.runner', '--help']
      runpy.run_module('kubeflow.runner', run_name='__main__')
  """)
  # -S: no site-packages .pth files, so an editable checkout of tfx-hpm is
  # not on the path; the installed copy and the dependencies are.
  dependencies = os.path.dirname(os.path.dirname(tfx.__file__))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [str(tmp_path / 'other'), str(target), dependencies]))
  result = subprocess.run([sys.executable, '-S', '-c', script], env=env,
                          cwd=str(tmp_path), capture_output=True, text=True,
                          check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert '--pipeline-root' in result.stdout
