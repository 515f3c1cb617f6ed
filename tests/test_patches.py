"""Every patch of TFX/TF internals fits the installed libraries, fails loudly
when it does not, and is installed reference-counted (fast)."""

import threading

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
  with patches.installed(patch):
    assert patches.users(patch) == 1
  assert patches.users(patch) == 0


def test_a_moved_symbol_fails_naming_the_expected_version():
  moved = patches.Patch(
      'moved', 'tfx', 'a test', (patches.Symbol(
          'tfx.components.transform.executor:TransformProcessor._Gone'),))
  with pytest.raises(patches.PatchError,
                     match=r"patch 'moved' \(a test\) was written for TFX "
                     r'1\.16; .*TransformProcessor\._Gone is missing in the '
                     r'installed TFX 1\.16'):
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


def test_another_library_version_fails_naming_both(monkeypatch):
  monkeypatch.setitem(patches.EXPECTED_VERSIONS, 'tensorflow', '2.15')
  with pytest.raises(patches.PatchError,
                     match=r"'autograph_skips_tf_keras' .* written for "
                     r'TensorFlow 2\.15; installed: TensorFlow 2\.16\.'):
    with patches.installed(patches.AUTOGRAPH_SKIPS_TF_KERAS):
      pass


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


def test_autograph_rule_lasts_only_while_installed():
  from tensorflow.python.autograph.core import config  # pylint: disable=g-import-not-at-top
  before = config.CONVERSION_RULES
  assert not any(rule.matches('tf_keras.src.engine') for rule in before)
  with patches.installed(patches.AUTOGRAPH_SKIPS_TF_KERAS):
    assert config.CONVERSION_RULES[0].matches('tf_keras.src.engine')
    assert config.CONVERSION_RULES[1:] == before
  assert config.CONVERSION_RULES == before
