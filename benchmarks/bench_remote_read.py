"""The trainer's reader from object storage: read-ahead against one stream.

`python -m benchmarks.bench_remote_read` -> benchmarks/results/remote_read.md

The same split (gzipped TFRecords of tf.Examples holding an id and a text
payload of 1 KB or 100 KB, gzip about 2.6:1) is read by the trainer's reader
(`ordered_pipeline`, the data order of one partition, as one_device reads
it) from local disk and from two GCS emulators (components/testing/gcs_emulator)
reached through TensorFlow's own GCS filesystem: one throttled (each
request's first byte FIRST_BYTE_S after it, then at most a per-stream rate
of 1/STREAM_SHARE of the reader's local byte rate, so one stream is the
bottleneck), one not (what the HTTPS path itself allows). Rows/s for K = 1
(no read-ahead) and for the K OptimizedTransform's tuner chooses by itself on
the throttled store (its search, read-ahead first), ROUNDS interleaved
rounds, medians. The reader runs on one core and the servers on another, so
that the server's work does not take the reader's CPU (on this 2-core
machine they would otherwise share it).

Goal: the tuned reader from the throttled store >= GOAL of its local rate
where K = 1 is stream-bound.
"""

import os
import sys
import tempfile
import uuid

import portpicker

from benchmarks import harness
from benchmarks import report
from components.testing import gcs_emulator
from components.testing import text_records
from components.testing.text_records import copy_split, write_split

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


def _source(pattern: str):
  # pylint: disable=g-import-not-at-top
  from components.data.input_pipeline import InputPipelineConfig
  from components.transform import sources
  # pylint: enable=g-import-not-at-top
  return sources.Source('materialized', [pattern], 'GZIP',
                        InputPipelineConfig(), text_records.feature_spec(),
                        'train')


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
  result = tuner.tune(tuner.TuningInputs(
      TuningConfig(time_budget_s=TUNING_BUDGET_S, trainer_batch_size=batch,
                   early_stop=False, cache='none', reuse=False,
                   measure_seconds=1.0),
      text_records.feature_spec(), materialized_patterns=[pattern]))
  return {'read_ahead_shards': result.config.read_ahead_shards,
          'candidates': [(m.name, m.examples_per_sec)
                         for m in result.candidates]}


def _bytes_per_row(pattern: str, rows: int) -> float:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return sum(tf.io.gfile.stat(f).length
             for f in tf.io.gfile.glob(pattern)) / rows


def measure(work: str, port: int, server_cpus) -> dict:
  """Per record size: local and remote rates at K = 1 and the tuned K."""
  results = {}
  emulator = gcs_emulator.GcsEmulator(port, log_dir=work, cpus=server_cpus,
                                      object_store=True)
  try:
    bucket = emulator.create_bucket(f'remote-read-{uuid.uuid4().hex[:8]}')
    for record_bytes, (shards, per_shard, batch) in SPLITS.items():
      local = write_split(os.path.join(work, f'local-{record_bytes}'),
                          record_bytes, shards, per_shard)
      cap = rate(local, batch, 1) * _bytes_per_row(
          local, shards * per_shard) / STREAM_SHARE
      remote = copy_split(local, f'{bucket}/{record_bytes}')
      throttles = {'local': None, 'fast': (0.0, 0.0),
                   'throttled': (FIRST_BYTE_S, cap)}
      emulator.throttle(*throttles['throttled'])
      tuned = tuned_read_ahead(remote, batch)
      k = tuned['read_ahead_shards']
      rounds = {f'{store} {read_ahead}': [] for store in throttles
                for read_ahead in sorted({1, k})}
      for _ in range(ROUNDS):
        for name in rounds:
          store, read_ahead = name.split()
          if throttles[store]:
            emulator.throttle(*throttles[store])
          rounds[name].append(rate(local if store == 'local' else remote,
                                   batch, int(read_ahead)))
      results[record_bytes] = {
          'batch': batch, 'shards': shards, 'per_shard': per_shard,
          'cap_bytes_per_s': cap, 'tuned': tuned, 'k': k,
          'rates': {name: harness.median(values)
                    for name, values in rounds.items()},
          'all': rounds}
  finally:
    emulator.stop()
  return results


def _body(results: dict) -> str:
  rows, goals = [], []
  for record_bytes, r in results.items():
    k, rates = r['k'], r['rates']
    local = rates[f'local {k}']  # The tuned reader's local rate.
    share = rates[f'throttled {k}'] / local
    rows.append([
        f'{record_bytes:,} B', f"{r['shards']} x {r['per_shard']:,}",
        r['batch'], f"{r['cap_bytes_per_s'] / 1e6:,.1f} MB/s", k,
        *(f'{rates[name]:,.0f}' for name in (
            'local 1', f'local {k}', 'fast 1', f'fast {k}', 'throttled 1',
            f'throttled {k}')),
        f"{rates['throttled 1'] / local:.2f}", f'{share:.2f}',
        f"{rates[f'throttled {k}'] / rates[f'fast {k}']:.2f}"])
    goals.append([f'{record_bytes:,} B: tuned, throttled store / local disk',
                  f'>= {GOAL}', f'{share:.2f}',
                  'met' if share >= GOAL else 'not met'])
  candidates = '\n'.join(
      f'- {record_bytes:,} B: ' + ', '.join(
          f'{name} {value:,.0f}' for name, value in r['tuned']['candidates'])
      for record_bytes, r in results.items())
  return '\n\n'.join([
      'The trainer\'s reader (`ordered_pipeline`, one partition) over the '
      'same split from local disk, from the GCS emulator\'s object-store '
      'front (`fast`: no throttle, what the HTTPS path itself allows) and '
      f'from the same front throttled (each request\'s first byte '
      f'{FIRST_BYTE_S * 1000:.0f} ms after it, then at most the stream cap '
      f'below, 1/{STREAM_SHARE} of the reader\'s local byte rate at K = 1, '
      'on each connection). K: the shards read ahead (`read_ahead_shards`), '
      'the tuned K chosen by OptimizedTransform\'s tuner on the throttled '
      f'store ({TUNING_BUDGET_S:.0f} s budget, early stop off). The reader '
      'on one core, the server on the other. Rows/s, medians of '
      f'{ROUNDS} interleaved rounds of {MEASURE_S:.0f} s.',
      report.table(['record', 'shards x records', 'batch', 'stream cap',
                    'tuned K', 'local K=1', 'local K=tuned', 'fast K=1',
                    'fast K=tuned', 'throttled K=1', 'throttled K=tuned',
                    'throttled K=1 / local', 'throttled K=tuned / local',
                    'throttled / fast at K=tuned'], rows),
      report.table(['goal', 'wanted', 'measured', ''], goals),
      'The tuner\'s candidates on the throttled store (rows/s):\n\n'
      + candidates,
      'Every round: ' + '; '.join(
          f'{record_bytes:,} B ' + ', '.join(
              f'{name} ' + '/'.join(f'{v:,.0f}' for v in values)
              for name, values in r['all'].items())
          for record_bytes, r in results.items())])


def main(results_dir: str = 'benchmarks/results') -> str:
  port = portpicker.pick_unused_port()
  environ, cpus = dict(os.environ), sorted(os.sched_getaffinity(0))
  # gs:// in this process (before TensorFlow first opens a gs:// path).
  os.environ.update(gcs_emulator.environment(port))
  os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')
  server_cpus = None
  if len(cpus) > 1:
    # The reader on the last core (its threads inherit it), the server on
    # the others.
    server_cpus = set(cpus[:-1])
    os.sched_setaffinity(0, {cpus[-1]})
  try:
    with tempfile.TemporaryDirectory(prefix='bench-remote-read-') as work:
      results = measure(work, port, server_cpus)
  finally:
    # The next benchmark of `make bench` gets this process as it was.
    os.sched_setaffinity(0, set(cpus))
    os.environ.clear()
    os.environ.update(environ)
  return report.write(results_dir, 'remote_read',
                      'The trainer\'s reader from object storage',
                      _body(results))


if __name__ == '__main__':
  parser = harness.parser('benchmarks.bench_remote_read',
                          description=__doc__.split('\n\n')[0])
  print(main(parser.parse_args().results_dir), file=sys.stderr)
