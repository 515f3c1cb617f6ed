"""Runs the taxi pipeline with BeamDagRunner (each component as a Beam step).

Takes the flags of `pipelines.local_runner` (`--metadata-path`, gs:// roots
included) and prints the same summary.
"""

import sys

from pipelines import entry


def _runner():
  from tfx.orchestration.beam import beam_dag_runner  # pylint: disable=g-import-not-at-top
  return beam_dag_runner.BeamDagRunner()


def main(argv=None) -> int:
  return entry.main('python -m pipelines.beam_runner',
                    __doc__.splitlines()[0], _runner, argv)


if __name__ == '__main__':
  sys.exit(main())
