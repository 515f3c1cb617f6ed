"""training_result.json: one writer, one reader that checks the version."""

import json

import pytest

from components.records import training_result


def test_written_with_its_version_and_read_back(tmp_path):
  training_result.write(str(tmp_path), {'steps': 3, 'mode': 'managed'})
  with open(tmp_path / training_result.FILE_NAME) as f:
    assert json.load(f)[training_result.VERSION_KEY] == (
        training_result.FORMAT_VERSION)
  assert training_result.read(str(tmp_path))['steps'] == 3
  assert training_result.read(str(tmp_path / 'none')) is None


def test_a_result_without_a_version_is_version_1(tmp_path):
  """What the trainer wrote before the version was recorded."""
  (tmp_path / training_result.FILE_NAME).write_text('{"steps": 3}')
  assert training_result.read(str(tmp_path)) == {'steps': 3}


@pytest.mark.parametrize('content, found', [
    ({'steps': 3, 'format_version': 2}, 'format_version=2'),
    ([1, 2], 'format_version=None'),
])
def test_another_format_is_a_clear_error(tmp_path, content, found):
  (tmp_path / training_result.FILE_NAME).write_text(json.dumps(content))
  with pytest.raises(training_result.FormatError) as error:
    training_result.read(str(tmp_path))
  assert found in str(error.value) and 'format version 1' in str(error.value)


def test_the_newest_published_rate_is_read_and_a_result_without_one_keeps_it(
    tmp_path):
  root = str(tmp_path)
  assert training_result.newest_steady_rate(root) is None
  training_result.publish_steady_rate(
      root, {'examples_per_sec': 100.0, 'global_batch_size': 32}, 'run/1')
  # run_fn mode: no steady rate of the managed loop.
  training_result.publish_steady_rate(root, {'mode': 'run_fn'}, 'run/2')
  assert training_result.newest_steady_rate(root) == (
      training_result.SteadyRate(100.0, 32, 'run/1'))
  training_result.publish_steady_rate(
      root, {'examples_per_sec': 50.0, 'global_batch_size': 64,
             'num_replicas': 2}, 'run/3')
  assert training_result.newest_steady_rate(root) == (
      training_result.SteadyRate(50.0, 32, 'run/3'))
