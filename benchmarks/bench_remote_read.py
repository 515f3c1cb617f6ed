"""The trainer's reader from object storage: read-ahead against one stream.

`python -m benchmarks.bench_remote_read` -> benchmarks/results/remote_read.md

The same split (gzipped TFRecords of tf.Examples holding an id and a payload
of 1 KB or 100 KB) is read by the trainer's reader (`ordered_pipeline`, the
data order of one partition, as one_device reads it) from local disk and
from a throttled object store: the GCS emulator (tests/support/gcs_emulator)
reached through TensorFlow's own GCS filesystem, answering each request's
first byte FIRST_BYTE_S after it and at most a per-stream rate set to
1/STREAM_SHARE of the reader's local byte rate, so one stream is the
bottleneck. Rows/s for K = 1 (no read-ahead) and for the K OptimizedTransform's
tuner chooses by itself on the store (its search over the knobs, the
read-ahead first), each measured in ROUNDS interleaved rounds (median).

Goal: the tuned reader from the throttled store >= GOAL of its local rate
where K = 1 is stream-bound.
"""

import argparse
import os
import statistics
import sys
import tempfile
import uuid

import numpy as np
import portpicker

from benchmarks import report
from tests.support import gcs_emulator

FIRST_BYTE_S = 0.05
# The per-stream cap is the local byte rate over this: K = 1 reads at about
# 1/STREAM_SHARE of its local rate.
STREAM_SHARE = 8
GOAL = 0.9
ROUNDS = 3
MEASURE_S = 3.0
TUNING_BUDGET_S = 90.0
# Record size -> (shards, records per shard, rows per batch).
SPLITS = {1_000: (16, 4_000, 256), 100_000: (16, 64, 32)}
FEATURE_SPEC_KEYS = ('id', 'payload')


def _feature_spec():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return {'id': tf.io.FixedLenFeature([], tf.int64),
          'payload': tf.io.FixedLenFeature([], tf.string)}


def write_split(folder: str, record_bytes: int, shards: int,
                per_shard: int) -> str:
  """`shards` gzipped files of tf.Examples with incompressible payloads, in
  a TFX `Split-train` folder; returns the file pattern."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  split = os.path.join(folder, 'Split-train')
  tf.io.gfile.makedirs(split)
  rng = np.random.default_rng(0)
  row = 0
  for shard in range(shards):
    path = os.path.join(split, f'data_tfrecord-{shard:05d}-of-{shards:05d}.gz')
    with tf.io.TFRecordWriter(path, 'GZIP') as writer:
      for _ in range(per_shard):
        example = tf.train.Example(features=tf.train.Features(feature={
            'id': tf.train.Feature(int64_list=tf.train.Int64List(value=[row])),
            'payload': tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[rng.bytes(record_bytes)])),
        }))
        writer.write(example.SerializeToString())
        row += 1
  return os.path.join(split, '*')


def copy_split(pattern: str, folder: str) -> str:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  split = f'{folder}/Split-train'
  tf.io.gfile.makedirs(split)
  for path in tf.io.gfile.glob(pattern):
    tf.io.gfile.copy(path, f'{split}/{os.path.basename(path)}')
  return f'{split}/*'


def _source(pattern: str):
  # pylint: disable=g-import-not-at-top
  from components.data.input_pipeline import InputPipelineConfig
  from components.transform import sources
  # pylint: enable=g-import-not-at-top
  return sources.Source('materialized', [pattern], 'GZIP',
                        InputPipelineConfig(), _feature_spec(), 'train')


def rate(pattern: str, batch: int, read_ahead: int) -> float:
  """Rows/s of the trainer's reader over the split at `read_ahead`."""
  # pylint: disable=g-import-not-at-top
  from components.transform import measurement
  # pylint: enable=g-import-not-at-top
  source = _source(pattern)
  config = source.config({'read_ahead_shards': read_ahead})
  return measurement.measure_rate(
      lambda: source.dataset(config, batch, shuffle=True), MEASURE_S)


def tuned_read_ahead(pattern: str, batch: int) -> dict:
  """What OptimizedTransform's tuner chooses on the split, by itself."""
  # pylint: disable=g-import-not-at-top
  from components.transform import tuner
  from components.transform.config import TuningConfig
  # pylint: enable=g-import-not-at-top
  result = tuner.tune(
      TuningConfig(time_budget_s=TUNING_BUDGET_S, trainer_batch_size=batch,
                   early_stop=False, cache='none', reuse=False,
                   measure_seconds=1.0),
      _feature_spec(), materialized_patterns=[pattern])
  return {'read_ahead_shards': result.config.read_ahead_shards,
          'candidates': [(m.name, m.examples_per_sec)
                         for m in result.candidates]}


def measure(work: str, port: int) -> dict:
  """Per record size: local and remote rates at K = 1 and the tuned K."""
  results = {}
  for record_bytes, (shards, per_shard, batch) in SPLITS.items():
    local = write_split(os.path.join(work, f'local-{record_bytes}'),
                        record_bytes, shards, per_shard)
    local_k1 = rate(local, batch, 1)
    cap = local_k1 * record_bytes / STREAM_SHARE
    emulator = gcs_emulator.GcsEmulator(
        port, log_dir=work, first_byte_s=FIRST_BYTE_S,
        stream_bytes_per_s=cap)
    try:
      bucket = emulator.create_bucket(f'remote-read-{uuid.uuid4().hex[:8]}')
      remote = copy_split(local, f'{bucket}/{record_bytes}')
      tuned = tuned_read_ahead(remote, batch)
      k = tuned['read_ahead_shards']
      rounds = {name: [] for name in ('local 1', f'local {k}', 'remote 1',
                                      f'remote {k}')}
      for _ in range(ROUNDS):
        for name in rounds:
          where, read_ahead = name.split()
          rounds[name].append(rate(local if where == 'local' else remote,
                                   batch, int(read_ahead)))
    finally:
      emulator.stop()
    results[record_bytes] = {
        'batch': batch, 'shards': shards, 'per_shard': per_shard,
        'cap_bytes_per_s': cap, 'tuned': tuned, 'k': k,
        'rates': {name: statistics.median(values)
                  for name, values in rounds.items()},
        'all': rounds}
  return results


def _body(results: dict) -> str:
  rows, goals = [], []
  for record_bytes, r in results.items():
    k, rates = r['k'], r['rates']
    local_best = max(rates['local 1'], rates[f'local {k}'])
    tuned_share = rates[f'remote {k}'] / local_best
    rows.append([
        f'{record_bytes:,} B', f"{r['shards']} x {r['per_shard']:,}",
        r['batch'], f"{r['cap_bytes_per_s'] / 1e6:,.1f} MB/s",
        f"{rates['local 1']:,.0f}", f"{rates[f'local {k}']:,.0f}",
        f"{rates['remote 1']:,.0f}", f"{rates[f'remote {k}']:,.0f}", k,
        f"{rates['remote 1'] / local_best:.2f}", f'{tuned_share:.2f}'])
    goals.append([f'{record_bytes:,} B: tuned remote / local',
                  f'>= {GOAL}', f'{tuned_share:.2f}',
                  'met' if tuned_share >= GOAL else 'not met'])
  candidates = '\n'.join(
      f"- {record_bytes:,} B: " + ', '.join(
          f'{name} {value:,.0f}' for name, value in r['tuned']['candidates'])
      for record_bytes, r in results.items())
  return '\n\n'.join([
      f'The trainer\'s reader (`ordered_pipeline`, one partition) over the '
      f'same split from local disk and from the GCS emulator answering each '
      f'request\'s first byte {FIRST_BYTE_S * 1000:.0f} ms after it and at '
      f'most the per-stream cap below (1/{STREAM_SHARE} of the reader\'s '
      f'local byte rate at K = 1) on each connection; K the shards read '
      f'ahead (`read_ahead_shards`), the tuned K chosen by '
      f'OptimizedTransform\'s tuner on the store ({TUNING_BUDGET_S:.0f} s '
      'budget, early stop off). '
      f'Rows/s, median of {ROUNDS} interleaved rounds of {MEASURE_S:.0f} s.',
      report.table(['record', 'shards x records', 'batch', 'stream cap',
                    'local K=1', 'local K=tuned', 'remote K=1',
                    'remote K=tuned', 'tuned K', 'remote K=1 / local',
                    'remote tuned / local'], rows),
      report.table(['goal', 'wanted', 'measured', ''], goals),
      'The tuner\'s candidates on the store (rows/s):\n\n' + candidates,
      'Every round: ' + '; '.join(
          f"{record_bytes:,} B " + ', '.join(
              f'{name} ' + '/'.join(f'{v:,.0f}' for v in values)
              for name, values in r['all'].items())
          for record_bytes, r in results.items())])


def main(results_dir: str = 'benchmarks/results') -> str:
  port = portpicker.pick_unused_port()
  # gs:// in this process (before TensorFlow loads its GCS filesystem).
  os.environ.update(gcs_emulator.environment(port))
  os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')
  with tempfile.TemporaryDirectory(prefix='bench-remote-read-') as work:
    results = measure(work, port)
  return report.write(results_dir, 'remote_read',
                      'The trainer\'s reader from object storage',
                      _body(results))


if __name__ == '__main__':
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--results-dir', default='benchmarks/results')
  print(main(parser.parse_args().results_dir), file=sys.stderr)
