"""The user module's wheel, installed without a pip process.

TFX packages a component's module file as a pure-Python wheel and
pip-installs it (`pip install --target`, a new Python process: about 2.7 s
on a 2-core machine) every time it needs the module: three times in a stock
Transform step, once in a Trainer step. For a pure wheel (`Root-Is-Purelib:
true`, no `.data` folder, which is what TFX builds) pip's `--target` install
writes the wheel's files as they are (plus bytecode and its own RECORD
lines), so unzipping it gives the same importable tree. Anything else (a
requirement specifier, a wheel with scripts or data) still goes to pip.
`components.patches.UNZIPPED_WHEEL_INSTALLS` installs
`install_to_temp_directory` in TFX's place.
"""

import email.parser
import os
import tempfile
import zipfile
from typing import Optional

from absl import logging
from tfx.components.util import udf_utils

_STOCK_INSTALL = udf_utils.install_to_temp_directory


def is_pure_wheel(path: str) -> bool:
  """A local .whl whose files all install into the target folder as is."""
  if not (path.endswith('.whl') and os.path.isfile(path)):
    return False
  try:
    with zipfile.ZipFile(path) as wheel:
      names = wheel.namelist()
      metadata = [n for n in names if n.count('/') == 1 and
                  n.endswith('.dist-info/WHEEL')]
      if len(metadata) != 1:
        return False
      fields = email.parser.Parser().parsestr(
          wheel.read(metadata[0]).decode('utf-8'))
  except (zipfile.BadZipFile, UnicodeDecodeError):
    return False
  has_data = any(n.split('/', 1)[0].endswith('.data') for n in names)
  return (fields.get('Root-Is-Purelib', '').strip().lower() == 'true' and
          not has_data)


def install_to_temp_directory(pip_dependency: str,
                              temp_dir: Optional[str] = None) -> str:
  """`udf_utils.install_to_temp_directory`, unzipping pure wheels."""
  if not is_pure_wheel(pip_dependency):
    return _STOCK_INSTALL(pip_dependency, temp_dir)
  temp_dir = temp_dir or tempfile.mkdtemp()
  with zipfile.ZipFile(pip_dependency) as wheel:
    wheel.extractall(temp_dir)  # Sanitizes absolute and '..' member names.
  logging.info('Unpacked the pure wheel %s into %s.', pip_dependency,
               temp_dir)
  return temp_dir

