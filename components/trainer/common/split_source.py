"""What the trainer reads for a split, and where that split's index lives.

The one rule of `transform_placement='on_the_fly'` for the trainer: it then
reads the raw examples of the same split (the input pipeline config names
them), with their compression, and keeps their shard index apart from the
transformed examples' (in `RAW_INDEX_DIR` of its checkpoint folder). Counting
a split, checking it against its index and naming a damaged file all read
the split through `split_source`.
"""

import dataclasses
import os
from typing import List

from components.data import input_pipeline
from components.data.config import InputPipelineConfig

# Where the indexes of raw examples read on the fly are kept, in the
# checkpoint folder.
RAW_INDEX_DIR = 'raw_examples'


@dataclasses.dataclass(frozen=True)
class SplitSource:
  """The files a split is read from: `patterns` with `compression`, indexed
  in `index_dir` when the examples were not written with an index."""
  patterns: List[str]
  compression: str
  index_dir: str


def split_source(config: InputPipelineConfig, file_patterns: List[str],
                 checkpoint_dir: str) -> SplitSource:
  """What the trainer reads for the split `file_patterns` (its materialized
  examples) name under `config`."""
  index_dir = checkpoint_dir
  if config.transform_placement == 'on_the_fly':
    index_dir = os.path.join(checkpoint_dir, RAW_INDEX_DIR)
  return SplitSource(input_pipeline.patterns_read(config, file_patterns),
                     config.read_compression(), index_dir)
