"""Splits of tf.Examples with text payloads, as a reader's test data: an id
and a payload of random words (gzip about 2.6:1), in a TFX `Split-train`
folder, on any `tf.io.gfile` filesystem."""

import os

import numpy as np

VOCABULARY = 2000


def feature_spec():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return {'id': tf.io.FixedLenFeature([], tf.int64),
          'payload': tf.io.FixedLenFeature([], tf.string)}


def _text(rng, words, size: int) -> bytes:
  return b' '.join(words[i] for i in rng.integers(
      0, len(words), size=size // 5))[:size]


def write_split(folder: str, record_bytes: int, shards: int,
                per_shard: int) -> str:
  """`shards` gzipped files of `per_shard` records each; returns the file
  pattern."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  split = os.path.join(folder, 'Split-train')
  tf.io.gfile.makedirs(split)
  rng = np.random.default_rng(0)
  words = [bytes(rng.integers(97, 123, size=rng.integers(2, 9)).astype(
      np.uint8)) for _ in range(VOCABULARY)]
  row = 0
  for shard in range(shards):
    path = os.path.join(split, f'data_tfrecord-{shard:05d}-of-{shards:05d}.gz')
    with tf.io.TFRecordWriter(path, 'GZIP') as writer:
      for _ in range(per_shard):
        example = tf.train.Example(features=tf.train.Features(feature={
            'id': tf.train.Feature(int64_list=tf.train.Int64List(value=[row])),
            'payload': tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[_text(rng, words, record_bytes)])),
        }))
        writer.write(example.SerializeToString())
        row += 1
  return os.path.join(split, '*')


def copy_split(pattern: str, folder: str) -> str:
  """The split's files copied into `folder`'s `Split-train`; its pattern."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  split = f'{folder}/Split-train'
  tf.io.gfile.makedirs(split)
  for path in tf.io.gfile.glob(pattern):
    tf.io.gfile.copy(path, f'{split}/{os.path.basename(path)}')
  return f'{split}/*'
