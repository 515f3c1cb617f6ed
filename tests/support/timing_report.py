"""Where the suite's time went: `python -m tests.support.timing_report A.xml ...`.

Reads the JUnit XML files pytest wrote (one per make target) and prints the
slowest tests across them, then each target's wall time and test count, so the
end of a CI log says where the time goes.
"""

import os
import sys
from xml.etree import ElementTree

SLOWEST = 25


def _suites(path):
  root = ElementTree.parse(path).getroot()
  return [root] if root.tag == 'testsuite' else list(root.iter('testsuite'))


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
        cases.append((float(case.get('time', 0)), name))
  print(f'\n=== {SLOWEST} slowest tests (setup + call + teardown) ===')
  for seconds, name in sorted(cases, reverse=True)[:SLOWEST]:
    print(f'{seconds:8.1f} s  {name}')
  print('=== time per target ===')
  for path, seconds, count in totals:
    target = os.path.splitext(os.path.basename(path))[0]
    if seconds is None:
      print(f'{target}: no results ({path} missing)')
    else:
      print(f'{target}: {count} tests in {seconds:.0f} s ({seconds / 60:.1f} min)')
  measured = [seconds for _, seconds, _ in totals if seconds is not None]
  print(f'all: {sum(measured) / 60:.1f} min')


if __name__ == '__main__':
  main(sys.argv[1:])
