"""A benchmark's command line at its smallest, for test_harness: mode
'echo' answers its spec, 'fail' exits 3 after a line of output."""

import sys

from benchmarks import harness


def _fail(root, spec):
  del root
  print(f'failing on {spec}', flush=True)
  sys.exit(3)


MODES = {'echo': lambda root, spec: {'root': root, 'spec': spec},
         'fail': _fail}

if __name__ == '__main__':
  harness.entry(harness.parser('tests.benchmarks.harness_echo'),
                lambda args: f'benchmark ran, results in {args.results_dir}',
                MODES)
