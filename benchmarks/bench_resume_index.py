"""A resume's first batch with and without the shard index's counts.

    python -m benchmarks.bench_resume_index [--rows 400000,1600000]

For each size, 16 gzip shards of synthetic 13-feature tf.Examples (in a
`Split-train` folder, as a Transform writes them) and the default input
pipeline at batch 256: the seconds from building the dataset to its first
batch when resuming at 90% of the first epoch, the rows of the epoch counted
by reading it (`skip_batches` alone) against taken from the shard index
(`records_per_file`), 3 interleaved rounds; and the seconds to build the
index once. Both still build the resumed epoch and drop the rows before the
position, so the cost stays linear in the rows: the index removes the
counting pass, not the drop. Writes benchmarks/results/resume_index.md.
"""

import argparse
import os
import statistics
import tempfile
import time
from typing import Dict, List

import numpy as np
import tensorflow as tf

from benchmarks import report
from components.data import input_pipeline
from components.data import shard_index

SHARDS = 16
FEATURES = 13
BATCH = 256
ROUNDS = 3
RESUME_AT = 0.9
SIZES = (400_000, 1_600_000)
_SPEC = {**{f'f{i}': tf.io.FixedLenFeature([], tf.float32)
            for i in range(FEATURES)},
         'label': tf.io.FixedLenFeature([], tf.int64)}


def write_split(folder: str, rows: int) -> str:
  """`rows` examples in SHARDS gzip files; returns the file pattern."""
  os.makedirs(folder, exist_ok=True)
  rng = np.random.default_rng(0)
  per_shard = rows // SHARDS
  for shard in range(SHARDS):
    values = rng.normal(size=(per_shard, FEATURES)).astype('f4')
    path = os.path.join(folder, f'data-{shard:05d}-of-{SHARDS:05d}.gz')
    with tf.io.TFRecordWriter(path, 'GZIP') as writer:
      for row in range(per_shard):
        feature = {f'f{i}': tf.train.Feature(
            float_list=tf.train.FloatList(value=[values[row, i]]))
                   for i in range(FEATURES)}
        feature['label'] = tf.train.Feature(
            int64_list=tf.train.Int64List(value=[row % 2]))
        writer.write(tf.train.Example(features=tf.train.Features(
            feature=feature)).SerializeToString())
  return os.path.join(folder, '*')


def first_batch_s(pattern: str, skip: int, records=None) -> float:
  began = time.monotonic()
  dataset = input_pipeline.build_dataset(
      [pattern], _SPEC, 'label', BATCH, skip_batches=skip,
      records_per_file=records)
  next(iter(dataset))
  return time.monotonic() - began


def measure(work_dir: str, rows: int) -> Dict[str, List[float]]:
  folder = os.path.join(work_dir, str(rows), 'Split-train')
  pattern = write_split(folder, rows)
  files = input_pipeline.list_files([pattern])
  began = time.monotonic()
  index = shard_index.build(folder, files, 'GZIP')
  measured = {'index_build': [time.monotonic() - began], 'counted': [],
              'indexed': []}
  skip = int(rows * RESUME_AT) // BATCH
  for _ in range(ROUNDS):
    measured['counted'].append(first_batch_s(pattern, skip))
    measured['indexed'].append(
        first_batch_s(pattern, skip, index.records_by_path()))
  return measured


def main(results_dir: str = 'benchmarks/results',
         sizes=SIZES) -> str:
  rows = []
  with tempfile.TemporaryDirectory(prefix='bench-resume-index-') as work:
    for size in sizes:
      m = measure(work, size)
      counted, indexed = (statistics.median(m[k])
                          for k in ('counted', 'indexed'))
      rows.append([f'{size:,}', f'{counted:.2f}', f'{indexed:.2f}',
                   f'{indexed / counted:.2f}',
                   f'{m["index_build"][0]:.2f}',
                   ', '.join(f'{c:.2f}/{i:.2f}' for c, i in zip(
                       m['counted'], m['indexed']))])
  body = (f'{SHARDS} gzip shards of {FEATURES}-feature tf.Examples, batch '
          f'{BATCH}, default input pipeline; seconds from building the '
          f'dataset to the first batch of a resume at {RESUME_AT:.0%} of the '
          f'first epoch, median of {ROUNDS} interleaved rounds.\n\n' +
          report.table(['rows', 'epoch counted (s)', 'shard index (s)',
                        'ratio', 'index built once (s)',
                        'rounds (counted/indexed)'], rows))
  return report.write(results_dir, 'resume_index',
                      'Resume: the shard index instead of counting the epoch',
                      body)


if __name__ == '__main__':
  parser = argparse.ArgumentParser(
      prog='python -m benchmarks.bench_resume_index')
  parser.add_argument('--results-dir', default='benchmarks/results')
  parser.add_argument('--rows', default=','.join(map(str, SIZES)))
  args = parser.parse_args()
  print(main(args.results_dir,
             [int(r) for r in args.rows.split(',') if r]))
