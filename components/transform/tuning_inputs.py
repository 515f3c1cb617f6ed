"""What OptimizedTransform's tuning reads: the split to tune on, and whether
the examples are in a form the input pipeline reads (gzipped TFRecords,
materialized or raw tf.Example), for every input the stock Transform takes.
"""

from typing import Any, Dict, List, Optional, Tuple

from tfx import types
from tfx.components.transform import executor_utils
from tfx.components.util import examples_utils
from tfx.types import artifact_utils
from tfx.types import standard_component_specs
from tfx.utils import io_utils

from components.transform.config import TuningConfig

TFRECORDS_GZIP = 'tfrecords_gzip'
TF_EXAMPLE = 'FORMAT_TF_EXAMPLE'


def split_to_tune(tuning: TuningConfig,
                  input_dict: Dict[str, List[types.Artifact]],
                  output_dict: Dict[str, List[types.Artifact]],
                  exec_properties: Dict[str, Any]
                 ) -> Tuple[Optional[str], Optional[str]]:
  """(split to tune on, None), or (None, why nothing can be tuned).

  Every input the stock Transform takes is taken; the tuner needs one
  transformed split read either from materialized tf.Example TFRecords or
  on the fly from raw tf.Example TFRecords.
  """
  examples = input_dict[standard_component_specs.EXAMPLES_KEY]
  transform = list(executor_utils.ResolveSplitsConfig(
      exec_properties.get(standard_component_specs.SPLITS_CONFIG_KEY),
      examples).transform)
  split = tuning.split_to_tune(transform)
  if split is None:
    return None, (f'no split to tune on: Transform transforms {transform}' +
                  (f', not tune_split={tuning.tune_split!r}'
                   if tuning.tune_split else ''))
  materialized = (bool(output_dict.get(
      standard_component_specs.TRANSFORMED_EXAMPLES_KEY)) and
                  are_tfrecords(examples))
  on_the_fly = are_tfrecords(examples, TF_EXAMPLE)
  if not (materialized or on_the_fly):
    formats = sorted({
        f'{examples_utils.get_file_format(a)}/'
        f'{examples_utils.get_payload_format_string(a)}' for a in examples})
    return None, (
        f'no examples the input pipeline reads: the examples are {formats} '
        '(it reads gzipped TFRecords, materialized or raw tf.Example)' +
        ('' if output_dict.get(
            standard_component_specs.TRANSFORMED_EXAMPLES_KEY)
         else ', and Transform did not materialize'))
  return split, None


def are_tfrecords(examples: List[types.Artifact],
                  payload_format: Optional[str] = None) -> bool:
  """Whether every artifact holds gzipped TFRecords (of `payload_format`)."""
  return all(
      examples_utils.get_file_format(a) == TFRECORDS_GZIP and
      payload_format in (None, examples_utils.get_payload_format_string(a))
      for a in examples)


def split_patterns(artifacts: List[types.Artifact], split: str) -> List[str]:
  """The file patterns of `split` in every artifact."""
  return [io_utils.all_files_pattern(uri)
          for uri in artifact_utils.get_split_uris(artifacts, split)]
