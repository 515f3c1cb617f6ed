"""Runs the taxi pipeline with LocalDagRunner and prints a summary.

    python -m pipelines.local_runner            # tfx-hpm components
    python -m pipelines.local_runner --stock    # stock Transform and Trainer
    python -m pipelines.local_runner --pipeline-root gs://bucket/root
                                     # artifacts on GCS, MLMD in local SQLite
"""

import argparse
import logging
import os
import sys
import time

from pipelines import cli
from pipelines import console

_LOGGER = logging.getLogger('tfx_hpm.pipeline')


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m pipelines.local_runner',
      description=__doc__.splitlines()[0])
  cli.add_pipeline_flags(parser)
  args = parser.parse_args(argv)
  # Before TensorFlow and TFX start (they log, and warn, as they import).
  log_file = cli.log_path(args)
  if not args.verbose:
    console.redirect_output(log_file)
  report, _ = console.configure(log_file, verbose=args.verbose)
  _LOGGER.info('Full log (TFX, Beam, TensorFlow): %s', log_file)
  # pylint: disable=g-import-not-at-top
  from tfx import v1 as tfx
  from components import storage
  from pipelines import summary
  # pylint: enable=g-import-not-at-top

  try:
    pipeline = cli.pipeline_from_args(args)
  except storage.StorageNotWritableError as e:
    # main's caller exits at once: the probe may still be retrying in its
    # thread.
    print(f'error: {e}', file=sys.stderr)
    return 2
  start = time.time()
  tfx.orchestration.LocalDagRunner().run(pipeline)
  print(summary.read_run(cli.metadata_path(args)).format())
  print(f'wall time of the whole run: {time.time() - start:.1f} s')
  print(f'full log: {log_file}' + (
      f' ({report.warnings_in_file} warnings of TFX, Beam and TensorFlow '
      'there)' if report.warnings_in_file else ''))
  return 0


if __name__ == '__main__':
  exit_code = main()
  # Skip interpreter teardown: TF's function finalizers print spurious
  # 'Exception ignored' tracebacks when they run after module cleanup.
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(exit_code)
