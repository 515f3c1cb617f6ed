"""Small synthetic transformed-example TFRecords for the transform tests.

Example i has `id`=i, `x`=i/2, `label`=i%2 and a variable-length `tags`
holding i%3 copies of i, so every row can be checked against its id.
"""

import os
from typing import List

import tensorflow as tf

FEATURE_SPEC = {
    'id': tf.io.FixedLenFeature([], tf.int64),
    'x': tf.io.FixedLenFeature([], tf.float32),
    'label': tf.io.FixedLenFeature([], tf.int64),
    'tags': tf.io.VarLenFeature(tf.int64),
}
DENSE_SPEC = {k: v for k, v in FEATURE_SPEC.items() if k != 'tags'}


def example(i: int) -> bytes:
  feature = {
      'id': tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
      'x': tf.train.Feature(float_list=tf.train.FloatList(value=[i / 2])),
      'label': tf.train.Feature(int64_list=tf.train.Int64List(value=[i % 2])),
      'tags': tf.train.Feature(
          int64_list=tf.train.Int64List(value=[i] * (i % 3))),
  }
  return tf.train.Example(features=tf.train.Features(
      feature=feature)).SerializeToString()


def write_split(root: str, num_examples: int, num_files: int,
                split: str = 'train') -> List[str]:
  """Writes examples 0..n-1 in contiguous runs to gzip files; returns globs."""
  split_dir = os.path.join(root, f'Split-{split}')
  os.makedirs(split_dir, exist_ok=True)
  options = tf.io.TFRecordOptions(compression_type='GZIP')
  for k in range(num_files):
    name = f'data-{k:05d}-of-{num_files:05d}.gz'
    with tf.io.TFRecordWriter(os.path.join(split_dir, name), options) as w:
      for i in range(num_examples * k // num_files,
                     num_examples * (k + 1) // num_files):
        w.write(example(i))
  return [os.path.join(split_dir, '*')]
