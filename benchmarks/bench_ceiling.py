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

import argparse
import glob
import json
import os
import statistics
import tempfile
import time
from typing import Any, Dict, List, Optional

from benchmarks import processes
from benchmarks import report

TRAIN_STEPS = 20000
ROUNDS = 1
BATCHES = (32, 256)
STRATEGIES = ('one_device', 'mirrored')
EXPLICIT_KS = (64, 256, 1024)
CEILING_K = 256
EVAL_STEPS = 20
PIPELINE_NAME = 'bench_ceiling'
# Goals of issue 20.
GOAL_RATIO = 0.85
GOAL_VS_BEST_K = 0.95
GOAL_OUTSIDE_TRAINING_S = 5.0
DEFAULT_JOB_RUNS = 2  # per round: it varies more than the rest.
SAVE_EVERY_SECONDS = 60
# Largest max/min of the two ceilings bracketing a trainer run (or of the
# preflight's runs) under which a ratio can judge the goals.
MAX_CEILING_SPREAD = 1.10
PREFLIGHT_STEPS = 8192


def steps_at(batch: int, train_steps: int) -> int:
  """`train_steps` at the smallest batch; the same examples at larger
  batches, but at least half the steps (module doc)."""
  return max(1, train_steps // 2, train_steps * BATCHES[0] // batch)


def _distribution(strategy: str, batch: int) -> Dict[str, Any]:
  if strategy == 'mirrored':
    return {'strategy': 'mirrored', 'logical_cpu_devices': 2,
            'global_batch_size': batch}
  return {'strategy': strategy, 'global_batch_size': batch}


def _pipeline(root: str, trainer_args=None):
  """ExampleGen .. OptimizedTransform (tuned for batch 32), then optionally
  HighPerfTrainer with `trainer_args` (distribution, train_steps, round)."""
  # pylint: disable=g-import-not-at-top
  from tfx import v1 as tfx
  from components import HighPerfTrainer, OptimizedTransform
  from pipelines import data
  from pipelines import taxi_pipeline
  # pylint: enable=g-import-not-at-top
  module_file = data.default_module_file()
  example_gen, statistics_gen, schema_gen = taxi_pipeline.upstream(
      data.default_data_root())
  transform = OptimizedTransform(
      examples=example_gen.outputs['examples'],
      schema=schema_gen.outputs['schema'], module_file=module_file,
      tuning={'trainer_batch_size': BATCHES[0]}).with_id(
          taxi_pipeline.TRANSFORM_ID)
  components = [example_gen, statistics_gen, schema_gen, transform]
  if trainer_args:
    components.append(HighPerfTrainer(
        module_file=module_file,
        examples=transform.outputs['transformed_examples'],
        transform_graph=transform.outputs['transform_graph'],
        schema=schema_gen.outputs['schema'],
        tuned_input_pipeline=transform.outputs['tuned_input_pipeline'],
        train_args=tfx.proto.TrainArgs(num_steps=trainer_args['train_steps']),
        eval_args=tfx.proto.EvalArgs(
            num_steps=trainer_args.get('eval_steps', EVAL_STEPS)),
        custom_config={'benchmark_round': trainer_args['round']},
        distribution=trainer_args['distribution'],
        fault_tolerance=trainer_args.get('fault_tolerance', {
            'max_restarts': 0, 'save_every_steps': None,
            'save_every_s': SAVE_EVERY_SECONDS})).with_id(
                taxi_pipeline.TRAINER_ID))
  return tfx.dsl.Pipeline(
      pipeline_name=PIPELINE_NAME, pipeline_root=root, components=components,
      enable_cache=True,
      metadata_connection_config=(
          tfx.orchestration.metadata.sqlite_metadata_connection_config(
              os.path.join(root, 'metadata.db'))),
      beam_pipeline_args=['--direct_running_mode=in_memory',
                          '--direct_num_workers=1'])


def _newest(pattern: str) -> str:
  """The newest execution's output folder matching `pattern`."""
  paths = glob.glob(pattern)
  if not paths:
    raise FileNotFoundError(f'Nothing matches {pattern}.')
  return max(paths, key=lambda p: int(p.rstrip('/').split('/')[-1]))


def prepare(root: str) -> Dict[str, str]:
  """Transforms the taxi data once; returns what the ceiling reads."""
  from tfx import v1 as tfx  # pylint: disable=g-import-not-at-top
  tfx.orchestration.LocalDagRunner().run(_pipeline(root))
  return {
      'examples': _newest(os.path.join(root, 'Transform',
                                       'transformed_examples', '*')),
      'transform_graph': _newest(os.path.join(root, 'Transform',
                                              'transform_graph', '*')),
      'tuned_input_pipeline': _newest(os.path.join(
          root, 'Transform', 'tuned_input_pipeline', '*')),
  }


def default_job() -> Dict[str, Any]:
  """`make run`'s Trainer: the steps, eval steps and distribution flags'
  defaults (`pipelines/cli.py`), the component's fault tolerance."""
  from pipelines import cli  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser()
  cli.add_pipeline_flags(parser)
  flags = parser.parse_args([])
  return {'distribution': json.loads(flags.distribution),
          'train_steps': flags.train_steps, 'eval_steps': flags.eval_steps,
          'fault_tolerance': None}


def run_trainer(root: str, trainer_args: Dict[str, Any]) -> Dict[str, Any]:
  """One Trainer execution (upstream cached) with `trainer_args`
  (`_pipeline`'s); its measurements."""
  # pylint: disable=g-import-not-at-top
  from tfx import v1 as tfx
  from pipelines import summary
  # pylint: enable=g-import-not-at-top
  train_steps = trainer_args['train_steps']
  tfx.orchestration.LocalDagRunner().run(_pipeline(root, trainer_args))
  run = summary.read_run(os.path.join(root, 'metadata.db'))
  with open(os.path.join(report.latest_model_run_uri(root),
                         'training_result.json')) as f:
    result = json.load(f)
  with open(os.path.join(report.latest_model_run_uri(root),
                         'launch.json')) as f:
    launch = json.load(f)
  assert result['steps'] == train_steps, result
  return {'examples_per_sec': result['examples_per_sec'],
          'steps_per_execution': result['steps_per_execution'],
          'auto': result.get('steps_per_execution_auto'),
          'steps_by_call_length': result.get('steps_by_call_length'),
          'timing': {**launch['timing'], **result.get('timing', {})},
          'trainer_wall_s': {e.node_id: e.wall_s
                             for e in run.executions}['Trainer']}


def _auto_label(run: Dict[str, Any]) -> str:
  """The length 'auto' chose, or for a run that ended while it measured,
  the length most of its steps ran at."""
  if run['steps_per_execution'] is not None:
    return str(run['steps_per_execution'])
  ran = run['steps_by_call_length']  # Recorded by every managed run.
  return f'none yet (most steps at {max(ran, key=ran.get)})'


def run_ceiling(inputs: Dict[str, str], strategy_name: str, batch: int,
                train_steps: int, intra_op_threads='auto') -> Dict[str, Any]:
  """The ceiling (module doc) in this process: steady examples/s, with
  the op pool of `intra_op_threads` (as the trainer's option)."""
  # pylint: disable=g-import-not-at-top
  from components.data import input_pipeline
  from components.trainer.common import cpu_threads
  from components.trainer.strategies import choice as strategy_lib
  from components.trainer.strategies import registry
  from components.trainer.config import DistributionConfig
  from components.records import tuned_input_pipeline
  from pipelines import taxi_module
  import tensorflow as tf
  import tensorflow_transform as tft
  # pylint: enable=g-import-not-at-top
  config = DistributionConfig.from_dict(_distribution(strategy_name, batch))
  strategy_lib.configure_logical_cpus(config.logical_cpu_devices)
  cpu_threads.configure(intra_op_threads)
  strategy = registry.get(config.strategy).build(config)
  replicas = strategy.num_replicas_in_sync
  pipeline_config = tuned_input_pipeline.read(inputs['tuned_input_pipeline'])
  spec = tft.TFTransformOutput(
      inputs['transform_graph']).transformed_feature_spec()
  # One epoch of the trainer's own batches (the rows a cached epoch holds).
  dataset = input_pipeline.build_dataset(
      [os.path.join(inputs['examples'], 'Split-train', '*')], spec,
      taxi_module.LABEL_KEY, batch_size=batch, config=pipeline_config,
      seed=0, num_epochs=1)
  batches = list(dataset)
  stacked = tf.nest.map_structure(lambda *t: tf.stack(t), *batches)
  num_batches = len(batches)
  per_replica = batch // replicas

  def replica_slice(context):
    start = context.replica_id_in_sync_group * per_replica
    return tf.nest.map_structure(
        lambda t: tf.identity(t[:, start:start + per_replica]), stacked)

  data = strategy.experimental_distribute_values_from_function(
      replica_slice)
  with strategy.scope():
    model = taxi_module.build_model({})
    optimizer = model.optimizer
    loss_fn = tf.keras.losses.get(model.loss)  # Per example, if a function.
    if isinstance(loss_fn, tf.keras.losses.Loss):
      loss_fn = type(loss_fn).from_config({**loss_fn.get_config(),
                                           'reduction': 'none'})
    optimizer.build(model.trainable_variables)

  @tf.autograph.experimental.do_not_convert
  def step(local, index):
    features, labels = tf.nest.map_structure(lambda t: t[index], local)
    labels = tf.cast(tf.reshape(labels, [-1, 1]), tf.float32)
    with tf.GradientTape() as tape:
      predictions = model(features, training=True)
      loss = tf.nn.compute_average_loss(loss_fn(labels, predictions),
                                        global_batch_size=batch)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return loss

  @tf.function
  def run(k, offset):
    total = tf.constant(0.0)
    for i in tf.range(k):
      index = (offset + i) % num_batches
      losses = strategy.run(step, args=(data, index))
      total += strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)
    return total / tf.cast(k, tf.float32)

  k = tf.constant(CEILING_K, tf.int64)
  float(run(k, tf.constant(0, tf.int64)))  # Traces; not measured.
  calls = max(1, train_steps // CEILING_K)
  began = time.monotonic()
  for call in range(calls):
    loss = float(run(k, tf.constant(call * CEILING_K, tf.int64)))
  seconds = time.monotonic() - began
  return {'examples_per_sec': calls * CEILING_K * batch / seconds,
          'num_batches': num_batches, 'loss': loss}


def run_breakdown(inputs: Dict[str, str], batch: int, train_steps: int,
                  intra_op_threads, k: int = CEILING_K) -> Dict[str, Any]:
  """Where the loop loses to the ceiling (one_device, `k` steps per call,
  the op pool of `intra_op_threads`): steady examples/s of the ceiling, of
  the trainer's step (replica step, `strategy.run`, step counter, loss
  reduce) over the same stacked batches, of the trainer's input pipeline
  alone (the batches only touched), through
  `distribute_datasets_from_function`'s iterator and through the dataset's
  own, and of the trainer's step runner (input and step); and a profiler
  trace of two of the runner's calls (`tf_trace`)."""
  # pylint: disable=g-import-not-at-top
  from benchmarks import tf_trace
  from components.trainer.managed import accumulation
  from components.trainer.common import cpu_threads
  from components.data import input_pipeline
  from components.data import shard_index
  from components.trainer.managed import datasets
  from components.trainer.managed import step_runners
  from components.records import tuned_input_pipeline
  from pipelines import taxi_module
  import tensorflow as tf
  import tensorflow_transform as tft
  # pylint: enable=g-import-not-at-top
  threads = cpu_threads.configure(intra_op_threads)['threads']
  strategy = tf.distribute.OneDeviceStrategy('/cpu:0')
  config = tuned_input_pipeline.read(inputs['tuned_input_pipeline'])
  spec = tft.TFTransformOutput(
      inputs['transform_graph']).transformed_feature_spec()
  train_files = [os.path.join(inputs['examples'], 'Split-train', '*')]
  data = datasets.TrainingData(
      feature_spec=spec, label_key=taxi_module.LABEL_KEY, raw_label_key=None,
      config=config, tf_transform_output=None)
  # The trainer's data order (one partition) over the examples' index.
  files = input_pipeline.list_files(train_files)
  index, _ = shard_index.ensure(train_files, files, config.compression_type,
                                tempfile.mkdtemp(), build_missing=True)
  check = datasets.DataCheck(train_records=index.records_by_path())
  order = datasets.train_order(data, check, datasets.DATA_SEED, batch, 1)
  # Every iterator below reads at most 2 x train_steps + the traced calls.
  dataset_fn = datasets.ordered_train_dataset_fn(
      check, data, order, 0, 2 * train_steps + 4 * k)
  batches = list(dataset_fn(tf.distribute.InputContext()).take(
      max(1, 10_000 // batch)))
  stacked = tf.nest.map_structure(lambda *t: tf.stack(t), *batches)
  with strategy.scope():
    model = taxi_module.build_model({})
    model.optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64, trainable=False)
  replica_step = accumulation.replica_step_fn(model, 1, batch, batch)

  @tf.function
  def stacked_steps(k, offset):
    total = tf.constant(0.0)
    for i in tf.range(k):
      index = (offset + i) % len(batches)
      batch_i = tf.nest.map_structure(lambda t: t[index], stacked)
      losses = strategy.run(replica_step, args=(batch_i,))
      step.assign_add(1)
      total += strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)
    return total / tf.cast(k, tf.float32)

  def input_only(iterator):
    @tf.function
    def run(k):
      total = tf.constant(0.0)
      for _ in tf.range(k):
        features, _ = next(iterator)
        total += tf.reduce_sum(tf.cast(
            features[taxi_module.transformed_name('fare')], tf.float32))
      return total
    return run

  distributed = input_only(iter(
      strategy.distribute_datasets_from_function(dataset_fn)))
  own = input_only(iter(dataset_fn(tf.distribute.InputContext())))

  runner = step_runners.SynchronousSteps(strategy, dataset_fn, replica_step,
                                         step)

  def timed(call):
    call(0)  # Traces; not measured.
    calls = max(1, train_steps // k)
    began = time.monotonic()
    for index in range(calls):
      float(call((index + 1) * k))
    return calls * k * batch / (time.monotonic() - began)

  kk = tf.constant(k, tf.int64)
  rates = {
      'trainer step over stacked batches': timed(
          lambda at: stacked_steps(kk, tf.constant(at, tf.int64))),
      'input alone, distributed iterator': timed(
          lambda at: distributed(kk)),
      "input alone, the dataset's own iterator": timed(lambda at: own(kk)),
      'trainer step runner (input + step)': timed(
          lambda at: runner(at, k)[1]),
  }
  print(rates, flush=True)
  rates['ceiling'] = run_ceiling(inputs, 'one_device', batch, train_steps,
                                 intra_op_threads)['examples_per_sec']
  calls = 2
  busy = tf_trace.trace(lambda: [float(runner(0, k)[1])
                                 for _ in range(calls)])
  return {'intra_op_threads': threads, 'rates': rates,
          'trace_us_per_step': {label: seconds / (calls * k) * 1e6
                                for label, seconds in busy.items()}}


def _in_process(root: str, mode: str, spec: Dict[str, Any]) -> Dict[str, Any]:
  """`mode` (prepare, trainer, ceiling) in a fresh Python process."""
  return processes.run_mode('benchmarks.bench_ceiling', root, mode, spec)


def _ceiling(root: str, spec: Dict[str, Any], intra_op_threads) -> float:
  """The ceiling of `spec` (run_ceiling's arguments) in a fresh process,
  with the op pool of `intra_op_threads`."""
  value = _in_process(root, 'ceiling', {
      **spec, 'intra_op_threads': intra_op_threads})['examples_per_sec']
  print(f'[bench_ceiling] {spec["strategy"]} batch {spec["batch"]} ceiling, '
        f'intra_op_threads={intra_op_threads}: {value:,.0f}', flush=True)
  return value


def _median(values: List[float]) -> float:
  return statistics.median(values)


def _pool(threads: int) -> str:
  return f'{threads} intra-op' if threads else 'TF default'


def render_breakdown(breakdown: Dict[Any, Dict[str, Any]]) -> str:
  """The breakdown table (each piece's examples/s and share of the ceiling
  in the same process) and the profiler's time per step of the runner."""
  rows, trace_rows = [], []
  for (batch, _), measured in breakdown.items():
    rates, pool = measured['rates'], _pool(measured['intra_op_threads'])
    for name, rate in rates.items():
      rows.append([batch, pool, name, f'{rate:,.0f}',
                   f'{rate / rates["ceiling"]:.2f}'])
    trace_rows.append([batch, pool] + [
        f'{us:.0f}' for us in measured['trace_us_per_step'].values()])
  labels = list(next(iter(breakdown.values()))['trace_us_per_step'])
  return (report.table(['global batch', 'op pool', 'what runs (one_device, '
                        f'{CEILING_K} steps per call)', 'examples/s',
                        'vs ceiling'], rows) +
          '\n\nProfiler trace of two calls of the trainer step runner '
          '(`benchmarks/tf_trace.py`): busy microseconds per step of each '
          'group of threads.\n\n' +
          report.table(['global batch', 'op pool'] + labels, trace_rows))


def render_fixed_cost(runs: List[Dict[str, Any]]) -> str:
  """The Trainer's time outside training, by part (from
  `training_result.json` and `launch.json` `timing`), for the given
  runs."""
  parts = ['executor_before_launch_s', 'worker_imports_s', 'worker_setup_s',
           'setup_s', 'build_model_s', 'restore_s', 'first_call_s',
           'eval_s', 'export_s']
  rows = []
  for run in runs:
    timing = run.get('timing') or {}
    train = timing.get('train_s') or 0.0
    rows.append([f'{run["trainer_wall_s"]:.1f}', f'{train:.1f}',
                 f'{run["trainer_wall_s"] - train:.1f}'] +
                [f'{timing[p]:.2f}' if timing.get(p) is not None else 'n/a'
                 for p in parts])
  return report.table(['Trainer wall s (MLMD)', 'training s',
                       'outside training s'] + parts, rows)


def render_default_job(runs: List[Dict[str, Any]]) -> str:
  """The default job's runs: the goal's verdict, then the parts."""
  job = default_job()
  outside = [r['trainer_wall_s'] - (r['timing'] or {}).get('train_s', 0.0)
             for r in runs]
  walls = [r['trainer_wall_s'] for r in runs]
  median = _median(outside)
  verdict = 'met' if median <= GOAL_OUTSIDE_TRAINING_S else 'NOT met'
  return (f'The default job (`make run`\'s Trainer: {job["train_steps"]} '
          f'steps, {job["eval_steps"]} eval steps, default settings), '
          f'{len(runs)} run(s): outside training median {median:.1f} s '
          f'(range {min(outside):.1f}-{max(outside):.1f} s; goal <= '
          f'{GOAL_OUTSIDE_TRAINING_S:.0f} s: {verdict}); the whole Trainer '
          f'step median {_median(walls):.1f} s ({min(walls):.1f}-'
          f'{max(walls):.1f} s). Parts from MLMD and `training_result.json` '
          '`timing`:\n\n' +
          render_fixed_cost(runs) + '\n')


def _pool_advantage(m: Dict[str, Any]) -> float:
  """How much faster the TF-default pool's ceiling ran than the trainer's
  pool's measured right after it (median over rounds; 1 where slower)."""
  return max(1.0, _median([tf_default / trainer_pool for tf_default,
                           trainer_pool in zip(m['ceiling_tf_default'],
                                               m['pool_pair'])]))


def bracket_ceiling(run: Dict[str, Any], advantage: float) -> Optional[float]:
  """The ceiling a trainer run is judged by: the mean of the two measured
  right before and after it, times the TF-default pool's `advantage`; None
  where those two differ by more than MAX_CEILING_SPREAD."""
  low, high = sorted((run['ceiling_before'], run['ceiling_after']))
  if high / low > MAX_CEILING_SPREAD:
    return None
  return (low + high) / 2 * advantage


def _whole_rate(run: Dict[str, Any], steps: int, batch: int) -> float:
  """Examples/s over the whole training: every call, traces and saves."""
  return steps * batch / run['timing']['train_s']


def render(measured: Dict[str, Any], train_steps: int, rounds: int,
           ks: List[int], load: List[float]) -> str:
  rows, verdicts = [], []
  names = ['auto'] + [f'k{k}' for k in ks]
  for key, m in measured.items():
    strategy, batch = key.split('@')
    steps = steps_at(int(batch), train_steps)
    advantage = _pool_advantage(m)
    ratios: Dict[str, List[float]] = {name: [] for name in names}
    whole: Dict[str, List[float]] = {name: [] for name in names}
    for name in names:
      for run in m[name]:
        ceiling = bracket_ceiling(run, advantage)
        if ceiling is not None:
          ratios[name].append(run['examples_per_sec'] / ceiling)
          whole[name].append(_whole_rate(run, steps, int(batch)) / ceiling)
    steady = sum(map(len, ratios.values()))
    by_k = {k: _median(ratios[f'k{k}']) for k in ks if ratios[f'k{k}']}
    ceilings = m['ceiling']
    chosen = ', '.join(map(_auto_label, m['auto']))
    row = [strategy, batch,
           f'{_median(ceilings):,.0f} ({min(ceilings):,.0f}-'
           f'{max(ceilings):,.0f}, {max(ceilings) / min(ceilings):.2f}x)',
           f'{_median(m["ceiling_tf_default"]):,.0f} ({advantage:.2f})',
           f'{steady} of {sum(len(m[n]) for n in names)}',
           f'{_median([r["examples_per_sec"] for r in m["auto"]]):,.0f}',
           chosen]
    if not ratios['auto'] or not by_k:
      rows.append(row + ['-'] * 4)
      verdicts.append(
          f'{strategy} batch {batch}: NOT STEADY, no trainer run of '
          f"{'an explicit k' if ratios['auto'] else 'auto'} had a "
          f'bracket within {MAX_CEILING_SPREAD:.2f}x; nothing to judge.')
      continue
    auto = _median(ratios['auto'])
    best_k = max(by_k, key=by_k.get)
    whole_k = {k: _median(whole[f'k{k}']) for k in by_k}
    best_whole = max(whole_k, key=whole_k.get)
    vs_best_whole = _median(whole['auto']) / whole_k[best_whole]
    rows.append(row + [
        f'{auto:.2f} ({len(ratios["auto"])})',
        ', '.join(f'k={k}: {v:.2f} ({len(ratios[f"k{k}"])})'
                  for k, v in by_k.items()),
        f'{auto / by_k[best_k]:.2f} (k={best_k})',
        f'{vs_best_whole:.2f} (k={best_whole})'])
    if strategy == 'one_device':
      verdicts.append(
          f'batch {batch}: defaults {auto:.2f} of the ceiling (goal >= '
          f'{GOAL_RATIO}: {"met" if auto >= GOAL_RATIO else "NOT met"}); '
          f'of the best explicit k (goal >= {GOAL_VS_BEST_K}): '
          f'{auto / by_k[best_k]:.2f} of k={best_k} steady, '
          f'{vs_best_whole:.2f} of k={best_whole} over the whole training.')
  return (
      f'Full taxi data transformed once by OptimizedTransform (tuned for '
      f'batch {BATCHES[0]}), the taxi model, {train_steps} train steps at '
      f'batch {BATCHES[0]} (the same examples at larger batches, at least '
      f'{train_steps // 2} steps), {rounds} round(s) of interleaved '
      'measurements (each in a fresh process), medians. Ceiling: the same '
      'model and optimizer over one epoch of batches stacked in memory, '
      f'{CEILING_K} steps per `tf.function` call, no input pipeline, no '
      "checkpoints, with the op pool the trainer's `intra_op_threads='auto'` "
      "picks, measured right before and right after every trainer run, and "
      "once a round with TensorFlow's default pool, paired with the next; "
      'a trainer run is judged against the mean of its two brackets times '
      "the TF-default pool's paired advantage where it is faster (in "
      'brackets in the table), and not at all where its brackets differ '
      f'by more than {MAX_CEILING_SPREAD:.2f}x (steady brackets: how many '
      'runs were judged; the count of each ratio in brackets). '
      'HighPerfTrainer: its executor through LocalDagRunner (upstream '
      f'cached), checkpoints every {SAVE_EVERY_SECONDS} s; steady examples/s '
      'from `training_result.json` (first call excluded: a longer first '
      "call hides more of the first epoch's reads, which favours a large "
      "explicit k over 'auto''s 4-step first calls), and over the whole "
      'training (steps x batch / `timing.train_s`: every call, the traces '
      'and the checkpoints included). Load average '
      f'before/after: {load[0]:.1f} / {load[1]:.1f}.\n\n' +
      report.table(['strategy', 'global batch',
                    "ceiling ex/s, trainer's pool (range over the run)",
                    'ceiling ex/s, TF default (paired advantage)',
                    'steady brackets', 'defaults (auto) ex/s',
                    'auto chose k', 'defaults / ceiling',
                    'explicit k / ceiling',
                    'defaults / best k, steady',
                    'defaults / best k, whole training'], rows) +
      '\n\n' + '\n'.join(f'- {v}' for v in verdicts) + '\n')


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
  for round_index in range(rounds):
    cells = [(s, b) for s in strategies for b in batches]
    for strategy, batch in (cells if round_index % 2 == 0 else cells[::-1]):
      m = measured.setdefault(f'{strategy}@{batch}', {})
      distribution = _distribution(strategy, batch)
      steps = steps_at(batch, train_steps)
      variants = [('auto', 'auto')] + [(f'k{k}', k) for k in ks]
      spec = {'inputs': inputs, 'strategy': strategy, 'batch': batch,
              'train_steps': steps}
      m.setdefault('ceiling_tf_default', []).append(
          _ceiling(root, spec, 0))
      before = _ceiling(root, spec, 'auto')
      m.setdefault('pool_pair', []).append(before)
      m.setdefault('ceiling', []).append(before)
      for name, k in (variants if round_index % 2 == 0 else variants[::-1]):
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
    for run in range(DEFAULT_JOB_RUNS):
      default_runs.append(_in_process(root, 'trainer', {
          **default_job(), 'round': f'{round_index}.{run}'}))
      print(f'[bench_ceiling] round {round_index} default job: '
            f'{default_runs[-1]}', flush=True)
  breakdown = {}
  if 'one_device' in strategies:
    for batch in batches:
      for threads in ('auto', 0):
        breakdown[(batch, threads)] = _in_process(root, 'breakdown', {
            'inputs': inputs, 'batch': batch, 'intra_op_threads': threads,
            'train_steps': steps_at(batch, train_steps)})
        print(f'[bench_ceiling] breakdown batch {batch} threads {threads}: '
              f'{breakdown[(batch, threads)]}', flush=True)
  with open(os.path.join(root, 'results.json'), 'w') as f:
    json.dump({'measured': measured, 'default_job': default_runs,
               'breakdown': [[*key, value]
                             for key, value in breakdown.items()]},
              f, indent=1)
  body = render(measured, train_steps, rounds, list(ks),
                [load_before, os.getloadavg()[0]])
  if breakdown:
    body += ('\n## Where the loop loses to the ceiling\n\n'
             'Each piece alone in one process, one_device, '
             f'{CEILING_K} steps per call (`--mode breakdown`).\n\n' +
             render_breakdown(breakdown) + '\n')
  body += ('\n## The Trainer\'s time outside training\n\n' +
           render_default_job(default_runs))
  auto_runs = [r for key, m in measured.items() for r in m.get('auto', [])]
  if auto_runs:
    body += ('\nThe runs with the defaults above (every strategy and batch, '
             f'{EVAL_STEPS} eval steps):\n\n' +
             render_fixed_cost(auto_runs) + '\n')
  return report.write(results_dir, report_name,
                      'Training at the ceiling: HighPerfTrainer vs the '
                      'in-memory loop', body)


def _ints(text: str) -> List[int]:
  return [int(v) for v in text.split(',') if v]


if __name__ == '__main__':
  parser = argparse.ArgumentParser(prog='python -m benchmarks.bench_ceiling')
  parser.add_argument('--results-dir', default='benchmarks/results')
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
  processes.add_mode_arguments(parser)
  args = parser.parse_args()
  if args.mode is None:
    print(main(args.results_dir, args.train_steps, args.rounds,
               _ints(args.batches), args.strategies.split(','),
               _ints(args.ks), args.preflight, args.report_name))
  else:
    os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')
    spec = json.loads(args.spec)
    if args.mode == 'prepare':
      value = prepare(args.root)
    elif args.mode == 'trainer':
      value = run_trainer(args.root, spec)
    elif args.mode == 'breakdown':
      value = run_breakdown(spec['inputs'], spec['batch'],
                            spec['train_steps'], spec['intra_op_threads'])
    else:
      value = run_ceiling(spec['inputs'], spec['strategy'], spec['batch'],
                          spec['train_steps'], spec['intra_op_threads'])
    processes.write_result(args.out, value)
