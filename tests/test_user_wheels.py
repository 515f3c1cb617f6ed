"""Unzipped user wheels against pip's install of the same TFX-built wheel."""

import os
import subprocess
import sys
import zipfile

from tfx.components.util import udf_utils

from components import patches
from components import user_wheels


def _tfx_wheel(tmp_path):
  """The wheel TFX builds for a module file (as LocalDagRunner does)."""
  module_dir = tmp_path / 'module'
  module_dir.mkdir()
  (module_dir / 'user_module.py').write_text(
      'from helper import VALUE\n\ndef run_fn(fn_args):\n  return VALUE\n')
  (module_dir / 'helper.py').write_text('VALUE = 42\n')
  wheel, module_key = udf_utils.package_user_module_file(
      'Trainer', str(module_dir / 'user_module.py'), str(tmp_path / 'root'))
  return wheel, module_key


def _files(root):
  """Relative paths, without what pip adds (bytecode, its own records)."""
  found = set()
  for folder, dirs, files in os.walk(root):
    dirs[:] = [d for d in dirs if d != '__pycache__']
    for name in files:
      rel = os.path.relpath(os.path.join(folder, name), root)
      if name not in ('RECORD', 'INSTALLER', 'REQUESTED', 'direct_url.json'):
        found.add(rel)
  return found


def test_unzipped_wheel_matches_pip_install(tmp_path):
  wheel, _ = _tfx_wheel(tmp_path)
  assert user_wheels.is_pure_wheel(wheel)
  ours = user_wheels.install_to_temp_directory(wheel, str(tmp_path / 'ours'))
  pip = udf_utils.install_to_temp_directory(wheel, str(tmp_path / 'pip'))
  assert _files(ours) == _files(pip)
  for rel in _files(pip):
    with open(os.path.join(ours, rel), 'rb') as a, open(
        os.path.join(pip, rel), 'rb') as b:
      assert a.read() == b.read(), rel
  # The module and its sibling import from the unzipped tree.
  out = subprocess.run(
      [sys.executable, '-c',
       'import user_module; print(user_module.run_fn(0))'],
      env={**os.environ, 'PYTHONPATH': ours}, capture_output=True, text=True,
      check=True)
  assert out.stdout.strip() == '42'


def test_other_dependencies_go_to_pip(tmp_path):
  wheel, _ = _tfx_wheel(tmp_path)
  impure = tmp_path / 'impure-0.0-py3-none-any.whl'
  with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(impure, 'w') as dst:
    for item in src.infolist():
      dst.writestr(item, src.read(item.filename))
    dst.writestr('impure-0.0.data/scripts/tool', '#!/bin/sh\n')
  assert not user_wheels.is_pure_wheel(str(impure))
  assert not user_wheels.is_pure_wheel('setuptools==18.0')
  assert not user_wheels.is_pure_wheel(str(tmp_path / 'missing.whl'))
  not_a_zip = tmp_path / 'broken-0.0-py3-none-any.whl'
  not_a_zip.write_bytes(b'not a wheel')
  assert not user_wheels.is_pure_wheel(str(not_a_zip))


def test_unzipped_installs_restores_the_stock_function(tmp_path):
  stock = udf_utils.install_to_temp_directory
  wheel, _ = _tfx_wheel(tmp_path)
  with patches.installed(patches.UNZIPPED_WHEEL_INSTALLS):
    assert udf_utils.install_to_temp_directory is not stock
    # What TFX's executors call: installs with the unzipping function.
    with udf_utils.TempPipInstallContext([wheel]) as context:
      assert os.path.isfile(os.path.join(context.temp_directory,
                                         'helper.py'))
  assert udf_utils.install_to_temp_directory is stock
