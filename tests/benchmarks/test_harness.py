"""The benchmarks' harness: interleaved rounds, summaries over rounds and
the fresh-process protocol."""

import subprocess
import sys

import pytest

from benchmarks import harness

ECHO = 'tests.benchmarks.harness_echo'


def test_rounds_reverse_the_order_every_other_round():
  assert list(harness.interleaved_rounds('abc', 3)) == [
      (0, ['a', 'b', 'c']), (1, ['c', 'b', 'a']), (2, ['a', 'b', 'c'])]
  assert harness.in_round_order([1, 2], 1) == [2, 1]


def test_summaries_over_rounds():
  assert harness.median([3, 1, 2]) == 2
  assert harness.median(v for v in (1, 2, 3, 4)) == 2.5
  assert harness.median_or_none([None, 4, 2]) == 3
  assert harness.median_or_none([None]) is None
  assert harness.median_of([{'x': 1}, {'x': 5}, {'x': 2}], 'x') == 2
  assert harness.mean([1, 2, 6]) == 3


def test_a_mode_runs_in_a_fresh_process_and_answers_json(tmp_path):
  spec = {'steps': 3, 'names': ['a', 'b']}
  assert harness.run_mode(ECHO, str(tmp_path), 'echo', spec) == {
      'root': str(tmp_path), 'spec': spec}


def test_a_failed_mode_shows_its_output(tmp_path):
  with pytest.raises(RuntimeError, match='failing on 7'):
    harness.run_mode(ECHO, str(tmp_path), 'fail', 7, capture=True)
  with pytest.raises(subprocess.CalledProcessError):
    harness.run_mode(ECHO, str(tmp_path), 'fail', 7)


def test_without_a_mode_the_benchmark_runs():
  proc = subprocess.run([sys.executable, '-m', ECHO, '--results-dir', 'R'],
                        capture_output=True, text=True, check=True,
                        cwd=harness.REPO_ROOT)
  assert proc.stdout.strip() == 'benchmark ran, results in R'
