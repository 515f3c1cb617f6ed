"""OptimizedTransform's tuner on a throttled object store, in a process of
its own (TensorFlow reaches the store through the environment it starts
with): writes a text split to the store, throttles it, tunes, and prints one
JSON line: the read-ahead chosen, and each K's row ids of an epoch.

    python -m tests.support.remote_tuning --port P --bucket gs://b
"""

import argparse
import json
import os

from components.testing import gcs_emulator
from components.testing import text_records


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--port', type=int, required=True)
  parser.add_argument('--bucket', required=True)
  parser.add_argument('--work', required=True)
  parser.add_argument('--first-byte-s', type=float, default=0.05)
  parser.add_argument('--stream-bytes-per-s', type=float, default=1e6)
  args = parser.parse_args()
  # pylint: disable=g-import-not-at-top
  from components.data.input_pipeline import InputPipelineConfig
  from components.transform import sources
  from components.transform import tuner
  from components.transform.config import TuningConfig
  # pylint: enable=g-import-not-at-top
  local = text_records.write_split(args.work, 2_000, 16, 128)
  remote = text_records.copy_split(local, f'{args.bucket}/data')
  gcs_emulator.throttle(args.port, args.first_byte_s, args.stream_bytes_per_s)
  result = tuner.tune(tuner.TuningInputs(
      TuningConfig(time_budget_s=60, trainer_batch_size=32, early_stop=False,
                   cache='none', reuse=False, measure_seconds=0.5,
                   max_candidates=5),
      text_records.feature_spec(), materialized_patterns=[remote]))
  chosen = result.config.read_ahead_shards
  source = sources.Source('materialized', [remote], 'GZIP',
                          InputPipelineConfig(), text_records.feature_spec(),
                          'train')
  rows = {}
  for read_ahead in sorted({1, chosen}):
    config = source.config({'read_ahead_shards': read_ahead})
    rows[read_ahead] = [int(i) for batch in source.dataset(
        config, 32, shuffle=True) for i in batch['id'].numpy()]
  print(json.dumps({'read_ahead_shards': chosen,
                    'candidates': {m.name: m.examples_per_sec
                                   for m in result.candidates},
                    'notes': result.notes, 'rows': rows}))


if __name__ == '__main__':
  os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')
  main()
