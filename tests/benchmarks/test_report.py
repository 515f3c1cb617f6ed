"""Benchmark results files: a rerun rewrites the results and keeps the
hand-kept history."""

import os

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


def test_a_report_names_its_lane_and_each_lane_keeps_its_own_file(
    tmp_path, monkeypatch):
  path = report.write(str(tmp_path), 'x', 'X', 'results')
  with open(path) as f:
    first_line = f.read().split('\n')[2]
  assert first_line.startswith(f'Measured on the TFX {report.lane()} lane '
                               '(TFX 1.')
  # The other lane's results go beside these, not over them.
  other = '1.21' if report.lane() == report.PLAIN_NAMES_LANE else '1.16'
  monkeypatch.setattr(report, 'lane', lambda: other)
  other_path = report.write(str(tmp_path), 'x', 'X', 'other results')
  assert other_path != path and os.path.exists(path)
  assert {os.path.basename(path), os.path.basename(other_path)} == {
      'x.md', 'x-tfx1.21.md'}
