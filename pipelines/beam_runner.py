"""Runs the taxi pipeline with BeamDagRunner (each component as a Beam step)."""

import argparse
import os
import sys

from pipelines import cli
from pipelines import console


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m pipelines.beam_runner',
      description=__doc__.splitlines()[0])
  cli.add_pipeline_flags(parser)
  args = parser.parse_args(argv)
  # Before TensorFlow and TFX start (they log, and warn, as they import).
  log_file = cli.log_path(args)
  if not args.verbose:
    console.redirect_output(log_file)
  console.configure(log_file, verbose=args.verbose)
  # pylint: disable=g-import-not-at-top
  from tfx.orchestration.beam import beam_dag_runner
  from pipelines import summary
  # pylint: enable=g-import-not-at-top
  beam_dag_runner.BeamDagRunner().run(cli.pipeline_from_args(args))
  print(summary.read_run(os.path.join(args.pipeline_root,
                                      'metadata.db')).format())
  print(f'full log: {log_file}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
