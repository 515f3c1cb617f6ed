"""What the pipeline entry points share (`local_runner`, `beam_runner`):
the flags, the log file, the pipeline root's check, the run and the summary
read back from the MLMD file the flags name (`cli.metadata_path`: a gs://
root keeps its MLMD in a local file)."""

import argparse
import logging
import sys
import time
from typing import Any, Callable, Optional, Sequence

from pipelines import cli
from pipelines import console

_LOGGER = logging.getLogger('tfx_hpm.pipeline')


def main(prog: str, description: str, make_runner: Callable[[], Any],
         argv: Optional[Sequence[str]] = None) -> int:
  """Parses the pipeline flags and runs the pipeline with `make_runner()`.

  `make_runner` is called after logging is set up, so it may import TFX.
  """
  parser = argparse.ArgumentParser(prog=prog, description=description)
  cli.add_pipeline_flags(parser)
  args = parser.parse_args(argv)
  # Before TensorFlow and TFX start (they log, and warn, as they import).
  log_file = cli.log_path(args)
  if not args.verbose:
    console.redirect_output(log_file)
  report, _ = console.configure(log_file, verbose=args.verbose)
  _LOGGER.info('Full log (TFX, Beam, TensorFlow): %s', log_file)
  # pylint: disable=g-import-not-at-top
  from components import patches
  from components import storage
  from pipelines import summary
  # pylint: enable=g-import-not-at-top
  # Every Beam step of the run on the in-process DirectRunner, on both lanes.
  patches.keep_installed(patches.DIRECT_RUNNER_IN_PROCESS)

  try:
    pipeline = cli.pipeline_from_args(args)
  except storage.StorageNotWritableError as e:
    # main's caller exits at once: the probe may still be retrying in its
    # thread.
    print(f'error: {e}', file=sys.stderr)
    return 2
  start = time.time()
  make_runner().run(pipeline)
  print(summary.read_run(cli.metadata_path(args)).format())
  print(f'wall time of the whole run: {time.time() - start:.1f} s')
  print(f'full log: {log_file}' + (
      f' ({report.warnings_in_file} warnings of TFX, Beam and TensorFlow '
      'there)' if report.warnings_in_file else ''))
  return 0
