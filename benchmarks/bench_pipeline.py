"""Whole taxi pipeline: tfx-hpm components against the stock ones.

Both variants run back to back in this one invocation, on the full taxi data
with the same steps; per-component wall times come from MLMD.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

from benchmarks import report
from pipelines import summary


def _run(variant: str, work_dir: str, extra_args):
  root = os.path.join(work_dir, variant)
  cmd = [sys.executable, '-m', 'pipelines.local_runner', '--pipeline-root',
         root, *extra_args] + (['--stock'] if variant == 'stock' else [])
  start = time.time()
  proc = subprocess.run(cmd, capture_output=True, text=True)
  wall = time.time() - start
  if proc.returncode != 0:
    raise RuntimeError(f'{variant} pipeline failed:\n{proc.stderr[-4000:]}')
  return wall, summary.read_run(os.path.join(root, 'metadata.db'))


def main(results_dir: str, extra_args=()) -> str:
  work_dir = tempfile.mkdtemp(prefix='bench_pipeline_')
  runs = {v: _run(v, work_dir, list(extra_args)) for v in ('stock', 'hpm')}
  times = {v: {e.node_id: e.wall_s for e in run.executions}
           for v, (_, run) in runs.items()}
  rows = []
  for node in times['stock']:
    stock, ours = times['stock'][node], times['hpm'].get(node, float('nan'))
    ratio = stock / ours if ours else float('nan')
    rows.append([node, f'{stock:.1f}', f'{ours:.1f}',
                 f'{ratio:.2f}' if ours >= 1 else 'n/a (< 1 s)'])
  rows.append(['**whole run (process wall)**', f'{runs["stock"][0]:.1f}',
               f'{runs["hpm"][0]:.1f}',
               f'{runs["stock"][0] / runs["hpm"][0]:.2f}'])
  acc = {v: run.metrics.get('binary_accuracy', float('nan'))
         for v, (_, run) in runs.items()}
  body = (f'Flags: `{" ".join(extra_args) or "(defaults)"}`.\n\n' +
          report.table(['component', 'stock s', 'tfx-hpm s',
                        'speed-up (stock/ours)'], rows) +
          f'\n\nEval binary accuracy: stock {acc["stock"]:.4f}, '
          f'tfx-hpm {acc["hpm"]:.4f}.\n')
  return report.write(results_dir, 'pipeline', 'Taxi pipeline end to end',
                      body)


if __name__ == '__main__':
  parser = argparse.ArgumentParser()
  parser.add_argument('--results-dir', default='benchmarks/results')
  args, rest = parser.parse_known_args()
  print(main(args.results_dir, rest))
