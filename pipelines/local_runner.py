"""Runs the taxi pipeline with LocalDagRunner and prints a summary.

    python -m pipelines.local_runner            # tfx-hpm components
    python -m pipelines.local_runner --stock    # stock Transform and Trainer
    python -m pipelines.local_runner --pipeline-root gs://bucket/root
                                     # artifacts on GCS, MLMD in local SQLite
"""

import argparse
import os
import sys
import time

from absl import logging

from components import storage
from pipelines import cli
from pipelines import summary


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m pipelines.local_runner',
      description=__doc__.splitlines()[0])
  cli.add_pipeline_flags(parser)
  args = parser.parse_args(argv)
  logging.set_verbosity(logging.INFO)
  from tfx import v1 as tfx  # pylint: disable=g-import-not-at-top

  pipeline = cli.pipeline_from_args(args)
  start = time.time()
  tfx.orchestration.LocalDagRunner().run(pipeline)
  print(summary.read_run(cli.metadata_path(args)).format())
  print(f'wall time of the whole run: {time.time() - start:.1f} s')
  return 0


if __name__ == '__main__':
  try:
    exit_code = main()
  except storage.StorageNotWritableError as e:
    # Exits at once: the probe may still be retrying in its thread.
    print(f'error: {e}', file=sys.stderr)
    exit_code = 2
  # Skip interpreter teardown: TF's function finalizers print spurious
  # 'Exception ignored' tracebacks when they run after module cleanup.
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(exit_code)
