"""The input pipeline's config: how to read, parse, transform, cache and
prefetch training examples. No TensorFlow import (AUTOTUNE is
`tf.data.AUTOTUNE`, -1), so configs validate without TF; `input_pipeline`
builds the dataset from one.
"""

import dataclasses
from typing import Dict, List, Optional

from components.json_config import JsonConfig

AUTOTUNE = -1
CACHE_MODES = ('none', 'memory', 'disk')
TRANSFORM_PLACEMENTS = ('materialized', 'on_the_fly')
# TFX writes Examples (raw and transformed) as gzipped TFRecords, so a
# reader assumes that unless told otherwise.
DEFAULT_COMPRESSION = 'GZIP'
COMPRESSION_TYPES = (DEFAULT_COMPRESSION, 'ZLIB', '')


@dataclasses.dataclass
class InputPipelineConfig(JsonConfig):
  """How to read, parse, transform, cache and prefetch training examples.

  Integer knobs take -1 for tf.data AUTOTUNE.
  """
  OPTIONS_NAME = 'input pipeline'
  # The interleave knobs named the unordered reader's parallel file reads;
  # reading ahead is their place in the ordered reader, and every reader
  # batches records where it reads them.
  RENAMED = {'interleave_cycle_length': 'read_ahead_shards',
             'interleave_parallelism': 'read_ahead_shards',
             'batch_in_reader': 'read_batch_size'}
  # Shards (a partition's segments) each stream reads at once, handed on in
  # order: object storage serves one stream a fraction of its bandwidth and
  # a first-byte wait per read, which parallel streams hide. 1 reads one
  # after another; K holds up to K + 1 segments' records in memory.
  read_ahead_shards: int = 1
  read_buffer_bytes: int = 256 * 1024
  # Records read and parsed per step; batches are cut from these blocks, so
  # small training batches do not pay per-step overheads. 0: the larger of
  # the batch size and MIN_READ_BATCH.
  read_batch_size: int = 0
  parse_parallel_calls: int = AUTOTUNE
  deterministic: bool = True
  prefetch_batches: int = AUTOTUNE
  cache: str = 'none'
  cache_dir: Optional[str] = None
  # Shuffle buffer, in parsed read blocks (see read_batch_size).
  shuffle_buffer_batches: int = 0
  # Examples are shuffled (seeded) within windows of this many batches, so a
  # batch mixes records of several files; 0 keeps file order inside batches.
  shuffle_window_batches: int = 8
  autotune_ram_budget_bytes: int = 0
  map_parallelization: bool = True
  private_threadpool_size: int = 0
  compression_type: str = DEFAULT_COMPRESSION
  transform_placement: str = 'materialized'
  # For 'on_the_fly': the transform graph and the raw examples per split.
  transform_graph_uri: Optional[str] = None
  raw_file_patterns: Dict[str, List[str]] = dataclasses.field(
      default_factory=dict)
  raw_compression_type: str = DEFAULT_COMPRESSION

  def validate(self) -> 'InputPipelineConfig':
    if self.cache not in CACHE_MODES:
      raise ValueError(f'cache={self.cache!r} is not one of {CACHE_MODES}.')
    if self.cache == 'disk' and not self.cache_dir:
      raise ValueError("cache='disk' needs cache_dir (a local folder).")
    if self.read_ahead_shards < 1:
      raise ValueError(f'read_ahead_shards={self.read_ahead_shards} must be '
                       '>= 1 (1: no read-ahead).')
    for name in ('parse_parallel_calls', 'prefetch_batches'):
      value = getattr(self, name)
      if value == 0 or value < AUTOTUNE:
        raise ValueError(f'{name}={value} must be positive or -1 (AUTOTUNE).')
    for name in ('read_buffer_bytes', 'read_batch_size',
                 'shuffle_buffer_batches', 'shuffle_window_batches',
                 'autotune_ram_budget_bytes', 'private_threadpool_size'):
      if getattr(self, name) < 0:
        raise ValueError(f'{name}={getattr(self, name)} must be >= 0.')
    for name in ('compression_type', 'raw_compression_type'):
      if getattr(self, name) not in COMPRESSION_TYPES:
        raise ValueError(f'{name}={getattr(self, name)!r} is not one of '
                         f'{COMPRESSION_TYPES}.')
    if self.transform_placement not in TRANSFORM_PLACEMENTS:
      raise ValueError(f'transform_placement={self.transform_placement!r} is '
                       f'not one of {TRANSFORM_PLACEMENTS}.')
    if self.transform_placement == 'on_the_fly' and not (
        self.transform_graph_uri and self.raw_file_patterns):
      raise ValueError("transform_placement='on_the_fly' needs "
                       'transform_graph_uri and raw_file_patterns (split -> '
                       'globs of the raw examples).')
    return self

  def read_compression(self) -> str:
    """The compression of the files this config reads: the raw examples'
    on the fly, else the materialized examples'."""
    return (self.raw_compression_type
            if self.transform_placement == 'on_the_fly'
            else self.compression_type)
