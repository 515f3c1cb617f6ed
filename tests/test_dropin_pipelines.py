"""Drop-in for stock TFX pipelines: no I/O at construction, stock shapes.

Constructing our components (and compiling a pipeline for Kubeflow) must
work on a machine that cannot reach the pipeline's storage: here every
gs:// access raises, and importing the user's modules raises too.
"""

import importlib
import importlib.util

import pytest
import tensorflow as tf
from tensorflow.python.lib.io import file_io
from tfx import v1 as tfx
from tfx.dsl.io import fileio
from tfx.types import standard_artifacts

from components import GPipePartitioner
from components import HighPerfTrainer
from components import OptimizedTransform

BUCKET = 'gs://no-such-bucket-tfx-hpm'
# User modules that must not be imported at construction.
USER_PACKAGE = 'tfx_hpm_user_code'


class GcsAccessed(AssertionError):
  """Raised for any gs:// access or user-module import (not an OSError, so
  that no caller mistakes it for a missing file)."""


def _guard(function, name):
  def guarded(*args, **kwargs):
    for arg in list(args) + list(kwargs.values()):
      if isinstance(arg, (str, bytes)) and (
          arg[:5] in ('gs://', b'gs://')):
        raise GcsAccessed(f'{name}({arg!r}) at construction')
    return function(*args, **kwargs)
  return guarded


@pytest.fixture
def no_storage_no_user_code(monkeypatch):
  """Every gs:// access through tf.io.gfile or TFX fileio, and every import
  of USER_PACKAGE, raises GcsAccessed."""
  for module in (tf.io.gfile, file_io):
    for name in dir(module):
      value = getattr(module, name)
      if not name.startswith('_') and callable(value):
        monkeypatch.setattr(module, name, _guard(value, name))
  monkeypatch.setattr(fileio, '_get_filesystem',
                      _guard(fileio._get_filesystem, 'fileio'))  # pylint: disable=protected-access

  def no_user_import(function):
    def guarded(name, *args, **kwargs):
      if name.split('.')[0] == USER_PACKAGE:
        raise GcsAccessed(f'imported user module {name!r}')
      return function(name, *args, **kwargs)
    return guarded

  monkeypatch.setattr(importlib, 'import_module',
                      no_user_import(importlib.import_module))
  monkeypatch.setattr(importlib.util, 'find_spec',
                      no_user_import(importlib.util.find_spec))
  monkeypatch.setattr(importlib.util, 'spec_from_file_location',
                      _guard(importlib.util.spec_from_file_location,
                             'spec_from_file_location'))


def _imported(artifact_type, name):
  return tfx.dsl.Importer(source_uri=f'{BUCKET}/{name}',
                          artifact_type=artifact_type).with_id(
                              f'import_{name}')


def test_guard_catches_gcs_access_and_user_imports(no_storage_no_user_code):
  """The fixture itself: the accesses construction must not make."""
  with pytest.raises(GcsAccessed):
    tf.io.gfile.exists(f'{BUCKET}/module.py')
  with pytest.raises(GcsAccessed):
    fileio.exists(f'{BUCKET}/module.py')
  with pytest.raises(GcsAccessed):
    importlib.import_module(f'{USER_PACKAGE}.trainer_module')


def test_components_construct_without_io_or_user_code(
    no_storage_no_user_code):
  examples = _imported(standard_artifacts.Examples, 'examples')
  schema = _imported(standard_artifacts.Schema, 'schema')
  transform = OptimizedTransform(
      examples=examples.outputs['result'], schema=schema.outputs['result'],
      module_file=f'{BUCKET}/preprocessing.py',
      tuning={'num_output_shards': 2})
  partitioner = GPipePartitioner(
      config={'batch_size': 64, 'num_stages': 2},
      module_file=f'{BUCKET}/model.py',
      examples=transform.outputs['transformed_examples'],
      transform_graph=transform.outputs['transform_graph'])
  GPipePartitioner(config={'batch_size': 64, 'num_stages': 2},
                   module_path=f'{USER_PACKAGE}.model')
  trainer = HighPerfTrainer(
      examples=transform.outputs['transformed_examples'],
      transform_graph=transform.outputs['transform_graph'],
      module_file=f'{BUCKET}/trainer.py',
      partition_plan=partitioner.outputs['partition_plan'],
      train_args=tfx.proto.TrainArgs(num_steps=10),
      distribution={'global_batch_size': 64})
  assert trainer.exec_properties['module_file'] == f'{BUCKET}/trainer.py'
  # A module installed in the image, named, not imported.
  by_name = HighPerfTrainer(
      examples=examples.outputs['result'], schema=schema.outputs['result'],
      module_file=f'{USER_PACKAGE}.trainer_module')
  assert by_name.exec_properties['module_path'] == (
      f'{USER_PACKAGE}.trainer_module')
  HighPerfTrainer(examples=examples.outputs['result'],
                  run_fn=f'{USER_PACKAGE}.trainer_module.run_fn')
  # Config values are still checked here, without I/O.
  with pytest.raises(ValueError, match="strategy='horovod'"):
    HighPerfTrainer(examples=examples.outputs['result'],
                    module_file=f'{BUCKET}/trainer.py',
                    distribution={'strategy': 'horovod'})
  with pytest.raises(ValueError, match='batch_size 40 is not divisible'):
    GPipePartitioner(config={'batch_size': 40, 'num_microbatches': 16},
                     module_file=f'{BUCKET}/model.py')
