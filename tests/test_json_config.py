"""Every config validates its own fields: a value of the wrong type, or a
non-finite number, is a ValueError naming the option, whatever the field
(fast; no TensorFlow)."""

import dataclasses
import math

import pytest

from components.data.config import InputPipelineConfig
from components.partitioner.config import PartitionerConfig
from components.trainer.checkpoint.config import FaultToleranceConfig
from components.trainer.config import DistributionConfig
from components.transform.config import TuningConfig

# Each config with the values that make it valid on its own.
CONFIGS = ((InputPipelineConfig, {}), (DistributionConfig, {}),
           (FaultToleranceConfig, {}), (TuningConfig, {}),
           (PartitionerConfig, {'batch_size': 8}))
HOSTILE = ('x', '', [1], {'a': 1}, None, math.nan, math.inf, -math.inf, True,
           1.5, -7, 2**70)


@pytest.mark.parametrize('config, base', CONFIGS,
                         ids=lambda c: getattr(c, '__name__', ''))
def test_hostile_values_are_value_errors_naming_the_option(config, base):
  for field in dataclasses.fields(config):
    for value in HOSTILE:
      values = {**base, field.name: value}
      try:
        accepted = config.from_dict(values)
      except ValueError as e:
        assert field.name in str(e), (field.name, value, e)
        continue
      # What is accepted is a plain finite JSON value of the field.
      kept = getattr(accepted, field.name)
      assert kept == value, (field.name, value)
      assert not (isinstance(value, float) and not math.isfinite(value)), (
          field.name, value)


def test_the_error_says_what_is_allowed():
  with pytest.raises(ValueError, match=r"input pipeline option "
                     r"raw_file_patterns=\{'train': 'x'\} must be an object "
                     r'mapping strings to lists of strings\.'):
    InputPipelineConfig.from_dict({'raw_file_patterns': {'train': 'x'}})
  with pytest.raises(ValueError, match=r'input pipeline option '
                     r'prefetch_batches=nan must be an integer\.'):
    InputPipelineConfig.from_dict({'prefetch_batches': math.nan})
  with pytest.raises(ValueError, match=r'read_batch_size=True must be an '
                     r'integer\.'):
    InputPipelineConfig.from_dict({'read_batch_size': True})
