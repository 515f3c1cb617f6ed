"""Whole taxi pipeline: tfx-hpm components against the stock ones.

`ROUNDS` interleaved pairs (stock, then ours) in this one invocation, on the
full taxi data with the same steps, each in a fresh process and pipeline
root; per-component wall times come from MLMD. Medians are reported, with
every round beside them, because this machine's load moves single runs.
"""

import os
import subprocess
import sys
import tempfile
import time

from benchmarks import harness
from benchmarks import report
from pipelines import summary

ROUNDS = 3
VARIANTS = ('stock', 'hpm')
GOAL_WHOLE = 1.25
GOAL_TRANSFORM_SLOWDOWN = 1.05


def _run(variant: str, root: str, extra_args):
  cmd = [sys.executable, '-m', 'pipelines.local_runner', '--pipeline-root',
         root, *extra_args] + (['--stock'] if variant == 'stock' else [])
  start = time.time()
  proc = subprocess.run(cmd, capture_output=True, text=True)
  wall = time.time() - start
  if proc.returncode != 0:
    raise RuntimeError(f'{variant} pipeline failed:\n{proc.stderr[-4000:]}')
  return wall, summary.read_run(os.path.join(root, 'metadata.db'))


def _cell(values):
  return f'{harness.median(values):.1f}'


def main(results_dir: str, extra_args=(), rounds: int = ROUNDS) -> str:
  work_dir = tempfile.mkdtemp(prefix='bench_pipeline_')
  load_before = os.getloadavg()[0]
  walls = {v: [] for v in VARIANTS}
  steps = {v: {} for v in VARIANTS}  # variant -> node -> [s per round]
  accuracy = {v: [] for v in VARIANTS}
  for round_index in range(rounds):
    for variant in VARIANTS:
      wall, run = _run(variant, os.path.join(
          work_dir, f'{variant}_{round_index}'), list(extra_args))
      walls[variant].append(wall)
      for execution in run.executions:
        steps[variant].setdefault(execution.node_id, []).append(
            execution.wall_s)
      accuracy[variant].append(run.metrics.get('binary_accuracy',
                                               float('nan')))
      print(f'[bench_pipeline] round {round_index} {variant}: {wall:.1f} s',
            flush=True)
  rows = []
  for node, stock in steps['stock'].items():
    ours = steps['hpm'].get(node, [])
    ratio = (harness.median(stock) / harness.median(ours)
             if ours else float('nan'))
    rows.append([node, _cell(stock), _cell(ours) if ours else 'n/a',
                 f'{ratio:.2f}' if ours and harness.median(ours) >= 1
                 else 'n/a (< 1 s)',
                 ' / '.join(f'{s:.1f}' for s in stock) + ' ; ' +
                 ' / '.join(f'{s:.1f}' for s in ours)])
  pair_ratios = [s / o for s, o in zip(walls['stock'], walls['hpm'])]
  whole = harness.median(walls['stock']) / harness.median(walls['hpm'])
  rows.append(['**whole run (process wall)**', _cell(walls['stock']),
               _cell(walls['hpm']), f'{whole:.2f}',
               ' / '.join(f'{s:.1f}' for s in walls['stock']) + ' ; ' +
               ' / '.join(f'{s:.1f}' for s in walls['hpm'])])
  transform = (harness.median(steps['hpm']['Transform']) /
               harness.median(steps['stock']['Transform']))
  ok = lambda met: 'yes' if met else '**no**'
  body = '\n\n'.join([
      f'Flags: `{" ".join(extra_args) or "(defaults)"}`. {rounds} rounds, '
      'each a stock run then a tfx-hpm run, each in a fresh process and '
      'pipeline root; medians, with every round (stock ; tfx-hpm) in the '
      f'last column. Load average (1 min) before / after: {load_before:.1f} '
      f'/ {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores.',
      report.table(['component', 'stock s (median)', 'tfx-hpm s (median)',
                    'speed-up (stock/ours)', 'all rounds'], rows),
      'Per-pair whole-run speed-ups: ' +
      ' / '.join(f'{r:.2f}' for r in pair_ratios) + '.',
      report.table(['goal', 'measured', 'met'], [
          [f'whole pipeline >= {GOAL_WHOLE}x stock (ratio of medians; '
           'median of per-pair ratios)',
           f'{whole:.2f}x; {harness.median(pair_ratios):.2f}x',
           ok(whole >= GOAL_WHOLE) + '; ' +
           ok(harness.median(pair_ratios) >= GOAL_WHOLE)],
          [f'OptimizedTransform step at most '
           f'{GOAL_TRANSFORM_SLOWDOWN - 1:.0%} slower than stock Transform',
           f'{transform:.3f}x the stock time',
           ok(transform <= GOAL_TRANSFORM_SLOWDOWN)]]),
      'Eval binary accuracy (median): stock '
      f'{harness.median(accuracy["stock"]):.4f}, tfx-hpm '
      f'{harness.median(accuracy["hpm"]):.4f}.',
  ]) + '\n'
  return report.write(results_dir, 'pipeline', 'Taxi pipeline end to end',
                      body)


if __name__ == '__main__':
  parser = harness.parser('benchmarks.bench_pipeline')
  parser.add_argument('--rounds', type=int, default=ROUNDS)
  args, rest = parser.parse_known_args()
  print(main(args.results_dir, rest, args.rounds))
