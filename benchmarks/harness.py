"""What every benchmark does the same way.

- Rounds: `interleaved_rounds` gives each round's order of the variants, as
  given in even rounds and reversed in odd ones, so that a drifting machine
  weighs on every variant alike; `in_round_order` is one round's order.
- Summaries over rounds: `median`, `median_or_none` (leaves out what was not
  measured), `median_of` (one key of each run), `mean`.
- The fresh-process protocol: each measurement in a fresh Python process, as
  a pipeline run would be. `run_mode` starts
  `python -m <module> --mode M --root R --spec JSON --out F`; the benchmark's
  command line (`parser`, `entry`) answers it with the mode's function and
  its JSON result, or else runs the benchmark.
- `read_training_result`: the one way a benchmark reads a training's result
  (training_result.json).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import (Any, Callable, Iterable, Iterator, List, Mapping, Optional,
                    Sequence, Tuple, TypeVar)

T = TypeVar('T')

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = 'benchmarks/results'
# The tail of a failed measurement's output that its error shows.
FAILED_TAIL_CHARS = 4000


# --- rounds


def in_round_order(items: Sequence[T], round_index: int) -> List[T]:
  """`items` as round `round_index` runs them: reversed every other round."""
  items = list(items)
  return items if round_index % 2 == 0 else items[::-1]


def interleaved_rounds(items: Sequence[T], rounds: int
                      ) -> Iterator[Tuple[int, List[T]]]:
  """(round index, that round's order of `items`) for each of `rounds`."""
  for round_index in range(rounds):
    yield round_index, in_round_order(items, round_index)


# --- summaries over rounds


def median(values: Iterable[float]) -> float:
  return statistics.median(list(values))


def median_or_none(values: Iterable[Optional[float]]) -> Optional[float]:
  """The median of the values measured (not None); None if there is none."""
  present = [v for v in values if v is not None]
  return statistics.median(present) if present else None


def median_of(runs: Iterable[Mapping[str, Any]], key: str) -> float:
  """The median of each run's `key`."""
  return median(run[key] for run in runs)


def mean(values: Iterable[float]) -> float:
  values = list(values)
  return sum(values) / len(values)


# --- the fresh-process protocol

MODE_ARGUMENTS = ('--mode', '--root', '--spec', '--out')


def run_mode(module: str, root: str, mode: str, spec: Any, *,
             env: Optional[Mapping[str, str]] = None, capture: bool = False,
             timeout: Optional[float] = None) -> Any:
  """`mode` of benchmark `module` on `spec` in a fresh Python process; its
  JSON result. `env` adds to (or overrides) the process's environment;
  `capture`: its output is kept out of the console, and a failure raises
  RuntimeError with the output's tail."""
  out = os.path.join(root, f'out-{time.time_ns()}.json')
  os.makedirs(root, exist_ok=True)
  python_path = os.pathsep.join(
      p for p in (REPO_ROOT, os.environ.get('PYTHONPATH')) if p)
  child_env = dict(os.environ, TF_USE_LEGACY_KERAS='1',
                   TF_CPP_MIN_LOG_LEVEL='2', PYTHONPATH=python_path,
                   **(env or {}))
  argv = [sys.executable, '-m', module, '--root', root, '--mode', mode,
          '--spec', json.dumps(spec), '--out', out]
  if capture:
    proc = subprocess.run(argv, env=child_env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, check=False)
    if proc.returncode:
      raise RuntimeError(
          f'{module} --mode {mode} failed (exit {proc.returncode}):\n'
          f'{proc.stdout[-FAILED_TAIL_CHARS:]}')
  else:
    subprocess.run(argv, env=child_env, timeout=timeout, check=True)
  with open(out) as f:
    return json.load(f)


def write_result(out: str, value: Any) -> None:
  """The measurement's JSON result, where `run_mode` reads it."""
  with open(out, 'w') as f:
    json.dump(value, f)


def parser(module: str, description: Optional[str] = None
          ) -> argparse.ArgumentParser:
  """The command line of benchmark `module` (`benchmarks.bench_<name>`):
  --results-dir, and the hidden arguments `run_mode` passes."""
  result = argparse.ArgumentParser(prog=f'python -m {module}',
                                   description=description)
  result.add_argument('--results-dir', default=RESULTS_DIR)
  for name in MODE_ARGUMENTS:
    result.add_argument(name, help=argparse.SUPPRESS)
  return result


def entry(arguments: argparse.ArgumentParser,
          run: Callable[[argparse.Namespace], Any],
          modes: Optional[Mapping[str, Callable[[str, Any], Any]]] = None
          ) -> None:
  """The benchmark's `__main__`: with --mode (from `run_mode`), one
  measurement in this process, `modes[mode](root, spec)`, whose result goes
  to --out; else `run(args)` (the benchmark), whose result is printed."""
  args = arguments.parse_args()
  if args.mode is None:
    print(run(args))
    return
  os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')
  write_result(args.out, (modes or {})[args.mode](args.root,
                                                  json.loads(args.spec)))


# --- results of the components


def read_training_result(model_run_dir: str):
  """The training result (training_result.json) in `model_run_dir`."""
  # pylint: disable-next=g-import-not-at-top
  from components.records import training_result
  return training_result.read(model_run_dir)
