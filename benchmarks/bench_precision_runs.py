"""bench_precision's settings, cells and measurements: the data and the
exec properties (`prepare`), and each trainer's run (`run_ours`,
`run_stock`, `run_fit`) in the fresh process `bench_precision` starts
(`--mode`); `bench_precision` says what is measured and why."""

import json
import os
import platform
import time
from typing import Any, Dict, List, Sequence, Tuple

from benchmarks import harness

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


def key(family: str, setting: Sequence[str]) -> str:
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
      cell = {'key': key(family, setting), 'family': family,
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
  result = harness.read_training_result(outputs['model_run'][0].uri)
  assert result.steps == spec['train_steps'], result
  assert result.global_batch_size == spec['batch'], result
  return {'examples_per_sec': result.loop.examples_per_sec,
          'accuracy': result.loop.eval.get('accuracy'),
          'eval': result.loop.eval,
          'precision': result.loop.precision, 'xla': result.loop.xla,
          'steps_per_execution': result.loop.steps_per_execution,
          'steps_by_call_length': result.loop.steps_by_call_length,
          'rate_includes_first_step': result.loop.rate_includes_first_step,
          'train_loss': result.loop.train_loss,
          'first_call_s': result.timing.get('first_call_s'),
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


MODES = {OURS: run_ours, STOCK: run_stock, FIT: run_fit}
