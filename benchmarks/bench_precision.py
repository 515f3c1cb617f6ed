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

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from benchmarks import processes
from benchmarks import report

MODULE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           'precision_modules', 'precision_module.py')
FAMILIES = ('taxi', 'mlp', 'cnn', 'transformer')
# (global batch, train steps) per family on a 2-core CPU: a float32 run's
# steady part lasts 2-4 s (a Transformer step costs ~20 MLP steps); the taxi
# model's ~1 ms steps need more for `steps_per_execution='auto'` to settle.
SIZES = {'taxi': (256, 4000), 'mlp': (256, 250), 'cnn': (128, 120),
         'transformer': (64, 80)}
# On one GPU (`--device-check`).
GPU_SIZES = {'taxi': (1024, 600), 'mlp': (1024, 600), 'cnn': (512, 300),
             'transformer': (256, 300)}
# (precision, xla) settings.
SETTINGS = (('float32', 'off'), ('mixed_bfloat16', 'off'),
            ('mixed_float16', 'off'), ('float32', 'on'))
AUTO_SETTING = ('auto', 'auto')
FIT_KS = (1, 16, 64)
TRAIN_EXAMPLES = 4096
EVAL_EXAMPLES = 1024
ROUNDS = 2
SAVE_EVERY_S = 60
# Without a GPU (module doc): cells skipped, keyed (family, precision), and
# train steps of slow cells, keyed (family, xla).
CPU_SKIPPED = {
    ('cnn', 'mixed_float16'): 'float16 convolutions have no CPU kernels '
                              '(~6 s a step here, 200x float32)',
    ('transformer', 'mixed_float16'): 'float16 attention and matmuls have '
                                      'no CPU kernels (~3.5 s a step here, '
                                      '70x float32)',
}
CPU_STEPS = {('taxi', 'on'): 40, ('cnn', 'on'): 60}
# --quick: a smoke test of every trainer and default setting.
QUICK = {'families': ('mlp',), 'train_steps': 40, 'rounds': 1,
         'ks': (1, 16)}
# --device-check: one GPU, about 6 minutes (the Transformer first: what
# the time budget leaves out comes last).
DEVICE_CHECK = {'families': ('transformer', 'mlp'), 'rounds': 1,
                'ks': (16, 64), 'time_budget_s': 330}
# The goals.
GOAL_VS_STOCK = 1.0
GOAL_VS_HAND_TUNED = 0.95
GOAL_AUTO_VS_BEST = 0.95
GOAL_BF16_MLP = 1.3
ACCURACY_TOLERANCE = 0.01
OURS, STOCK, FIT = 'ours', 'stock', 'fit'
TRAINERS = (OURS, STOCK, FIT)
PREFIX = '[bench_precision]'


def label(setting: Sequence[str]) -> str:
  if tuple(setting) == AUTO_SETTING:
    return 'auto'
  precision, xla = setting
  return precision.replace('mixed_', '') + ('+XLA' if xla == 'on' else '')


def parse_setting(text: str) -> Tuple[str, str]:
  """'float32', 'mixed_bfloat16+xla', 'bfloat16+XLA' -> (precision, xla)."""
  name, _, xla = text.partition('+')
  if xla and xla.lower() != 'xla':
    raise ValueError(f'{text!r}: write a setting as PRECISION or '
                     'PRECISION+xla')
  if name in ('bfloat16', 'float16'):
    name = 'mixed_' + name
  if name not in ('float32', 'mixed_bfloat16', 'mixed_float16'):
    raise ValueError(f'{text!r}: the precision is one of float32, '
                     'mixed_bfloat16, mixed_float16')
  return name, 'on' if xla else 'off'


def _key(family: str, setting: Sequence[str]) -> str:
  return f'{family}/{setting[0]}/{setting[1]}'


def make_cells(families: Sequence[str], settings: Sequence[Tuple[str, str]],
               sizes: Dict[str, Tuple[int, int]], cpu_limits: bool
              ) -> List[Dict[str, Any]]:
  """One cell per family and setting (and the family's auto run): what
  all its trainers run, or why it is skipped (`cpu_limits`: CPU_SKIPPED
  and CPU_STEPS apply)."""
  cells = []
  for family in families:
    batch, steps = sizes[family]
    for setting in list(settings) + [AUTO_SETTING]:
      precision, xla = setting
      cell = {'key': _key(family, setting), 'family': family,
              'precision': precision, 'xla': xla, 'batch': batch,
              'train_steps': steps, 'full_steps': True,
              'eval_steps': max(1, EVAL_EXAMPLES // batch), 'skipped': None}
      if cpu_limits:
        cell['skipped'] = CPU_SKIPPED.get((family, precision))
        limit = CPU_STEPS.get((family, xla))
        if limit and limit < steps:
          cell.update(train_steps=limit, full_steps=False)
      cells.append(cell)
  return cells


# --- data and artifacts


def _family_dir(root: str, family: str) -> str:
  return os.path.join(root, 'data', family)


def prepare(root: str, cells: List[Dict[str, Any]]) -> Dict[str, Any]:
  """Writes each family's Examples (train and eval splits) and Schema;
  returns the exec properties of both trainers for each cell (family,
  setting, batch, steps), as the components give them to an orchestrator
  (made here once: importing the components costs a measurement process
  seconds)."""
  # pylint: disable-next=g-import-not-at-top
  from benchmarks.precision_modules import precision_module as module
  families = sorted({cell['family'] for cell in cells}, key=FAMILIES.index)
  for family in families:
    index = FAMILIES.index(family)
    examples = os.path.join(_family_dir(root, family), 'examples')
    module.write_examples(os.path.join(examples, 'Split-train'), family,
                          TRAIN_EXAMPLES, seed=2 * index)
    module.write_examples(os.path.join(examples, 'Split-eval'), family,
                          EVAL_EXAMPLES, seed=2 * index + 1, num_files=1)
    module.write_schema(os.path.join(_family_dir(root, family), 'schema',
                                     'schema.pbtxt'), family)
  return {cell['key']: {OURS: _ours_properties(cell),
                        STOCK: _stock_properties(cell)} for cell in cells}


def _inputs(root: str, family: str):
  # pylint: disable=g-import-not-at-top
  from tfx.types import standard_artifacts
  # pylint: enable=g-import-not-at-top
  examples = standard_artifacts.Examples()
  examples.uri = os.path.join(_family_dir(root, family), 'examples')
  examples.split_names = json.dumps(['train', 'eval'])
  schema = standard_artifacts.Schema()
  schema.uri = os.path.join(_family_dir(root, family), 'schema')
  return {'examples': [examples], 'schema': [schema]}


def _outputs(run_dir: str):
  """Model and ModelRun artifacts in a pipeline-root-like layout of their
  own (ours keeps its checkpoints next to them)."""
  # pylint: disable-next=g-import-not-at-top
  from tfx.types import standard_artifacts
  model, model_run = standard_artifacts.Model(), standard_artifacts.ModelRun()
  model.uri = os.path.join(run_dir, 'Trainer', 'model', '1')
  model_run.uri = os.path.join(run_dir, 'Trainer', 'model_run', '1')
  for artifact in (model, model_run):
    os.makedirs(artifact.uri, exist_ok=True)
  return {'model': [model], 'model_run': [model_run]}


def _runtime_properties(component) -> Dict[str, Any]:
  """Exec properties as an orchestrator passes them: protos as JSON."""
  # pylint: disable-next=g-import-not-at-top
  from google.protobuf import json_format
  return {
      key: (json_format.MessageToJson(value, preserving_proto_field_name=True)
            if hasattr(value, 'DESCRIPTOR') else value)
      for key, value in component.exec_properties.items()
      if value is not None}


def _trainer_args(cell: Dict[str, Any]) -> Dict[str, Any]:
  # pylint: disable=g-import-not-at-top
  from tfx import v1 as tfx
  from tfx.types import standard_artifacts
  # pylint: enable=g-import-not-at-top
  return dict(
      examples=tfx.dsl.Channel(type=standard_artifacts.Examples),
      schema=tfx.dsl.Channel(type=standard_artifacts.Schema),
      module_file=MODULE_FILE,
      train_args=tfx.proto.TrainArgs(num_steps=cell['train_steps']),
      eval_args=tfx.proto.EvalArgs(num_steps=cell['eval_steps']))


def _ours_properties(cell: Dict[str, Any]) -> Dict[str, Any]:
  """HighPerfTrainer, managed mode, one_device, the cell's precision and
  XLA, checkpoints by time (module doc), else the defaults."""
  from components import HighPerfTrainer  # pylint: disable=g-import-not-at-top
  return _runtime_properties(HighPerfTrainer(
      **_trainer_args(cell),
      custom_config={'hparams': {'family': cell['family']}},
      distribution={'strategy': 'one_device',
                    'global_batch_size': cell['batch'],
                    'precision': cell['precision'], 'xla': cell['xla']},
      fault_tolerance={'max_restarts': 0, 'save_every_steps': None,
                       'save_every_s': SAVE_EVERY_S}))


def _stock_properties(cell: Dict[str, Any]) -> Dict[str, Any]:
  """The stock Trainer; its run_fn reads the setting from custom_config."""
  from tfx import v1 as tfx  # pylint: disable=g-import-not-at-top
  return _runtime_properties(tfx.components.Trainer(
      **_trainer_args(cell),
      custom_config={'hparams': {'family': cell['family']},
                     'batch_size': cell['batch'],
                     'precision': cell['precision'], 'xla': cell['xla']}))


# --- one measurement (each in its own process)


def run_ours(root: str, spec: Dict[str, Any]) -> Dict[str, Any]:
  """HighPerfTrainer's executor, managed mode, on `spec`'s setting."""
  from components.trainer import executor  # pylint: disable=g-import-not-at-top
  outputs = _outputs(spec['run_dir'])
  began = time.monotonic()
  executor.Executor().Do(_inputs(root, spec['family']), outputs,
                         spec['properties'])
  wall = time.monotonic() - began
  with open(os.path.join(outputs['model_run'][0].uri,
                         'training_result.json')) as f:
    result = json.load(f)
  assert result['steps'] == spec['train_steps'], result
  assert result['global_batch_size'] == spec['batch'], result
  return {'examples_per_sec': result['examples_per_sec'],
          'accuracy': result['eval'].get('accuracy'),
          'eval': result['eval'],
          'precision': result['precision'], 'xla': result['xla'],
          'steps_per_execution': result.get('steps_per_execution'),
          'steps_by_call_length': result.get('steps_by_call_length'),
          'rate_includes_first_step': result.get('rate_includes_first_step'),
          'train_loss': result.get('train_loss'),
          'first_call_s': result.get('timing', {}).get('first_call_s'),
          'executor_wall_s': round(wall, 2)}


def run_stock(root: str, spec: Dict[str, Any]) -> Dict[str, Any]:
  """The stock Trainer's executor with the module's fit `run_fn`."""
  # pylint: disable=g-import-not-at-top
  from tfx.components.trainer import executor
  from benchmarks.precision_modules import precision_module as module
  # pylint: enable=g-import-not-at-top
  outputs = _outputs(spec['run_dir'])
  began = time.monotonic()
  executor.GenericExecutor().Do(_inputs(root, spec['family']), outputs,
                                spec['properties'])
  wall = time.monotonic() - began
  with open(os.path.join(outputs['model_run'][0].uri,
                         module.FIT_RESULT_FILE)) as f:
    result = json.load(f)
  return {'examples_per_sec': round(
      result['steady_steps_per_sec'] * spec['batch'], 2),
          'accuracy': result['eval'].get(module.ACCURACY),
          'eval': result['eval'], 'calls': result['calls'],
          'first_call_s': result['first_call_s'],
          'loss_scale': result['loss_scale'], 'policy': result['policy'],
          'executor_wall_s': round(wall, 2)}


def run_fit(root: str, spec: Dict[str, Any]) -> Dict[str, Any]:
  """The hand-tuned fit: in-memory batches, no metrics, each k of
  spec['ks'] that gives three calls or more (else k=1); the best k's
  steady examples/s."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from components import patches
  from benchmarks.call_timer import CallTimer
  from benchmarks.precision_modules import precision_module as module
  # pylint: enable=g-import-not-at-top
  family, batch = spec['family'], spec['batch']
  feature_spec = module.feature_spec(family)

  def parse(serialized):
    features = tf.io.parse_example(serialized, feature_spec)
    return features, features.pop(module.LABEL_KEY)

  files = tf.io.gfile.glob(os.path.join(_family_dir(root, family), 'examples',
                                        'Split-train', '*'))
  # Parsed once: every batch of the split, held in memory.
  batches = list(tf.data.TFRecordDataset(files, compression_type='GZIP')
                 .batch(batch, drop_remainder=True).map(parse))
  stacked = tf.nest.map_structure(lambda *t: tf.stack(t), *batches)
  dataset = tf.data.Dataset.from_tensor_slices(stacked).repeat().prefetch(2)
  rates = {}
  steps = spec['train_steps']
  # At least three calls of k steps (the first, tracing, is not counted).
  ks = [k for k in spec['ks'] if 3 * k <= steps] or [1]
  with patches.installed(patches.AUTOGRAPH_SKIPS_TF_KERAS):
    for k in ks:
      tf.keras.backend.clear_session()
      tf.keras.mixed_precision.set_global_policy(spec['precision'])
      model = module.uncompiled_model(family)
      loss, _ = module.loss_and_metric(family)
      model.compile(optimizer=tf.keras.optimizers.Adam(1e-3), loss=loss,
                    steps_per_execution=k,
                    jit_compile=spec['xla'] == 'on')
      tf.keras.mixed_precision.set_global_policy('float32')
      timer = CallTimer()
      model.fit(dataset, steps_per_epoch=steps, verbose=0, callbacks=[timer])
      rates[k] = round(timer.steady_steps_per_sec() * batch, 2)
  best = max(rates, key=rates.get)
  return {'examples_per_sec': rates[best], 'best_k': best,
          'by_k': {str(k): v for k, v in rates.items()},
          'batches_in_memory': len(batches)}


MODES = {OURS: run_ours, STOCK: run_stock, FIT: run_fit}


def _in_process(root: str, mode: str, spec: Dict[str, Any]) -> Dict[str, Any]:
  """`mode` in a fresh Python process; its JSON result."""
  return processes.run_mode('benchmarks.bench_precision', root, mode, spec)


def machine_info() -> Dict[str, Any]:
  """CPU, its half-precision flags, GPUs, versions."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  import tfx
  from components.trainer.managed import precision
  # pylint: enable=g-import-not-at-top
  flags = precision.cpu_flags()
  cpu = platform.processor() or platform.machine()
  try:
    with open(precision.CPUINFO) as f:
      cpu = next((line.split(':', 1)[1].strip() for line in f
                  if line.startswith('model name')), cpu)
  except OSError:
    pass
  gpus = tf.config.list_physical_devices('GPU')
  names = [tf.config.experimental.get_device_details(g).get('device_name',
                                                             'GPU')
           for g in gpus]
  return {'cpu': f'{cpu} ({os.cpu_count()} cores)',
          'cpu_flags': ', '.join(
              f'{flag} {"yes" if flag in flags else "no"}'
              for flag in ('avx512f', 'avx512_bf16', 'amx_bf16',
                           'avx512_fp16', 'amx_fp16')),
          'gpus': names, 'tf_version': tf.__version__,
          'tfx_version': tfx.__version__}


# --- the report


def _median(values: List[Optional[float]]) -> Optional[float]:
  values = [v for v in values if v is not None]
  return statistics.median(values) if values else None


def _rate(value: Optional[float]) -> str:
  return '-' if value is None else f'{value:,.0f}'


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
  return a / b if a is not None and b else None


def _fmt_ratio(value: Optional[float]) -> str:
  return '-' if value is None else f'{value:.2f}'


def _accuracy(runs: List[Dict[str, Any]]) -> str:
  values = [r['accuracy'] for r in runs if r.get('accuracy') is not None]
  if not values:
    return '-'
  text = f'{statistics.median(values):.3f}'
  if len(values) > 1:
    text += f' ({min(values):.3f}-{max(values):.3f})'
  return text


def _calls(runs: List[Dict[str, Any]]) -> str:
  """The steps per call ours' 'auto' chose, or for a run that ended while
  it measured, the length most of its steps ran at."""
  labels = set()
  for run in runs:
    if run.get('steps_per_execution') is not None:
      labels.add(str(run['steps_per_execution']))
    elif run.get('steps_by_call_length'):
      ran = run['steps_by_call_length']
      labels.add(f'none yet (most at {max(ran, key=ran.get)})')
  return ', '.join(sorted(labels)) or '-'


def _auto_choice(run: Dict[str, Any]) -> str:
  xla = run.get('xla') or {}
  return (f"{run['precision']['policy'].replace('mixed_', '')}"
          f"{'+XLA' if xla.get('enabled') else ''}")


def _rates(runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
  return {t: _median([r['examples_per_sec'] for r in runs.get(t, [])])
          for t in TRAINERS}


def quality_guard(measured: Dict[str, Any], cells: List[Dict[str, Any]],
                  family: str) -> Tuple[str, List[str]]:
  """The family's eval accuracy per precision (ours and stock, XLA off and
  on, every run at the family's full steps) and the precisions that lose
  more than the noise band against float32."""
  by_precision: Dict[str, List[float]] = {}
  for cell in cells:
    if (cell['family'] != family or not cell['full_steps'] or
        cell['precision'] == AUTO_SETTING[0]):
      continue
    runs = measured.get(cell['key'], {})
    for trainer in (OURS, STOCK):
      by_precision.setdefault(cell['precision'], []).extend(
          r['accuracy'] for r in runs.get(trainer, [])
          if r.get('accuracy') is not None)
  reference = by_precision.get('float32') or []
  if not reference:
    return 'no float32 run to compare with', []
  base = statistics.median(reference)
  band = max(ACCURACY_TOLERANCE, max(reference) - min(reference))
  parts, flagged = [], []
  for precision, values in by_precision.items():
    if not values:
      continue
    value = statistics.median(values)
    loss = base - value
    flag = precision != 'float32' and loss > band
    parts.append(f'{precision} {value:.3f} ({len(values)} runs, '
                 f'{min(values):.3f}-{max(values):.3f})'
                 + (' **FLAGGED**' if flag else ''))
    if flag:
      flagged.append(f'{family} {precision} {value:.3f}, {loss:.3f} below '
                     f'float32 {base:.3f} (band {band:.3f})')
  return (f'band {band:.3f}: ' + '; '.join(parts)), flagged


def render(results: Dict[str, Any]) -> str:
  """The report's body of `results` (what `main` saved as results.json)."""
  measured, info, config = (results['measured'], results['info'],
                            results['config'])
  cells = results['cells']
  below_stock, below_hand, auto_lines, guard_lines = [], [], [], []
  judged = {STOCK: 0, FIT: 0}
  flagged, missing, skipped, sections = [], [], [], []
  bf16_line = None
  for family in config['families']:
    family_cells = [c for c in cells if c['family'] == family]
    batch = family_cells[0]['batch']
    full = max(c['train_steps'] for c in family_cells)
    rows, best = [], None
    for cell in family_cells:
      if cell['precision'] == AUTO_SETTING[0]:
        continue
      name = f"{family} {label((cell['precision'], cell['xla']))}"
      steps_note = ('' if cell['full_steps'] else
                    f" ({cell['train_steps']} steps)")
      if cell['skipped']:
        skipped.append(f"{name}: {cell['skipped']}")
        rows.append([label((cell['precision'], cell['xla'])),
                     f"skipped: {cell['skipped']}"] + ['-'] * 7)
        continue
      runs = measured.get(cell['key'], {})
      rates = _rates(runs)
      vs_stock = _ratio(rates[OURS], rates[STOCK])
      vs_hand = _ratio(rates[OURS], rates[FIT])
      ks = sorted({r['best_k'] for r in runs.get(FIT, [])})
      rows.append([
          label((cell['precision'], cell['xla'])) + steps_note,
          _rate(rates[OURS]), _rate(rates[STOCK]),
          _rate(rates[FIT]) + (f" (k={','.join(map(str, ks))})"
                               if ks else ''),
          _fmt_ratio(vs_stock), _fmt_ratio(vs_hand),
          _accuracy(runs.get(OURS, [])), _accuracy(runs.get(STOCK, [])),
          _calls(runs.get(OURS, []))])
      if None in rates.values():
        missing.append(name)
      judged[STOCK] += vs_stock is not None
      judged[FIT] += vs_hand is not None
      if vs_stock is not None and vs_stock < GOAL_VS_STOCK:
        below_stock.append(f'{name} {vs_stock:.2f}')
      if vs_hand is not None and vs_hand < GOAL_VS_HAND_TUNED:
        below_hand.append(f'{name} {vs_hand:.2f}')
      if rates[OURS] is not None and (best is None or rates[OURS] > best[1]):
        best = (label((cell['precision'], cell['xla'])), rates[OURS])
    auto_runs = measured.get(_key(family, AUTO_SETTING), {}).get(OURS, [])
    if auto_runs:
      auto_rate = _rates({OURS: auto_runs})[OURS]
      chosen = ' / '.join(sorted({_auto_choice(r) for r in auto_runs}))
      rows.append([f'auto: chose {chosen}', _rate(auto_rate), '-', '-', '-',
                   '-', _accuracy(auto_runs), '-', _calls(auto_runs)])
      vs_best = _ratio(auto_rate, best and best[1])
      reasons = '; '.join(sorted({
          f"precision: {r['precision']['reason']}; XLA: "
          f"{(r.get('xla') or {}).get('reason')}" for r in auto_runs}))
      auto_lines.append(
          f'{family}: chose {chosen}, {_rate(auto_rate)} ex/s = '
          f"{'-' if vs_best is None else f'{vs_best:.3f}'} of the best "
          'setting '
          f"({best[0] if best else '-'}, {_rate(best and best[1])} ex/s): "
          + ('PASS' if vs_best is not None and vs_best >= GOAL_AUTO_VS_BEST
             else 'FAIL') + f' ({reasons})')
    elif any(c['precision'] == AUTO_SETTING[0] for c in family_cells):
      missing.append(f'{family} auto')
    guard, family_flagged = quality_guard(measured, cells, family)
    guard_lines.append(f'{family}: {guard}')
    flagged.extend(family_flagged)
    sections.append(
        f'### {family} (global batch {batch}, {full} train steps, eval '
        f"{family_cells[0]['eval_steps']} steps)\n\n" +
        report.table(['setting', 'ours ex/s', 'stock ex/s',
                      'hand-tuned fit ex/s (best k)', 'ours / stock',
                      'ours / hand-tuned', 'eval acc. ours',
                      'eval acc. stock', 'ours steps/call'], rows))
    if family == 'mlp':
      bf16_line = _bf16_goal(measured, family)

  def verdict(failures: List[str], count: int) -> str:
    if not count:
      return 'not measured'
    if not failures:
      return f'PASS ({count} of {count} cells)'
    return (f'FAIL ({len(failures)} of {count} cells below): '
            + ', '.join(failures))

  goals = [
      f'ours >= {GOAL_VS_STOCK:.1f}x stock in every family and setting: '
      + verdict(below_stock, judged[STOCK]),
      f'ours >= {GOAL_VS_HAND_TUNED}x the hand-tuned fit: '
      + verdict(below_hand, judged[FIT]),
      f"'auto' within {GOAL_AUTO_VS_BEST} of the family's best setting:"
      + ('' if auto_lines else ' not measured'),
      *[f'  - {line}' for line in auto_lines],
      bf16_line or (f'mixed_bfloat16 >= {GOAL_BF16_MLP}x float32 on the MLP: '
                    'not measured'),
      'quality guard, eval accuracy per precision (a precision more than '
      'the band below float32 is flagged): '
      + ('nothing flagged' if not flagged else
         'FLAGGED: ' + '; '.join(flagged)),
      *[f'  - {line}' for line in guard_lines],
  ]
  if skipped:
    goals.append('skipped without a GPU (CPU_SKIPPED): '
                 + '; '.join(skipped))
  if missing:
    goals.append('not measured (time budget or a failed run, see the log): '
                 + ', '.join(missing))
  devices = ('GPU: ' + ', '.join(info['gpus'])) if info['gpus'] else 'no GPU'
  return (
      f"Machine: {info['cpu']}; CPU flags: {info['cpu_flags']}; {devices}; "
      f"TensorFlow {info['tf_version']}, TFX {info['tfx_version']}. "
      f"{config['rounds']} round(s), every measurement in a fresh process, "
      'families, settings and trainers interleaved with the order reversed '
      "every other round, 'auto' once per family and round; medians "
      'over rounds (eval accuracy: median, min-max). Synthetic data: '
      f'{TRAIN_EXAMPLES:,} train / {EVAL_EXAMPLES:,} eval examples per '
      'family. Ours: the HighPerfTrainer executor, managed, one_device, '
      "steps_per_execution and intra_op_threads 'auto', checkpoints every "
      f'{SAVE_EVERY_S} s. Stock: the stock Trainer executor, `model.fit` '
      'over the data accessor. Hand-tuned fit: in-memory batches, no '
      f"metrics, the best steps_per_execution of {config['ks']} (those "
      'giving 3 calls or more). Steady examples/s, first (tracing) call '
      'excluded. Load average before/after: '
      f"{info['load'][0]:.1f} / {info['load'][1]:.1f} (a shared machine); "
      f"bench wall {info['wall_s'] / 60:.1f} min.\n\n## Goals\n\n" +
      '\n'.join(g if g.startswith('  ') else f'- {g}' for g in goals) +
      '\n\n## Per family\n\n' + '\n\n'.join(sections) + '\n')


def _bf16_goal(measured: Dict[str, Any], family: str) -> Optional[str]:
  def ours(setting):
    return _rates(measured.get(_key(family, setting), {}))[OURS]

  f32, bf16 = ours(('float32', 'off')), ours(('mixed_bfloat16', 'off'))
  ratio = _ratio(bf16, f32)
  if ratio is None:
    return None
  line = (f'mixed_bfloat16 >= {GOAL_BF16_MLP}x float32 on the MLP (ours, XLA '
          f'off): {ratio:.2f}x ({_rate(bf16)} vs {_rate(f32)} ex/s): '
          + ('PASS' if ratio >= GOAL_BF16_MLP else 'FAIL'))
  f32x, bf16x = ours(('float32', 'on')), ours(('mixed_bfloat16', 'on'))
  if f32x and bf16x:
    line += (f'; with XLA on: {bf16x / f32x:.2f}x ({_rate(bf16x)} vs '
             f'{_rate(f32x)} ex/s)')
  return line


def write_report(results: Dict[str, Any], results_dir: str,
                 report_name: str) -> str:
  body = render(results)
  if results.get('stopped'):
    body = (f"**Stopped at the time budget "
            f"({results['config']['time_budget_s']:.0f} s) in "
            f"{results['stopped']}**: what was not measured shows as -.\n\n"
            + body)
  title = ('Mixed precision and XLA: HighPerfTrainer vs stock Trainer vs '
           'hand-tuned fit'
           + (' (one GPU)' if results['config']['device_check'] else ''))
  return report.write(results_dir, report_name, title, body)


# --- the run


def _schedule(cells: List[Dict[str, Any]], round_index: int
             ) -> List[Tuple[Dict[str, Any], str]]:
  """(cell, trainer) of one round: every trainer of every cell not
  skipped, each family's auto run after its settings;
  reversed every other round."""
  order = []
  for cell in cells:
    if cell['skipped']:
      continue
    if cell['precision'] == AUTO_SETTING[0]:
      order.append((cell, OURS))
    else:
      order.extend((cell, trainer) for trainer in TRAINERS)
  return order if round_index % 2 == 0 else order[::-1]


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
  cells = make_cells(families, settings, sizes,
                     cpu_limits and not info['gpus'])
  properties = _in_process(root, 'prepare', {'cells': cells})
  print(f'{PREFIX} data and exec properties ready in {root} '
        f'({time.monotonic() - began:.0f} s)', flush=True)
  measured: Dict[str, Dict[str, List[Dict[str, Any]]]] = {}
  stopped = None
  for round_index in range(rounds):
    for cell, trainer in _schedule(cells, round_index):
      if time_budget_s and time.monotonic() - began > time_budget_s:
        stopped = stopped or f'round {round_index}'
        break
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
        continue
      value['process_s'] = round(time.monotonic() - started, 1)
      # The exported models are not looked at: only their disk space.
      shutil.rmtree(os.path.join(spec['run_dir'], 'Trainer', 'model'),
                    ignore_errors=True)
      measured.setdefault(key, {}).setdefault(trainer, []).append(value)
      brief = {k: v for k, v in value.items()
               if k not in ('eval', 'examples_per_sec')}
      print(f"{PREFIX} round {round_index} {cell['family']} "
            f"{label((cell['precision'], cell['xla']))} {trainer}: "
            f"{value['examples_per_sec']:,.0f} ex/s, {json.dumps(brief)}",
            flush=True)
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
  return write_report(results, results_dir, report_name)


def _list(text: str) -> List[str]:
  return [v for v in text.split(',') if v]


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='python -m benchmarks.bench_precision',
      description='Mixed precision and XLA: HighPerfTrainer vs the stock '
      'Trainer vs a hand-tuned fit, per model family and setting.')
  parser.add_argument('--results-dir', default='benchmarks/results')
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
  processes.add_mode_arguments(parser)
  return parser


def _cli(args: argparse.Namespace) -> Dict[str, Any]:
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


if __name__ == '__main__':
  parsed = _parser().parse_args()
  if parsed.render:
    with open(parsed.render) as f_:
      results_ = json.load(f_)
    print(write_report(results_, parsed.results_dir, parsed.report_name or (
        'precision_gpu' if results_['config']['device_check']
        else 'precision')))
  elif parsed.mode is None:
    print(main(**_cli(parsed)))
  else:
    os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')
    spec_ = json.loads(parsed.spec)
    if parsed.mode == 'prepare':
      value_ = prepare(parsed.root, spec_['cells'])
    elif parsed.mode == 'info':
      value_ = machine_info()
    else:
      value_ = MODES[parsed.mode](parsed.root, spec_)
    processes.write_result(parsed.out, value_)
