"""How close HighPerfTrainer trains to the machine's ceiling.

    python -m benchmarks.bench_ceiling [--train-steps N] [--rounds R]
        [--batches 32,256] [--strategies one_device,mirrored] [--ks 64,256,1024]
        [--preflight N] [--report-name NAME]

Side by side in one run, on the full taxi data transformed once by
OptimizedTransform (one pipeline root, MLMD cache), the taxi model
(`pipelines/taxi_module.py`), for each global batch and strategy
(one_device; mirrored on 2 logical CPUs), each measurement in a fresh
process:
- the ceiling: the same Keras model and optimizer stepping over batches
  already parsed into memory (one epoch of the trainer's own input pipeline,
  stacked), CEILING_K steps per `tf.function` call (a `tf.range` loop
  indexing the stacked tensors), no input pipeline, no checkpoints, the loss
  read back once per call; measured with the op pool the trainer's
  `intra_op_threads='auto'` picks (`components.trainer.common.cpu_threads`)
  and, once a round, with TensorFlow's default, the faster counting;
- HighPerfTrainer's executor (a LocalDagRunner run of the Trainer, its
  upstream cached) with the default `steps_per_execution='auto'`;
- the same with each explicit k of `--ks` (the best is reported).
HighPerfTrainer checkpoints by time (every 60 s, as in bench_throughput: by
steps the checkpoints would dominate at this speed). Steady examples/s
excludes the first call (tracing). Larger batches run the same examples,
but at least half the steps (2,500 steps at batch 256 lasted under 3 s:
one slow second moved a run by a third, and 'auto' had not finished
measuring).

A shared VM's speed moves by 1.2-1.8x over minutes here, so a ratio of
processes run minutes apart measures the VM. Every trainer run is therefore
bracketed: the ceiling is measured right before and right after it, and the
run's ratio is to the mean of those two (times the TF-default pool's paired
advantage, where it has one); a bracket whose two ceilings differ by more
than MAX_CEILING_SPREAD judges nothing. Each round runs every variant once,
the order reversed every other round; the median over rounds is reported.
Each round also runs the default job twice: `make run`'s Trainer (its
steps, eval steps, distribution and fault tolerance are the defaults of
`pipelines/cli.py` and the component), whose time outside training is the
issue's goal. Writes benchmarks/results/ceiling.md.

`--preflight N` first measures the batch-32 ceiling N times and stops,
writing nothing, when those moved more than MAX_CEILING_SPREAD (a full run
takes about 40 minutes at 3 rounds).
"""

import json
import os
import tempfile
from typing import Any, Dict, List

from benchmarks import bench_ceiling_report as ceiling_report
from benchmarks import bench_ceiling_runs as ceiling_runs
from benchmarks import harness
from benchmarks import report
from benchmarks.bench_ceiling_runs import (
    BATCHES, DEFAULT_JOB_RUNS, EXPLICIT_KS, MAX_CEILING_SPREAD,
    PREFLIGHT_STEPS, ROUNDS, STRATEGIES, TRAIN_STEPS)

MODULE = 'benchmarks.bench_ceiling'


def _in_process(root: str, mode: str, spec: Dict[str, Any]) -> Dict[str, Any]:
  """`mode` (prepare, trainer, ceiling) in a fresh Python process."""
  return harness.run_mode(MODULE, root, mode, spec)


def _ceiling(root: str, spec: Dict[str, Any], intra_op_threads) -> float:
  """The ceiling of `spec` (run_ceiling's arguments) in a fresh process,
  with the op pool of `intra_op_threads`."""
  value = _in_process(root, 'ceiling', {
      **spec, 'intra_op_threads': intra_op_threads})['examples_per_sec']
  print(f'[bench_ceiling] {spec["strategy"]} batch {spec["batch"]} ceiling, '
        f'intra_op_threads={intra_op_threads}: {value:,.0f}', flush=True)
  return value


def preflight(root: str, inputs: Dict[str, str], runs: int) -> None:
  """Measures the one_device batch-32 ceiling `runs` times; raises
  SystemExit when they moved more than MAX_CEILING_SPREAD."""
  spec = {'inputs': inputs, 'strategy': 'one_device', 'batch': BATCHES[0],
          'train_steps': PREFLIGHT_STEPS}
  rates = [_ceiling(root, spec, 'auto') for _ in range(runs)]
  spread = max(rates) / min(rates)
  print(f'[bench_ceiling] preflight: batch {BATCHES[0]} ceiling '
        f'{", ".join(f"{r:,.0f}" for r in rates)} ex/s ({spread:.2f}x)',
        flush=True)
  if spread > MAX_CEILING_SPREAD:
    raise SystemExit(
        f'bench_ceiling: the ceiling moved {spread:.2f}x over {runs} runs '
        f'(allowed: {MAX_CEILING_SPREAD:.2f}x); this machine is not steady '
        'enough for the ratios, nothing written. Rerun when it is idle.')


def _measure_cell(root: str, inputs: Dict[str, str], m: Dict[str, Any],
                  strategy: str, batch: int, train_steps: int, ks,
                  round_index: int) -> None:
  """One round of one strategy and batch into `m`: the TF-default pool's
  ceiling, then each variant bracketed by the trainer pool's ceilings."""
  distribution = ceiling_runs.distribution(strategy, batch)
  steps = ceiling_runs.steps_at(batch, train_steps)
  variants = [('auto', 'auto')] + [(f'k{k}', k) for k in ks]
  spec = {'inputs': inputs, 'strategy': strategy, 'batch': batch,
          'train_steps': steps}
  m.setdefault('ceiling_tf_default', []).append(_ceiling(root, spec, 0))
  before = _ceiling(root, spec, 'auto')
  m.setdefault('pool_pair', []).append(before)
  m.setdefault('ceiling', []).append(before)
  for name, k in harness.in_round_order(variants, round_index):
    value = _in_process(root, 'trainer', {
        'distribution': {**distribution, 'steps_per_execution': k},
        'train_steps': steps, 'round': round_index})
    after = _ceiling(root, spec, 'auto')
    m['ceiling'].append(after)
    m.setdefault(name, []).append(
        {**value, 'ceiling_before': before, 'ceiling_after': after})
    before = after
    print(f'[bench_ceiling] round {round_index} {strategy} batch {batch} '
          f'{name}: {value}', flush=True)


def _measure_breakdown(root: str, inputs: Dict[str, str], batches,
                       train_steps: int) -> Dict[Any, Dict[str, Any]]:
  breakdown = {}
  for batch in batches:
    for threads in ('auto', 0):
      breakdown[(batch, threads)] = _in_process(root, 'breakdown', {
          'inputs': inputs, 'batch': batch, 'intra_op_threads': threads,
          'train_steps': ceiling_runs.steps_at(batch, train_steps)})
      print(f'[bench_ceiling] breakdown batch {batch} threads {threads}: '
            f'{breakdown[(batch, threads)]}', flush=True)
  return breakdown


def main(results_dir: str = 'benchmarks/results',
         train_steps: int = TRAIN_STEPS, rounds: int = ROUNDS,
         batches=BATCHES, strategies=STRATEGIES, ks=EXPLICIT_KS,
         preflight_runs: int = 0, report_name: str = 'ceiling') -> str:
  root = tempfile.mkdtemp(prefix='bench_ceiling_')
  load_before = os.getloadavg()[0]
  inputs = _in_process(root, 'prepare', {})
  if preflight_runs:
    preflight(root, inputs, preflight_runs)
  measured, default_runs = {}, []
  cells = [(s, b) for s in strategies for b in batches]
  for round_index, order in harness.interleaved_rounds(cells, rounds):
    for strategy, batch in order:
      _measure_cell(root, inputs,
                    measured.setdefault(f'{strategy}@{batch}', {}),
                    strategy, batch, train_steps, ks, round_index)
    for run in range(DEFAULT_JOB_RUNS):
      default_runs.append(_in_process(root, 'trainer', {
          **ceiling_runs.default_job(), 'round': f'{round_index}.{run}'}))
      print(f'[bench_ceiling] round {round_index} default job: '
            f'{default_runs[-1]}', flush=True)
  breakdown = (_measure_breakdown(root, inputs, batches, train_steps)
               if 'one_device' in strategies else {})
  with open(os.path.join(root, 'results.json'), 'w') as f:
    json.dump({'measured': measured, 'default_job': default_runs,
               'breakdown': [[*key, value]
                             for key, value in breakdown.items()]},
              f, indent=1)
  body = ceiling_report.render(measured, train_steps, rounds, list(ks),
                               [load_before, os.getloadavg()[0]])
  body += ceiling_report.render_sections(breakdown, default_runs, measured)
  return report.write(results_dir, report_name,
                      'Training at the ceiling: HighPerfTrainer vs the '
                      'in-memory loop', body)


def _ints(text: str) -> List[int]:
  return [int(v) for v in text.split(',') if v]


MODES = {
    'prepare': lambda root, spec: ceiling_runs.prepare(root),
    'trainer': ceiling_runs.run_trainer,
    'breakdown': lambda root, spec: ceiling_runs.run_breakdown(
        spec['inputs'], spec['batch'], spec['train_steps'],
        spec['intra_op_threads']),
    'ceiling': lambda root, spec: ceiling_runs.run_ceiling(
        spec['inputs'], spec['strategy'], spec['batch'], spec['train_steps'],
        spec['intra_op_threads']),
}


if __name__ == '__main__':
  parser = harness.parser(MODULE)
  parser.add_argument('--train-steps', type=int, default=TRAIN_STEPS)
  parser.add_argument('--rounds', type=int, default=ROUNDS)
  parser.add_argument('--batches', default=','.join(map(str, BATCHES)))
  parser.add_argument('--strategies', default=','.join(STRATEGIES))
  parser.add_argument('--ks', default=','.join(map(str, EXPLICIT_KS)))
  parser.add_argument(
      '--preflight', type=int, default=0, metavar='N',
      help='first measure the batch-32 ceiling N times; stop, writing '
      f'nothing, if it moved more than {MAX_CEILING_SPREAD}x')
  parser.add_argument(
      '--report-name', default='ceiling',
      help='the report is <results-dir>/<name>.md (a run of a subset of '
      'strategies or batches need not replace the full one)')
  harness.entry(parser, lambda args: main(
      args.results_dir, args.train_steps, args.rounds, _ints(args.batches),
      args.strategies.split(','), _ints(args.ks), args.preflight,
      args.report_name), MODES)
