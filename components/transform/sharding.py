"""Re-shards a materialized split into N TFRecord files, records unchanged.

Transform writes one file per split per Beam bundle (one file on a
single-worker runner), which leaves parallel interleave nothing to read in
parallel and per-worker sharding nothing to shard. Shard k gets the k-th
contiguous run of records, so reading the shards in name order yields
exactly the records, in the order, Transform wrote. No TFX import.
"""

import dataclasses
import os
import re
from typing import List

import tensorflow as tf

from components.data import input_pipeline

# Beam's shard naming: <prefix>-00000-of-00004<suffix>.
_SHARD_NAME = re.compile(r'^(?P<prefix>.*?)-\d{5}-of-\d{5}(?P<suffix>.*)$')
_WRITE_BATCH = 4096


@dataclasses.dataclass
class ShardedSplit:
  files: List[str]
  num_records: int
  resharded: bool


def reshard(split_dir: str, num_shards: int,
            compression_type: str = 'GZIP') -> ShardedSplit:
  """Rewrites the files of `split_dir` as `num_shards` files (if fewer).

  Args:
    split_dir: Folder holding only the split's TFRecord files.
    num_shards: Wanted file count; folders that already have at least this
      many files (or fewer records than shards) are left as they are.
    compression_type: Compression of the existing and the new files.
  """
  files = input_pipeline.list_files([os.path.join(split_dir, '*')])
  num_records = input_pipeline.count_records(files, compression_type)
  num_shards = min(num_shards, num_records)
  if len(files) >= num_shards:
    return ShardedSplit(files, num_records, resharded=False)
  match = _SHARD_NAME.match(os.path.basename(files[0]))
  prefix, suffix = ((match.group('prefix'), match.group('suffix')) if match
                    else ('data', '.gz' if compression_type == 'GZIP' else ''))
  new_files = [
      os.path.join(split_dir, f'{prefix}-{k:05d}-of-{num_shards:05d}{suffix}')
      for k in range(num_shards)
  ]
  # Shard k holds records [bounds[k], bounds[k + 1]).
  bounds = [num_records * k // num_shards for k in range(num_shards + 1)]
  options = tf.io.TFRecordOptions(compression_type=compression_type)
  records = tf.data.TFRecordDataset(
      files, compression_type=compression_type).batch(_WRITE_BATCH)
  shard, written = 0, 0
  writer = tf.io.TFRecordWriter(new_files[0], options)
  try:
    for batch in records.as_numpy_iterator():
      for record in batch:
        while written == bounds[shard + 1]:
          writer.close()
          shard += 1
          writer = tf.io.TFRecordWriter(new_files[shard], options)
        writer.write(record)
        written += 1
  finally:
    writer.close()
  for old in files:
    tf.io.gfile.remove(old)
  return ShardedSplit(new_files, num_records, resharded=True)
