"""Every patch of TFX/TF internals fits the installed libraries, fails loudly
when it does not, and is installed reference-counted (fast)."""

import threading
from unittest import mock

import pytest
from tfx.components.transform import executor as transform_executor
from tfx.components.util import udf_utils

from components import patches
from components import user_wheels

_ENCODE = 'tfx.components.transform.executor:TransformProcessor._EncodeAndWrite'


@pytest.mark.parametrize('patch', patches.ALL, ids=lambda p: p.name)
def test_every_patched_symbol_is_where_the_patch_expects_it(patch):
  # Fails when TFX/TF moves, renames or re-signs a symbol a patch relies on.
  patches.check(patch)
  before = patches.users(patch)  # conftest keeps the DirectRunner one
  with patches.installed(patch):
    assert patches.users(patch) == before + 1
  assert patches.users(patch) == before


def test_a_moved_symbol_fails_naming_the_expected_version():
  moved = patches.Patch(
      'moved', 'tfx', 'a test', (patches.Symbol(
          'tfx.components.transform.executor:TransformProcessor._Gone'),))
  with pytest.raises(patches.PatchError,
                     match=r"patch 'moved' \(a test\) was written for TFX "
                     r'1\.16 to 1\.21; .*TransformProcessor\._Gone is '
                     r'missing in the installed TFX 1\.(16|21)'):
    with patches.installed(moved):
      pass
  assert patches.users(moved) == 0


def test_changed_parameters_fail():
  resigned = patches.Patch('resigned', 'tfx', 'a test', (patches.Symbol(
      _ENCODE, ('schema', 'output_path')),))
  with pytest.raises(patches.PatchError,
                     match=r"takes \('schema', 'file_format', 'output_path'\)"
                     r".* expects \('schema', 'output_path'\)"):
    patches.check(resigned)


def test_a_version_outside_the_supported_ends_fails_naming_both(
    monkeypatch):
  installed = patches.installed_version('tensorflow')
  monkeypatch.setitem(patches.SUPPORTED_VERSIONS, 'tensorflow',
                      ('2.14', '2.15'))
  with pytest.raises(patches.PatchError,
                     match=r"'autograph_skips_tf_keras' .* written for "
                     r'TensorFlow 2\.14 to 2\.15; installed: TensorFlow '
                     + installed.replace('.', r'\.')):
    with patches.installed(patches.AUTOGRAPH_SKIPS_TF_KERAS):
      pass


@pytest.mark.parametrize('version, supported', [
    ('1.15.1', False), ('1.16.0', True), ('1.17.2', True), ('1.21.0', True),
    ('1.22.0rc0', False), ('2.0.0', False), ('dev', False)])
def test_every_minor_between_the_ends_is_supported(version, supported):
  assert patches.supports('tfx', version) is supported


def test_each_lane_is_a_supported_end():
  # The locks pin the two ends; whichever lane runs is one of them.
  for library in ('tfx', 'tensorflow'):
    minor = '.'.join(patches.installed_version(library).split('.')[:2])
    assert minor in patches.SUPPORTED_VERSIONS[library]


def test_a_failed_install_undoes_the_ones_before_it(monkeypatch):
  stock = udf_utils.install_to_temp_directory
  broken = patches.Patch('broken', 'tfx', 'a test',
                         (patches.Symbol('tfx:no_such_module_attr'),))
  with pytest.raises(patches.PatchError, match='no_such_module_attr'):
    with patches.installed(patches.UNZIPPED_WHEEL_INSTALLS, broken):
      pass
  assert udf_utils.install_to_temp_directory is stock
  assert patches.users(patches.UNZIPPED_WHEEL_INSTALLS) == 0


def test_overlapping_users_keep_the_patch_until_the_last_leaves():
  # Two executors in two threads of one process (LocalDagRunner runs
  # independent components concurrently): the first to finish must not
  # restore the stock function under the other.
  stock = udf_utils.install_to_temp_directory
  first_in, second_in, first_out = (threading.Event() for _ in range(3))
  seen = {}

  def first():
    with patches.installed(patches.UNZIPPED_WHEEL_INSTALLS):
      first_in.set()
      second_in.wait(10)
    first_out.set()

  def second():
    first_in.wait(10)
    with patches.installed(patches.UNZIPPED_WHEEL_INSTALLS):
      second_in.set()
      first_out.wait(10)
      seen['after_first_left'] = udf_utils.install_to_temp_directory

  threads = [threading.Thread(target=first), threading.Thread(target=second)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(20)
  assert seen['after_first_left'] is user_wheels.install_to_temp_directory
  assert udf_utils.install_to_temp_directory is stock


def test_transform_processor_swap_is_undone():
  stock = transform_executor.TransformProcessor
  with patches.installed(patches.SHARDED_TRANSFORM_WRITES):
    swapped = transform_executor.TransformProcessor
    assert issubclass(swapped, stock) and swapped is not stock
    with patches.installed(patches.SHARDED_TRANSFORM_WRITES):
      assert transform_executor.TransformProcessor is swapped
  assert transform_executor.TransformProcessor is stock


def test_autograph_skips_tf_keras_adding_only_what_is_missing():
  from tensorflow.python.autograph.core import config  # pylint: disable=g-import-not-at-top
  before = config.CONVERSION_RULES
  # TF 2.16's rules lack tf_keras; TF 2.21's have it.
  stock_skips = any(rule.matches('tf_keras.src.engine') for rule in before)
  tf_minor = patches.installed_version('tensorflow').split('.')[:2]
  assert stock_skips == (tuple(map(int, tf_minor)) >= (2, 21))
  with patches.installed(patches.AUTOGRAPH_SKIPS_TF_KERAS):
    assert any(rule.matches('tf_keras.src.engine')
               for rule in config.CONVERSION_RULES)
    added = len(config.CONVERSION_RULES) - len(before)
    assert added == (0 if stock_skips else 1)
    assert config.CONVERSION_RULES[added:] == before
  assert config.CONVERSION_RULES == before


def test_the_direct_runner_runs_in_process_and_downloads_nothing(tmp_path):
  """Beam 2.78's DirectRunner would try Prism (a binary from GitHub) first;
  with the patch (conftest keeps it, as our entry points do) it runs the
  in-process FnApiRunner on both lanes, as Beam 2.60's does."""
  import apache_beam as beam  # pylint: disable=g-import-not-at-top
  from apache_beam.runners.portability.fn_api_runner import fn_runner  # pylint: disable=g-import-not-at-top
  assert patches.users(patches.DIRECT_RUNNER_IN_PROCESS) >= 1
  ran = []
  stock_run = fn_runner.FnApiRunner.run_pipeline

  def recording_run(self, pipeline, options):
    ran.append(type(self).__name__)
    return stock_run(self, pipeline, options)

  downloads = []

  def no_download(url, *args, **kwargs):
    del args, kwargs
    downloads.append(url)
    raise OSError('no network in this test')

  out = tmp_path / 'out'
  with mock.patch.object(fn_runner.FnApiRunner, 'run_pipeline',
                         recording_run), \
      mock.patch('urllib.request.urlopen', no_download), \
      mock.patch('apache_beam.runners.portability.prism_runner.urlopen',
                 no_download, create=True):
    with beam.Pipeline(argv=['--runner=DirectRunner']) as pipeline:
      _ = (pipeline | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * 2)
           | beam.io.WriteToText(str(out)))
  assert not downloads and ran == ['FnApiRunner']
  lines = []
  for path in tmp_path.glob('out*'):
    lines += path.read_text().split()
  assert sorted(map(int, lines)) == [2, 4, 6]


def test_private_reads_find_the_instance_attributes_they_rely_on():
  # A Symbol names what a class or module holds; these reads also rely on
  # instance attributes, which only real objects show.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from components.patches import tensorflow_internals  # pylint: disable=g-import-not-at-top
  manager = tensorflow_internals.cancellation_manager()
  read = tensorflow_internals.cancellable_reader(
      iter(tf.data.Dataset.range(3)), manager)
  assert int(read()) == 0 and int(read()) == 1
  dense = tf.keras.layers.Dense(1)
  model = tf.keras.Sequential([tf.keras.Input((2,)), dense])
  nodes = tensorflow_internals.graph_network_nodes(model)
  assert dense in {node.layer for depth in nodes.values() for node in depth}

  class Subclassed(tf.keras.Model):

    def call(self, inputs):
      return inputs

  assert tensorflow_internals.graph_network_nodes(Subclassed()) is None
  with pytest.raises(patches.PatchError,
                     match=r"patch 'cancellable_iterator_reads' .* written "
                     r'for TensorFlow 2\.16 to 2\.21; object objects have '
                     r'no _iterator_resource in the installed TensorFlow '
                     r'2\.(16|21)'):
    tensorflow_internals.cancellable_reader(object(), manager)


def test_a_private_read_checks_its_patch_once(monkeypatch):
  checked = []
  monkeypatch.setattr(patches, 'check', checked.append)
  monkeypatch.setattr(patches, '_required', set())
  for _ in range(3):
    patches.require(patches.SERVICE_SERVER_STOPS)
  assert checked == [patches.SERVICE_SERVER_STOPS]
