"""Where the suite's time went:
`python -m tests.support.timing_report A.xml ...`.

Reads the JUnit XML files pytest wrote and prints the slowest tests, then each
set's time and test count (the `set` property tests/conftest.py records:
core, extended), then each file's wall time, so the end of a CI log says
where the time goes.
"""

import collections
import os
import sys
from xml.etree import ElementTree

SLOWEST = 25


def _suites(path):
  root = ElementTree.parse(path).getroot()
  return [root] if root.tag == 'testsuite' else list(root.iter('testsuite'))


def _set_of(case) -> str:
  for prop in case.iter('property'):
    if prop.get('name') == 'set':
      return prop.get('value')
  return 'unknown'


def main(paths):
  cases, totals = [], []
  for path in paths:
    if not os.path.exists(path):
      totals.append((path, None, 0))
      continue
    for suite in _suites(path):
      totals.append((path, float(suite.get('time', 0)),
                     int(suite.get('tests', 0))))
      for case in suite.iter('testcase'):
        name = f"{case.get('classname')}::{case.get('name')}"
        cases.append((float(case.get('time', 0)), name, _set_of(case)))
  print(f'\n=== {SLOWEST} slowest tests (setup + call + teardown) ===')
  for seconds, name, test_set in sorted(cases, reverse=True)[:SLOWEST]:
    print(f'{seconds:8.1f} s  [{test_set}] {name}')
  print('=== time per set (sum of its tests) ===')
  per_set = collections.defaultdict(lambda: [0.0, 0])
  for seconds, _, test_set in cases:
    per_set[test_set][0] += seconds
    per_set[test_set][1] += 1
  for test_set, (seconds, count) in sorted(per_set.items()):
    print(f'{test_set}: {count} tests in {seconds:.0f} s '
          f'({seconds / 60:.1f} min)')
  print('=== wall time per file ===')
  for path, seconds, count in totals:
    target = os.path.splitext(os.path.basename(path))[0]
    if seconds is None:
      print(f'{target}: no results ({path} missing)')
    else:
      print(f'{target}: {count} tests in {seconds:.0f} s '
            f'({seconds / 60:.1f} min)')


if __name__ == '__main__':
  main(sys.argv[1:])
