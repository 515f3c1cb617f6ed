"""Each measurement in a fresh Python process, as a pipeline run would be:
`run_mode` starts one, and the benchmark's own entry takes it with
`add_mode_arguments` and answers with `write_result`."""

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any, Dict


def run_mode(module: str, root: str, mode: str,
             spec: Dict[str, Any]) -> Dict[str, Any]:
  """`python -m <module> --root R --mode M --spec JSON --out F` (the
  benchmark's own entry for one measurement); its JSON result."""
  out = os.path.join(root, f'out-{time.time_ns()}.json')
  subprocess.run(
      [sys.executable, '-m', module, '--root', root, '--mode', mode,
       '--spec', json.dumps(spec), '--out', out],
      check=True, env=dict(os.environ, TF_USE_LEGACY_KERAS='1',
                           TF_CPP_MIN_LOG_LEVEL='2'))
  with open(out) as f:
    return json.load(f)


def add_mode_arguments(parser: argparse.ArgumentParser) -> None:
  """The hidden arguments `run_mode` passes: one measurement in this
  process (none given: the benchmark's `main`)."""
  for name in ('--mode', '--root', '--spec', '--out'):
    parser.add_argument(name, help=argparse.SUPPRESS)


def write_result(out: str, value: Any) -> None:
  """The measurement's JSON result, where `run_mode` reads it."""
  with open(out, 'w') as f:
    json.dump(value, f)
