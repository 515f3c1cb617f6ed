"""The records components hand each other: written, read back, and refused
when another format version wrote them (fast)."""

import json

import pytest

from components.data.input_pipeline import InputPipelineConfig
from components.records import tuned_input_pipeline


def test_tuned_input_pipeline_round_trip(tmp_path):
  config = InputPipelineConfig(prefetch_batches=3)
  path = tuned_input_pipeline.write(str(tmp_path), config)
  with open(path) as f:
    assert json.load(f)['format_version'] == (
        tuned_input_pipeline.FORMAT_VERSION)
  assert tuned_input_pipeline.read(str(tmp_path)) == config


def test_a_config_written_before_the_version_field_reads_as_version_1(
    tmp_path):
  config = InputPipelineConfig(prefetch_batches=3)
  (tmp_path / tuned_input_pipeline.CONFIG_FILE).write_text(config.to_json())
  assert tuned_input_pipeline.read(str(tmp_path)) == config


@pytest.mark.parametrize('content, message', [
    ({'format_version': 2}, r'format_version 2; this version of tfx-hpm '
                            r'reads version 1'),
    ({'format_version': 1, 'prefetch': 1},
     r"Unknown input pipeline option\(s\) \['prefetch'\]"),
    ([1, 2], r'holds \[1, 2\], not a JSON object'),
    # Edited by hand into a bad value: the file and the field are named.
    ({'format_version': 1, 'read_batch_size': 'x'},
     r"tuned input pipeline .*config.json is not a valid config: input "
     r"pipeline option read_batch_size='x' must be an integer\."),
    ({'format_version': 1, 'prefetch_batches': float('nan')},
     r'prefetch_batches=nan must be an integer'),
])
def test_bad_tuned_configs_fail_naming_the_file(tmp_path, content, message):
  (tmp_path / tuned_input_pipeline.CONFIG_FILE).write_text(json.dumps(content))
  with pytest.raises(ValueError, match=message):
    tuned_input_pipeline.read(str(tmp_path))


def test_a_missing_tuned_config_names_its_path(tmp_path):
  with pytest.raises(FileNotFoundError, match='config.json does not exist'):
    tuned_input_pipeline.read(str(tmp_path))
