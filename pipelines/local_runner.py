"""Runs the taxi pipeline with LocalDagRunner and prints a summary.

    python -m pipelines.local_runner            # tfx-hpm components
    python -m pipelines.local_runner --stock    # stock Transform and Trainer
    python -m pipelines.local_runner --pipeline-root gs://bucket/root
                                     # artifacts on GCS, MLMD in local SQLite
"""

import os
import sys

from pipelines import entry


def _runner():
  from tfx import v1 as tfx  # pylint: disable=g-import-not-at-top
  return tfx.orchestration.LocalDagRunner()


def main(argv=None) -> int:
  return entry.main('python -m pipelines.local_runner',
                    __doc__.splitlines()[0], _runner, argv)


if __name__ == '__main__':
  exit_code = main()
  # Skip interpreter teardown: TF's function finalizers print spurious
  # 'Exception ignored' tracebacks when they run after module cleanup.
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(exit_code)
