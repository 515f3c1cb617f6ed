"""Mixed precision and XLA: HighPerfTrainer vs the stock Trainer vs a
hand-tuned `model.fit`, per model family and setting.

    python -m benchmarks.bench_precision [--rounds R] [--train-steps N]
        [--families taxi,mlp,cnn,transformer] [--settings ...] [--ks 1,16,64]
        [--quick] [--device-check] [--no-cpu-limits] [--time-budget-s S]
        [--results-dir D] [--render RESULTS_JSON]

Four model families, one TFX user module
(`benchmarks/precision_modules/precision_module.py`, `hparams['family']`):
the taxi wide-and-deep model (`pipelines/taxi_module.py`'s layers, on
synthetic examples with the names and shapes of the transformed taxi
features: no Transform runs), a 1024-1024-512 ReLU MLP on 64 dense
features, a small CNN on 32x32x3 images (a float list) and a 2-layer
Transformer encoder (d_model 128, 4 heads of MultiHeadAttention, token
sequences of 64 ids from a vocabulary of 1,000). Every output layer computes
in float32. The data is written once per benchmark run: TRAIN_EXAMPLES
training and EVAL_EXAMPLES evaluation examples per family, gzipped
tf.Example TFRecords in the Split-train / Split-eval folders of an
Examples artifact, with a Schema artifact
(`schema_utils.schema_from_feature_spec`); the labels follow a fixed
learnable rule (about 5% flipped), so eval accuracy means something.

For each family and setting (dtype policy x XLA; by default float32,
mixed_bfloat16 and mixed_float16 with XLA off, and float32 with XLA on;
`--settings` adds e.g. bfloat16+xla), each measurement in a fresh process:
- ours: HighPerfTrainer's executor (`Executor().Do` with standard
  artifacts, the module in managed mode) with distribution
  {'strategy': 'one_device', 'global_batch_size': B, 'precision': P,
  'xla': X}, the component's other defaults (`steps_per_execution` and
  `intra_op_threads` 'auto', launcher local), and checkpoints every
  SAVE_EVERY_S s instead of every 100 steps (as in bench_ceiling: by steps
  they would weigh on these short runs; the stock fit writes none). Steady
  examples/s (after the first, tracing call), eval accuracy and what the
  trainer decided come from its `training_result.json`;
- stock: the stock Trainer's executor (`GenericExecutor().Do`, the same
  artifacts and the exec properties the stock component gives) with the
  module's `run_fn`: `model.fit` over `fn_args.data_accessor`, the dtype
  policy set before the model is built and `compile(jit_compile=...)` of the
  same setting (float16 with Keras' dynamic loss scaling), validation after
  training as the stock taxi run_fn does. Steady examples/s from a callback
  timing each call of steps (as `benchmarks/fit_run_fn.py`), first call
  excluded;
- hand-tuned fit (a plain process, no TFX): the train split parsed once
  into batches held in memory, the same model and optimizer compiled
  without metrics, for each `steps_per_execution` of FIT_KS that gives at
  least three calls (else 1) a fresh model (the best is reported),
  autograph kept out of tf_keras as in our loop
  (`patches.AUTOGRAPH_SKIPS_TF_KERAS`: it only shortens tracing); steady
  examples/s as for stock.
And once per family and round, ours with precision='auto' and
xla='auto': what it chose, and its rate against the family's best fixed
setting. Each round runs every measurement once, families, settings and
trainers in one order, reversed every other round; medians over rounds.
In a cell, the three trainers train the same steps at the same global
batch on the same files; eval covers the eval split.

Without a GPU, CPU limits apply (`--no-cpu-limits` lifts them). Measured
on the 2-core AVX512-BF16 machine this was written on: float16 ran the CNN
and the Transformer at 3.5-6 s a step (no CPU float16 kernels; 70-200x
float32), so those cells are skipped (CPU_SKIPPED); under XLA the taxi
model's CategoryEncoding (a bincount) compiles again for every distinct
batch (~0.4 s each, 16 distinct batches an epoch here), and XLA's CPU
convolutions took ~4x oneDNN's, so those cells train fewer steps
(CPU_STEPS; their accuracy is left out of the quality guard).

Goals (the issue's): ours >= 1.0x stock in every family and setting; ours
>= 0.95x the hand-tuned fit; 'auto' within 0.95 of the family's best
setting; mixed_bfloat16 >= 1.3x float32 on the MLP (ours, XLA off). The
quality guard lists each family's eval accuracy per precision (ours and
stock, every run at the family's full steps) and flags a precision whose
median is more than max(ACCURACY_TOLERANCE, the spread of the float32
runs) below float32's.

`--device-check` sizes the run for one GPU (GPU_SIZES, DEVICE_CHECK's
families, settings and time budget, one round) and writes
`precision_gpu.md` (`benchmarks/device_check.sh`). Writes
`benchmarks/results/precision.md`; `--render` rewrites a report from the
results.json a run leaves (its path is printed at the end).
"""

import json
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from benchmarks import bench_precision_report as precision_report
from benchmarks import bench_precision_runs as precision_runs
from benchmarks import harness
from benchmarks.bench_precision_runs import (
    AUTO_SETTING, DEVICE_CHECK, FAMILIES, FIT_KS, GPU_SIZES, OURS, PREFIX,
    QUICK, ROUNDS, SETTINGS, SIZES, TRAINERS, label, parse_setting)

MODULE = 'benchmarks.bench_precision'


def _in_process(root: str, mode: str, spec: Dict[str, Any]) -> Dict[str, Any]:
  """`mode` in a fresh Python process; its JSON result."""
  return harness.run_mode(MODULE, root, mode, spec)


def _schedule(cells: List[Dict[str, Any]]
             ) -> List[Tuple[Dict[str, Any], str]]:
  """(cell, trainer) of one round: every trainer of every cell not
  skipped, each family's auto run after its settings (the rounds reverse
  it every other round)."""
  order = []
  for cell in cells:
    if cell['skipped']:
      continue
    if cell['precision'] == AUTO_SETTING[0]:
      order.append((cell, OURS))
    else:
      order.extend((cell, trainer) for trainer in TRAINERS)
  return order


def _measure(root: str, cell: Dict[str, Any], trainer: str, ks,
             properties: Dict[str, Any], round_index: int
            ) -> Optional[Dict[str, Any]]:
  """One trainer on one cell in a fresh process; None where it failed."""
  key = cell['key']
  spec = {**cell, 'ks': list(ks),
          'properties': properties[key].get(trainer),
          'run_dir': os.path.join(
              root, 'runs', f'{key.replace("/", "-")}-{trainer}-'
              f'r{round_index}')}
  started = time.monotonic()
  try:
    value = _in_process(root, trainer, spec)
  except subprocess.CalledProcessError as error:
    print(f'{PREFIX} round {round_index} {key} {trainer} FAILED: '
          f'{error}', flush=True)
    return None
  value['process_s'] = round(time.monotonic() - started, 1)
  # The exported models are not looked at: only their disk space.
  shutil.rmtree(os.path.join(spec['run_dir'], 'Trainer', 'model'),
                ignore_errors=True)
  brief = {k: v for k, v in value.items()
           if k not in ('eval', 'examples_per_sec')}
  print(f"{PREFIX} round {round_index} {cell['family']} "
        f"{label((cell['precision'], cell['xla']))} {trainer}: "
        f"{value['examples_per_sec']:,.0f} ex/s, {json.dumps(brief)}",
        flush=True)
  return value


def main(results_dir: str = 'benchmarks/results', rounds: int = ROUNDS,
         train_steps: Optional[int] = None,
         families: Sequence[str] = FAMILIES,
         settings: Sequence[Tuple[str, str]] = SETTINGS,
         ks: Sequence[int] = FIT_KS, device_check: bool = False,
         cpu_limits: bool = True, time_budget_s: Optional[float] = None,
         report_name: Optional[str] = None,
         save_results: Optional[str] = None) -> str:
  """Runs the comparison; returns the report's path.

  `train_steps` overrides every family's steps (CPU_STEPS still cap);
  `cpu_limits`: CPU_SKIPPED / CPU_STEPS apply where there is no GPU;
  `time_budget_s`: no measurement starts past it (the report says what
  was not measured); `save_results`: also write the raw results there.
  """
  began = time.monotonic()
  unknown = sorted(set(families) - set(FAMILIES))
  if unknown:
    raise ValueError(f'unknown families {unknown}; choose from {FAMILIES}')
  families = list(dict.fromkeys(families))  # In the order given.
  sizes = {f: (batch, train_steps or steps) for f, (batch, steps) in
           (GPU_SIZES if device_check else SIZES).items() if f in families}
  report_name = report_name or ('precision_gpu' if device_check
                                else 'precision')
  root = tempfile.mkdtemp(prefix='bench_precision_')
  load_before = os.getloadavg()[0]
  info = _in_process(root, 'info', {})
  cells = precision_runs.make_cells(families, settings, sizes,
                     cpu_limits and not info['gpus'])
  properties = _in_process(root, 'prepare', {'cells': cells})
  print(f'{PREFIX} data and exec properties ready in {root} '
        f'({time.monotonic() - began:.0f} s)', flush=True)
  measured: Dict[str, Dict[str, List[Dict[str, Any]]]] = {}
  stopped = None
  for round_index, order in harness.interleaved_rounds(_schedule(cells),
                                                       rounds):
    for cell, trainer in order:
      if time_budget_s and time.monotonic() - began > time_budget_s:
        stopped = stopped or f'round {round_index}'
        break
      value = _measure(root, cell, trainer, ks, properties, round_index)
      if value is not None:
        measured.setdefault(cell['key'], {}).setdefault(trainer, []).append(
            value)
  info.update(load=[load_before, os.getloadavg()[0]],
              wall_s=time.monotonic() - began)
  results = {'measured': measured, 'info': info, 'stopped': stopped,
             'cells': cells,
             'config': {'families': list(families),
                        'settings': [list(s) for s in settings],
                        'rounds': rounds, 'ks': list(ks),
                        'device_check': device_check,
                        'time_budget_s': time_budget_s}}
  results_path = os.path.join(root, 'results.json')
  with open(results_path, 'w') as f:
    json.dump(results, f, indent=1)
  if save_results:
    os.makedirs(os.path.dirname(os.path.abspath(save_results)), exist_ok=True)
    with open(save_results, 'w') as f:
      json.dump(results, f, indent=1)
  print(f'{PREFIX} raw results: {save_results or results_path}', flush=True)
  return precision_report.write_report(results, results_dir, report_name)


def _list(text: str) -> List[str]:
  return [v for v in text.split(',') if v]


def _parser():
  parser = harness.parser(
      MODULE, description='Mixed precision and XLA: HighPerfTrainer vs the '
      'stock Trainer vs a hand-tuned fit, per model family and setting.')
  parser.add_argument('--rounds', type=int, default=None,
                      help=f'default {ROUNDS}; 1 with --quick or '
                      '--device-check')
  parser.add_argument('--train-steps', type=int, default=None,
                      help='train steps of every family and setting, '
                      'CPU_STEPS still capping '
                      f'(default per family, (batch, steps): {SIZES}; with '
                      f'--device-check {GPU_SIZES})')
  parser.add_argument('--families', default=None,
                      help=f'comma-separated subset of {",".join(FAMILIES)}')
  parser.add_argument('--settings', default=None,
                      help='comma-separated PRECISION[+xla] (default '
                      'float32,bfloat16,float16,float32+xla; e.g. add '
                      'bfloat16+xla)')
  parser.add_argument('--ks', default=None,
                      help='steps_per_execution values the hand-tuned fit '
                      f'tries (default {",".join(map(str, FIT_KS))})')
  parser.add_argument('--quick', action='store_true',
                      help=f'smoke test: families {",".join(QUICK["families"])}'
                      f', {QUICK["train_steps"]} steps, 1 round (a few '
                      'minutes)')
  parser.add_argument('--device-check', action='store_true',
                      help='sized for one GPU: GPU_SIZES, families '
                      f'{",".join(DEVICE_CHECK["families"])}, 1 round, a '
                      f'{DEVICE_CHECK["time_budget_s"]} s budget; writes '
                      'precision_gpu.md')
  parser.add_argument('--no-cpu-limits', action='store_true',
                      help='without a GPU, still run the cells CPU_SKIPPED '
                      'skips, and CPU_STEPS cells at full steps (slow: '
                      'minutes a run)')
  parser.add_argument('--time-budget-s', type=float, default=None,
                      help='start no measurement past this many seconds')
  parser.add_argument('--report-name', default=None,
                      help='the report is <results-dir>/<name>.md')
  parser.add_argument('--save-results', metavar='PATH',
                      help='also write the raw results (results.json) there')
  parser.add_argument('--render', metavar='RESULTS_JSON',
                      help="only write the report of a run's results.json")
  return parser


def _cli(args) -> Dict[str, Any]:
  """main's arguments: the --quick / --device-check presets, then what is
  given explicitly."""
  preset = (QUICK if args.quick else DEVICE_CHECK if args.device_check
            else {})
  kwargs = {'results_dir': args.results_dir,
            'rounds': preset.get('rounds', ROUNDS),
            'train_steps': preset.get('train_steps'),
            'families': preset.get('families', FAMILIES),
            'settings': preset.get('settings', SETTINGS),
            'ks': preset.get('ks', FIT_KS),
            'device_check': args.device_check,
            'cpu_limits': not args.no_cpu_limits,
            'time_budget_s': preset.get('time_budget_s'),
            'report_name': args.report_name,
            'save_results': args.save_results}
  if args.rounds is not None:
    kwargs['rounds'] = args.rounds
  if args.train_steps is not None:
    kwargs['train_steps'] = args.train_steps
  if args.families:
    kwargs['families'] = tuple(_list(args.families))
  if args.settings:
    kwargs['settings'] = tuple(parse_setting(s) for s in
                               _list(args.settings))
  if args.ks:
    kwargs['ks'] = tuple(int(k) for k in _list(args.ks))
  if args.time_budget_s is not None:
    kwargs['time_budget_s'] = args.time_budget_s
  return kwargs


def _run(args) -> str:
  """--render: the report of a run's results.json; else the benchmark."""
  if not args.render:
    return main(**_cli(args))
  with open(args.render) as f:
    results = json.load(f)
  return precision_report.write_report(
      results, args.results_dir, args.report_name or (
          'precision_gpu' if results['config']['device_check']
          else 'precision'))


MODES = {
    'prepare': lambda root, spec: precision_runs.prepare(root, spec['cells']),
    'info': lambda root, spec: precision_runs.machine_info(),
    **precision_runs.MODES,
}


if __name__ == '__main__':
  harness.entry(_parser(), _run, MODES)
