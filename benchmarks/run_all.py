"""`make bench`: every side-by-side benchmark, one after the other.

    python -m benchmarks.run_all [--only pipeline,trainer,...]

Each `benchmarks/bench_<name>.py` exposes `main(results_dir)` and writes
`benchmarks/results/<name>.md`; this writes an index of them.
"""

import argparse
import importlib
import os
import time

from benchmarks import report

BENCHMARKS = ['transform', 'trainer', 'throughput', 'ceiling', 'resume',
              'resume_position', 'scale', 'partitioner', 'pipeline',
              'ray', 'elastic', 'precision', 'remote_read', 'offload']


def main() -> None:
  parser = argparse.ArgumentParser(prog='python -m benchmarks.run_all')
  parser.add_argument('--results-dir', default='benchmarks/results')
  parser.add_argument('--only', default=','.join(BENCHMARKS),
                      help=f'Comma-separated subset of {BENCHMARKS}.')
  args = parser.parse_args()
  names = [n for n in args.only.split(',') if n]
  unknown = sorted(set(names) - set(BENCHMARKS))
  if unknown:
    parser.error(f'unknown benchmark(s) {unknown}; choose from {BENCHMARKS}')
  rows = []
  for name in names:
    start = time.time()
    print(f'[bench] {name} ...', flush=True)
    module = importlib.import_module(f'benchmarks.bench_{name}')
    path = module.main(args.results_dir)
    rows.append([name, os.path.basename(path), f'{time.time() - start:.0f}'])
    print(f'[bench] {name} done -> {path}', flush=True)
  print(report.table(['benchmark', 'result file', 'bench wall s'], rows))


if __name__ == '__main__':
  main()
