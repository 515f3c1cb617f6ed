"""The TunedInputPipeline artifact's `config.json`: written by
OptimizedTransform, read by HighPerfTrainer and by the next tuning of the
same node (reuse).

It holds an `InputPipelineConfig` and `format_version`; the reader checks
the version (a file written before the field existed is version 1) and the
config's keys and values.
"""

import os

from components.data.input_pipeline import InputPipelineConfig
from components import storage

CONFIG_FILE = 'config.json'
# Bump when a field changes meaning; readers refuse other versions.
FORMAT_VERSION = 1


def write(uri: str, config: InputPipelineConfig) -> str:
  """Writes config.json into the artifact folder `uri`; returns its path."""
  path = os.path.join(uri, CONFIG_FILE)
  storage.write_json(path, {'format_version': FORMAT_VERSION,
                            **config.to_dict()})
  return path


def read(uri: str) -> InputPipelineConfig:
  """The tuned config of the artifact folder `uri`.

  Raises:
    FileNotFoundError: there is no config.json.
    ValueError: another format version, or keys or values that
      InputPipelineConfig does not accept.
  """
  path = os.path.join(uri, CONFIG_FILE)
  values = storage.read_json(path)
  if values is None:
    raise FileNotFoundError(f'Input artifact file {path} does not exist.')
  if not isinstance(values, dict):
    raise ValueError(f'{path} holds {values!r}, not a JSON object.')
  values = dict(values)
  version = values.pop('format_version', 1)
  if version != FORMAT_VERSION:
    raise ValueError(
        f'{path} has format_version {version!r}; this version of tfx-hpm '
        f'reads version {FORMAT_VERSION}. Run OptimizedTransform again.')
  try:
    return InputPipelineConfig.from_dict(values)
  except ValueError as e:
    raise ValueError(f'The tuned input pipeline {path} is not a valid '
                     f'config: {e} Run OptimizedTransform again, or fix the '
                     'file.') from e
