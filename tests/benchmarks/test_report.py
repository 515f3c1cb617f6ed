"""Benchmark results files: a rerun rewrites the results and keeps the
hand-kept history."""

from benchmarks import report


def test_a_rerun_keeps_the_history_section(tmp_path):
  path = report.write(str(tmp_path), 'x', 'X', 'first results')
  with open(path, 'a') as f:
    f.write(f'\n{report.HISTORY_HEADING}\n\nWhat an earlier run found.\n')
  report.write(str(tmp_path), 'x', 'X', 'second results')
  with open(path) as f:
    text = f.read()
  assert 'second results' in text and 'first results' not in text
  assert text.endswith(f'{report.HISTORY_HEADING}\n\nWhat an earlier run '
                       'found.\n')
  assert text.count(report.HISTORY_HEADING) == 1
