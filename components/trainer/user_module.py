"""The one loader of the user module, for the executor and every process.

A module is named by an importable path (`module_path`, or the module of a
`run_fn`) or given as a file, which may live on any `tf.io.gfile` filesystem
(gs://, s3://): such a file is copied to a local folder first. No TFX import.
"""

import importlib
import importlib.util
import os
import tempfile
from types import ModuleType
from typing import Optional

import tensorflow as tf


def load(module_file: Optional[str], module_path: Optional[str] = None,
         run_fn: Optional[str] = None) -> ModuleType:
  """Imports the user module from `module_path`, `run_fn` or `module_file`."""
  if module_path or run_fn:
    return importlib.import_module(module_path or run_fn.rpartition('.')[0])
  if not module_file:
    raise ValueError('No module_file, module_path or run_fn names the user '
                     'module.')
  path = module_file
  if not os.path.exists(path):
    path = os.path.join(tempfile.mkdtemp(prefix='hpm-module-'),
                        os.path.basename(module_file))
    tf.io.gfile.copy(module_file, path)
  spec = importlib.util.spec_from_file_location(
      os.path.splitext(os.path.basename(path))[0], path)
  if spec is None:
    raise ValueError(f'module_file {module_file!r} is not a Python file.')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def count_weights(module: ModuleType, hparams) -> Optional[int]:
  """The weights of the module's model (`build_model(hparams)`) where its
  build creates them (a functional or sequential model with inputs); None
  where it does not (a subclassed model builds on its first call) or the
  build fails (the training reports that failure itself)."""
  try:
    model = module.build_model(hparams)
    return int(model.count_params()) if model.built else None
  except Exception:  # pylint: disable=broad-except
    return None


def describe_module(module_file: Optional[str] = None,
                    module_path: Optional[str] = None,
                    run_fn: Optional[str] = None) -> str:
  """How errors name the user module (the stock Trainer's parameters)."""
  for name, value in (('module_file', module_file),
                      ('module_path', module_path), ('run_fn', run_fn)):
    if value:
      return f'{name} {value!r}'
  return 'the user module'
