"""Finds the damaged file among a training's TFRecord files.

TF's DataLossError for a damaged record (a truncated file, a flipped byte,
a broken gzip stream) names neither the file nor the record, so with
thousands of shards nobody could tell which one to replace. After such a
failure `first_damaged` reads the files once, in order, and names the first
that cannot be read to its end and how many records it yields before that.
"""

from typing import Dict, List, Optional, Sequence

import tensorflow as tf


def _files(file_patterns: Sequence[str]) -> List[str]:
  return sorted({path for pattern in file_patterns
                 for path in tf.io.gfile.glob(pattern)})


def _count(path: str, compression_type: str, skip_damage: bool) -> int:
  dataset = tf.data.TFRecordDataset(path, compression_type)
  if skip_damage:
    dataset = dataset.ignore_errors()
  return int(dataset.reduce(tf.constant(0, tf.int64),
                            lambda count, _: count + 1))


def first_damaged(file_patterns: Sequence[str], compression_type: str
                  ) -> Optional[Dict[str, object]]:
  """The first file (by path) that fails to read: {'path', 'readable_records'
  (before the damage), 'error'}; None if every file reads to its end."""
  for path in _files(file_patterns):
    try:
      _count(path, compression_type, skip_damage=False)
    except tf.errors.DataLossError as e:
      return {'path': path,
              'readable_records': _count(path, compression_type,
                                         skip_damage=True),
              'error': e.message.strip()}
  return None
