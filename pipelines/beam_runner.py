"""Runs the taxi pipeline with BeamDagRunner (each component as a Beam step)."""

import argparse
import os
import sys

from absl import logging

from pipelines import cli
from pipelines import summary


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m pipelines.beam_runner',
      description=__doc__.splitlines()[0])
  cli.add_pipeline_flags(parser)
  args = parser.parse_args(argv)
  logging.set_verbosity(logging.INFO)
  from tfx.orchestration.beam import beam_dag_runner  # pylint: disable=g-import-not-at-top
  beam_dag_runner.BeamDagRunner().run(cli.pipeline_from_args(args))
  print(summary.read_run(os.path.join(args.pipeline_root,
                                      'metadata.db')).format())
  return 0


if __name__ == '__main__':
  sys.exit(main())
