"""GPipePartitioner benchmark: partition quality, solve time, bubble, memory,
step time. Writes benchmarks/results/partitioner.md.

    python -m benchmarks.bench_partitioner

- Partition quality: slowest stage / optimum of a uniform layer split and of
  the block-partition heuristic (Barany-Grinberg, as in torchgpipe), on
  profiles of real Keras models and on random heterogeneous costs.
- Solve time of the exact partitioner for 1,000 layers x 64 stages.
- On logical CPU devices: step time of GPipe against naive model parallelism
  (M=1) and one device, and the measured bubble (idle fraction of the stages,
  from a TF profiler trace) against (K-1)/(M+K-1).
- Peak memory (CPU allocator) per re-materialization mode.
- GPipe against 1F1B in one run, K in {2, 4} x M in {4, 8, 16}: step time,
  measured idle against (K-1)/(M+K-1), transient peak memory, and a chart
  of the measured schedule beside the simulated one.

The TensorFlow measurements run in fresh worker processes (this module with
--worker), because logical devices and the allocator must be configured
before TensorFlow starts.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
# Importing TensorFlow does not start its devices; each worker configures
# them before its first op.
import tensorflow as tf

from benchmarks import report
from components.devices import configure_logical_cpus
from components.partitioner import partition
from components.partitioner import plan as plan_lib
from components.partitioner import profiling
from components.partitioner import report as partition_report
from components.pipeline_parallel import graph as graph_lib
from components.pipeline_parallel import placement
from components.pipeline_parallel import runner as pipeline_runner
from components.pipeline_parallel import schedules
from components.pipeline_parallel import simulator
from components.pipeline_parallel import timeline
from pipelines import taxi_module

LOGICAL_DEVICES = 4
REAL_MODEL_MICROBATCH = 16
STAGE_COUNTS = (2, 4, 8)
PIPELINE_BATCH = 512
PIPELINE_WIDTH = 512
PIPELINE_LAYERS = 8
# (stages, micro-batches, remat) for the step time and bubble table.
# K=1 with M>1 isolates the cost of micro-batching itself.
PIPELINE_RUNS = [(1, 1, 'never'), (1, 4, 'never'), (1, 16, 'never'),
                 (2, 1, 'never'), (2, 4, 'never'),
                 (2, 16, 'never'), (2, 16, 'except_last'), (2, 16, 'always'),
                 (4, 1, 'never'), (4, 4, 'never'), (4, 16, 'never')]
TIMED_ROUNDS = 7
MEMORY_BATCH = 2048
MEMORY_WIDTH = 256
MEMORY_MICROBATCHES = 8
# GPipe against 1F1B, side by side in one process.
SCHEDULE_STAGES = (2, 4)
SCHEDULE_MICROBATCHES = (4, 8, 16)
SCHEDULE_CHART_CASE = (4, 8)  # (K, M) whose measured schedules are charted.
SCHEDULE_CHART = f'{report.results_name("partitioner")}_schedules.png'


# ---------------------------------------------------------------- models


def _real_models():
  """name -> (model, one micro-batch of inputs)."""
  b = REAL_MODEL_MICROBATCH
  models = {}

  taxi = taxi_module.build_model()
  models['taxi wide&deep'] = (taxi, tf.nest.map_structure(
      lambda kt: tf.ones([b, 1], kt.dtype), taxi.input))

  x = tf.keras.Input((256,))
  h = x
  for width in (64, 1024, 64, 2048, 128, 512, 32, 1024, 256, 64):
    h = tf.keras.layers.Dense(width, activation='relu')(h)
  mlp = tf.keras.Model(x, tf.keras.layers.Dense(1)(h))
  models['heterogeneous MLP'] = (mlp, tf.random.normal([b, 256]))

  image = tf.keras.Input((32, 32, 3))
  h = image
  for filters in (16, 16, None, 32, 32, None, 64, 64):
    h = (tf.keras.layers.MaxPooling2D()(h) if filters is None else
         tf.keras.layers.Conv2D(filters, 3, padding='same',
                                activation='relu')(h))
  h = tf.keras.layers.GlobalAveragePooling2D()(h)
  cnn = tf.keras.Model(image, tf.keras.layers.Dense(10)(h))
  models['small CNN'] = (cnn, tf.random.normal([b, 32, 32, 3]))

  tokens = tf.keras.Input((32, 64))
  h = tokens
  for _ in range(4):
    attended = tf.keras.layers.MultiHeadAttention(4, 16)(h, h)
    h = tf.keras.layers.LayerNormalization()(
        tf.keras.layers.Add()([h, attended]))
    ffn = tf.keras.layers.Dense(256, activation='relu')(h)
    ffn = tf.keras.layers.Dense(64)(ffn)
    h = tf.keras.layers.LayerNormalization()(tf.keras.layers.Add()([h, ffn]))
  encoder = tf.keras.Model(
      tokens, tf.keras.layers.Dense(1)(
          tf.keras.layers.GlobalAveragePooling1D()(h)))
  models['transformer encoder (skips)'] = (encoder,
                                           tf.random.normal([b, 32, 64]))
  for model, _ in models.values():
    model.compile(optimizer='adam', loss='mse')
  return models


def _mlp(width, layers, seed=0):
  tf.keras.utils.set_random_seed(seed)
  model = tf.keras.Sequential(
      [tf.keras.Input((width,))] +
      [tf.keras.layers.Dense(width, activation='relu')
       for _ in range(layers)] + [tf.keras.layers.Dense(1)])
  model.compile(optimizer='adam', loss='mse')
  return model


def _even_boundaries(num_calls, num_stages):
  # The hidden layers split evenly; the tiny head joins the last stage.
  hidden = num_calls - 1
  cuts = [s * hidden // num_stages for s in range(num_stages)]
  return cuts + [num_calls]


def _runner_plan(graph, num_stages, num_microbatches, remat, offload=False):
  return {'num_stages': num_stages, 'num_microbatches': num_microbatches,
          'remat': remat, 'offload_activations': offload,
          'boundaries': _even_boundaries(graph.num_calls, num_stages),
          'layer_signature': graph.class_names()}


# --------------------------------------------------------------- workers


def _worker_profiles(out_path, unused_argument):
  profiles = {}
  for name, (model, features) in _real_models().items():
    profiles[name] = json.loads(
        profiling.profile_model(model, features, repeats=5).to_json())
  with open(out_path, 'w') as f:
    json.dump(profiles, f)


def _pipeline_devices() -> None:
  """LOGICAL_DEVICES logical CPUs, one core per op, like devices that
  compute one op at a time; stages then run in parallel only through
  inter-op parallelism."""
  configure_logical_cpus(LOGICAL_DEVICES)
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(LOGICAL_DEVICES)


def _warmed_runner(plan, width, features, labels):
  """A runner of `plan` for the MLP of `width`, traced by two steps."""
  devices = placement.stage_devices(LOGICAL_DEVICES)[:plan['num_stages']]
  model = placement.build_model_on_devices(
      lambda: _mlp(width, PIPELINE_LAYERS), plan, devices)
  runner = pipeline_runner.PipelineRunner(model, plan, devices)
  for _ in range(2):
    runner.train_step(features, labels).numpy()
  return runner


def _worker_pipeline(out_path, unused_argument):
  _pipeline_devices()
  features = tf.random.normal([PIPELINE_BATCH, PIPELINE_WIDTH])
  labels = tf.random.normal([PIPELINE_BATCH, 1])
  graph = graph_lib.LayerGraph(_mlp(PIPELINE_WIDTH, PIPELINE_LAYERS))
  runners = [
      _warmed_runner(_runner_plan(graph, num_stages, num_micro, remat),
                     PIPELINE_WIDTH, features, labels)
      for num_stages, num_micro, remat in PIPELINE_RUNS]
  times, load_before, load_after = _time_round_robin(runners, features,
                                                   labels)
  rows = []
  for (num_stages, num_micro, remat), runner, samples in zip(
      PIPELINE_RUNS, runners, times):
    with tempfile.TemporaryDirectory() as trace_dir:
      tf.profiler.experimental.start(trace_dir)
      runner.train_step(features, labels).numpy()
      tf.profiler.experimental.stop()
      idle = timeline.idle_fraction(timeline.trace_ops(trace_dir),
                                    num_stages)
    rows.append({
        'stages': num_stages, 'microbatches': num_micro, 'remat': remat,
        'step_seconds': statistics.median(samples), 'measured_idle': idle,
    })
  with open(out_path, 'w') as f:
    json.dump({'rows': rows, 'load': [load_before, load_after]}, f)


def _time_round_robin(runners, features, labels):
  """Step seconds of each runner over TIMED_ROUNDS rounds, and the load
  before and after. Round-robin, so that load from other processes hits
  every run alike."""
  times = [[] for _ in runners]
  load_before = os.getloadavg()[0]
  for _ in range(TIMED_ROUNDS):
    for runner, samples in zip(runners, times):
      start = time.perf_counter()
      runner.train_step(features, labels).numpy()
      samples.append(time.perf_counter() - start)
  return times, load_before, os.getloadavg()[0]


def _worker_schedules(out_path, unused_argument):
  """GPipe vs 1F1B: step time, measured schedule and idle, transient peak.

  On the memory section's model: its activations (2 MiB per layer and
  mini-batch) outweigh its weights (256 KiB per layer), so the schedules'
  activation memory shows; with weights as large as the activations, the
  weight gradients of a stage's backward dominate the peak instead.
  """
  _pipeline_devices()
  features = tf.random.normal([MEMORY_BATCH, MEMORY_WIDTH])
  labels = tf.random.normal([MEMORY_BATCH, 1])
  graph = graph_lib.LayerGraph(_mlp(MEMORY_WIDTH, PIPELINE_LAYERS))
  cases = [(k, m, schedule) for k in SCHEDULE_STAGES
           for m in SCHEDULE_MICROBATCHES for schedule in schedules.SCHEDULES]
  runners = [
      _warmed_runner({**_runner_plan(graph, num_stages, num_micro, 'never'),
                      'schedule': schedule}, MEMORY_WIDTH, features, labels)
      for num_stages, num_micro, schedule in cases]
  times, load_before, load_after = _time_round_robin(runners, features,
                                                   labels)
  rows = []
  for (num_stages, num_micro, schedule), runner, samples in zip(
      cases, runners, times):
    tf.config.experimental.reset_memory_stats('CPU:0')
    resident = tf.config.experimental.get_memory_info('CPU:0')['current']
    runner.train_step(features, labels).numpy()
    transient = tf.config.experimental.get_memory_info('CPU:0')['peak'] - (
        resident)
    with tempfile.TemporaryDirectory() as trace_dir:
      tf.profiler.experimental.start(trace_dir)
      runner.train_step(features, labels).numpy()
      tf.profiler.experimental.stop()
      ops = timeline.trace_ops(trace_dir)
    rows.append({
        'stages': num_stages, 'microbatches': num_micro,
        'schedule': schedule, 'step_seconds': statistics.median(samples),
        'measured_idle': timeline.idle_fraction(ops, num_stages),
        'transient_bytes': transient, 'tasks': timeline.tasks(ops),
    })
  with open(out_path, 'w') as f:
    json.dump({'rows': rows, 'load': [load_before, load_after]}, f)


def _worker_memory(out_path, argument):
  """Peak memory of one remat mode ('<remat>' or '<remat>+offload')."""
  configure_logical_cpus(2)
  remat, _, offload = argument.partition('+')
  features = tf.random.normal([MEMORY_BATCH, MEMORY_WIDTH])
  labels = tf.random.normal([MEMORY_BATCH, 1])
  graph = graph_lib.LayerGraph(_mlp(MEMORY_WIDTH, PIPELINE_LAYERS))
  devices = placement.stage_devices(2)
  plan = _runner_plan(graph, 2, MEMORY_MICROBATCHES, remat, bool(offload))
  model = placement.build_model_on_devices(
      lambda: _mlp(MEMORY_WIDTH, PIPELINE_LAYERS), plan, devices)
  runner = pipeline_runner.PipelineRunner(model, plan, devices)
  runner.train_step(features, labels).numpy()  # Traces, creates slots.
  tf.config.experimental.reset_memory_stats('CPU:0')
  resident = tf.config.experimental.get_memory_info('CPU:0')['current']
  runner.train_step(features, labels).numpy()
  peak = tf.config.experimental.get_memory_info('CPU:0')['peak']
  with open(out_path, 'w') as f:
    json.dump({'remat': remat, 'offload': bool(offload),
               'resident': resident, 'peak': peak}, f)


WORKERS = {'profiles': _worker_profiles, 'pipeline': _worker_pipeline,
           'memory': _worker_memory, 'schedules': _worker_schedules}


def _run_worker(name, argument='', extra_env=None):
  with tempfile.TemporaryDirectory() as scratch:
    out_path = os.path.join(scratch, f'{name}.json')
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TF_USE_LEGACY_KERAS='1', TF_CPP_MIN_LOG_LEVEL='2',
               PYTHONPATH=root, **(extra_env or {}))
    proc = subprocess.run(
        [sys.executable, '-m', 'benchmarks.bench_partitioner', '--worker',
         name, out_path, argument], cwd=root, env=env, capture_output=True,
        text=True, timeout=1800)
    if proc.returncode:
      raise RuntimeError(f'{name} worker failed:\n{proc.stderr[-5000:]}')
    with open(out_path) as f:
      return json.load(f)


# --------------------------------------------------------------- sections


def _ratios(costs, num_stages):
  optimum = partition.optimal_partition(costs, num_stages).bottleneck
  uniform = partition.evaluate(
      partition.uniform_boundaries(len(costs), num_stages), costs).bottleneck
  block = partition.evaluate(
      partition.block_boundaries(costs, num_stages), costs).bottleneck
  return uniform / optimum, block / optimum


def quality_on_real_profiles(profiles):
  rows = []
  for name, profile_json in profiles.items():
    profile = plan_lib.ModelProfile.from_json(json.dumps(profile_json))
    for k in STAGE_COUNTS:
      if k > profile.num_layers:
        continue
      # GPipe's rows are the same for every stage.
      costs = plan_lib.layer_costs(profile, k, 4 * k, 'except_last',
                                   'gpipe')[0]
      uniform, block = _ratios(costs, k)
      rows.append([name, profile.num_layers, k, uniform, block])
  return ('## Partition quality on real model profiles\n\n'
          f'Per-layer forward+backward time measured on a micro-batch of '
          f'{REAL_MODEL_MICROBATCH} (median of 5, tf.function call overhead '
          'subtracted), remat except_last, M = 4K. Ratio = slowest stage of '
          'the split / slowest stage of the exact optimum (1.0 = optimal).'
          '\n\n' + report.table(
              ['model', 'layer calls', 'K', 'uniform / optimum',
               'block-partition / optimum'], rows))


def quality_on_random_costs(trials=200, num_layers=64):
  rng = np.random.default_rng(0)
  rows = []
  for k in (4, 8, 16):
    ratios = []
    for _ in range(trials):
      costs = rng.uniform(1.0, 2.0, num_layers)
      heavy = rng.choice(num_layers, num_layers // 20, replace=False)
      costs[heavy] *= 50.0
      ratios.append(_ratios(costs, k))
    ratios = np.array(ratios)
    rows.append([num_layers, k, trials, ratios[:, 0].mean(),
                 ratios[:, 0].max(), ratios[:, 1].mean(), ratios[:, 1].max()])
  return ('## Partition quality on random heterogeneous costs\n\n'
          'Costs uniform in [1, 2], 5% of the layers 50x heavier.\n\n' +
          report.table(['layers', 'K', 'trials', 'uniform mean',
                        'uniform worst', 'block mean', 'block worst'], rows))


def solve_time(num_layers=1000, num_stages=64, repeats=5):
  rng = np.random.default_rng(1)
  costs = rng.uniform(1.0, 2.0, num_layers)
  costs[rng.choice(num_layers, 50, replace=False)] *= 50.0
  layer_memory = rng.integers(1, 1000, num_layers).astype(float)
  cut_memory = rng.integers(0, 1000, num_layers + 1).astype(float)
  free = partition.optimal_partition(costs, num_stages, layer_memory,
                                     cut_memory)
  try:
    partition.optimal_partition(costs, num_stages, layer_memory, cut_memory,
                                memory_budget=1.0)
  except partition.InfeasibleBudgetError as error:
    budget = 1.05 * error.min_budget
  rows = []
  for label, limit in (('no budget', None),
                       ('budget 1.05 x smallest feasible', budget)):
    times = []
    for _ in range(repeats):
      start = time.perf_counter()
      result = partition.optimal_partition(costs, num_stages, layer_memory,
                                           cut_memory, limit)
      times.append(time.perf_counter() - start)
    rows.append([label, num_layers, num_stages, statistics.median(times),
                 max(times), result.bottleneck / free.bottleneck])
  return ('## Solve time\n\nExact DP, median and worst of '
          f'{repeats} runs (goal: under 1 s).\n\n' + report.table(
              ['case', 'layers', 'stages', 'median s', 'worst s',
               'bottleneck / unconstrained'], rows))


def pipeline_section(result):
  rows = result['rows']
  single = next(r['step_seconds'] for r in rows
                if r['stages'] == 1 and r['microbatches'] == 1)
  naive = {r['stages']: r['step_seconds'] for r in rows
           if r['microbatches'] == 1}
  table_rows = []
  for r in rows:
    k, m = r['stages'], r['microbatches']
    table_rows.append([
        k, m, r['remat'], r['step_seconds'] * 1e3,
        single / r['step_seconds'], naive[k] / r['step_seconds'],
        simulator.bubble_fraction(k, m), r['measured_idle']])
  return (
      '## Pipeline on logical CPU devices: step time and bubble\n\n'
      f'{PIPELINE_LAYERS} x Dense({PIPELINE_WIDTH}) + head, mini-batch '
      f'{PIPELINE_BATCH}, Adam, evenly split; {LOGICAL_DEVICES} logical CPU '
      'devices on the machine\'s cores, one intra-op thread (each device '
      'runs one op at a time). Step time: median of '
      f'{TIMED_ROUNDS} steps, the runs timed round-robin; 1-minute load '
      f"average {result['load'][0]:.1f} before and {result['load'][1]:.1f} "
      'after (other jobs share the cores). Measured idle: 1 - (time each '
      'stage had an op running) / (K x step span), from the TF profiler '
      'trace of one step, transfers excluded.\n\n' +
      report.table(
          ['K', 'M', 'remat', 'step ms', 'speedup vs 1 device',
           'speedup vs naive (M=1)', '(K-1)/(M+K-1)', 'measured idle'],
          table_rows))


def memory_section(rows):
  baseline = rows[0]['peak'] - rows[0]['resident']
  table_rows = [[r['remat'], r['offload'], r['resident'] / 2**20,
                 r['peak'] / 2**20, (r['peak'] - r['resident']) / 2**20,
                 (r['peak'] - r['resident']) / baseline] for r in rows]
  return (
      '## Peak memory by re-materialization mode\n\n'
      f'{PIPELINE_LAYERS} x Dense({MEMORY_WIDTH}) + head, mini-batch '
      f'{MEMORY_BATCH}, K=2, M={MEMORY_MICROBATCHES}, one process per row; '
      'the BFC CPU allocator (shared by the logical devices) after one '
      'warm-up step. Resident = '
      'weights, slots and inputs before the step; transient = peak - '
      'resident. Offloading targets host memory, which on logical CPU '
      'devices is the same pool, so it cannot lower this number.\n\n' +
      report.table(['remat', 'offload', 'resident MiB', 'peak MiB',
                    'transient MiB', 'transient / never'], table_rows))


def _schedule_chart(rows, results_dir):
  """Simulated (from the measured task times) above measured, per schedule,
  for SCHEDULE_CHART_CASE."""
  k, m = SCHEDULE_CHART_CASE
  panels = []
  for row in rows:
    if (row['stages'], row['microbatches']) != (k, m):
      continue
    tasks = [simulator.ScheduledTask(**t) for t in row['tasks']]
    durations = {
        phase: [statistics.median(t.end - t.start for t in tasks
                                  if t.stage == s and t.phase == phase)
                for s in range(k)]
        for phase in ('forward', 'backward')}
    simulated = simulator.simulate_schedule(
        durations['forward'], durations['backward'], m, row['schedule'])
    name = partition_report.SCHEDULE_NAMES[row['schedule']]
    panels.append((f'{name}, simulated from the measured median task times: '
                   f'idle {simulated.idle_fraction:.1%}', simulated.tasks,
                   simulated.makespan))
    panels.append((f'{name}, measured (one traced step): idle '
                   f"{row['measured_idle']:.1%}", tasks,
                   max(t.end for t in tasks)))
  os.makedirs(results_dir, exist_ok=True)
  partition_report.schedule_charts(panels, k, m,
                                   os.path.join(results_dir, SCHEDULE_CHART))


def schedule_section(result, results_dir):
  rows = result['rows']
  gpipe_memory = {(r['stages'], r['microbatches']): r['transient_bytes']
                  for r in rows if r['schedule'] == 'gpipe'}
  table_rows = []
  for r in rows:
    k, m = r['stages'], r['microbatches']
    in_flight = plan_lib.in_flight(r['schedule'], k, m)
    table_rows.append([
        k, m, r['schedule'], r['step_seconds'] * 1e3,
        simulator.bubble_fraction(k, m), r['measured_idle'],
        r['transient_bytes'] / 2**20,
        r['transient_bytes'] / gpipe_memory[(k, m)],
        sum(in_flight) / (k * m)])
  _schedule_chart(rows, results_dir)
  k, m = SCHEDULE_CHART_CASE
  return (
      '## GPipe vs 1F1B, side by side\n\n'
      f'{PIPELINE_LAYERS} x Dense({MEMORY_WIDTH}) + head (activations '
      'outweigh weights, as in the memory section), mini-batch '
      f'{MEMORY_BATCH}, Adam, evenly split, remat never; '
      f'{LOGICAL_DEVICES} logical CPU devices, one intra-op thread, all runs '
      'in one process, timed '
      f'round-robin (median of {TIMED_ROUNDS}); 1-minute load average '
      f"{result['load'][0]:.1f} before and {result['load'][1]:.1f} after. "
      'Measured idle as above, from one traced step. Transient: BFC '
      'allocator peak above the resident bytes during one step (all stages '
      'together: the logical devices share one allocator). Predicted: the '
      'in-flight micro-batches summed over the stages, over K x M (what '
      'the activation memory would be as a share of GPipe\'s if all stages '
      'held equal activations). The logical CPUs share the machine\'s two '
      'cores, so the bubble and the memory are the result here; speed-ups '
      'from overlapping stages need real accelerators. No GPU machine was '
      'lent to this run.\n\n' +
      report.table(
          ['K', 'M', 'schedule', 'step ms', '(K-1)/(M+K-1)', 'measured idle',
           'transient MiB', 'transient / GPipe',
           'predicted in-flight / GPipe'], table_rows) +
      f'\n\n![GPipe and 1F1B schedules, K={k}, M={m}]({SCHEDULE_CHART})\n\n'
      f'K={k}, M={m}: each schedule simulated from the measured median '
      'forward and backward time of each stage, above the measured one '
      '(each task from its first op to its last; gaps inside a task are '
      'waits on transfers).')


def main(results_dir: str = 'benchmarks/results') -> str:
  sections = [quality_on_random_costs(), solve_time()]
  sections.insert(0, quality_on_real_profiles(_run_worker('profiles')))
  sections.append(pipeline_section(_run_worker('pipeline')))
  sections.append(memory_section([
      _run_worker('memory', mode, {'TF_CPU_ALLOCATOR_USE_BFC': 'true'})
      for mode in ('never', 'except_last', 'always', 'always+offload')]))
  sections.append(schedule_section(
      _run_worker('schedules', '', {'TF_CPU_ALLOCATOR_USE_BFC': 'true'}),
      results_dir))
  return report.write(results_dir, 'partitioner',
                      'GPipePartitioner benchmark', '\n\n'.join(sections))


if __name__ == '__main__':
  parser = argparse.ArgumentParser(
      prog='python -m benchmarks.bench_partitioner')
  parser.add_argument('--results-dir', default='benchmarks/results')
  parser.add_argument('--worker', nargs=3,
                      metavar=('NAME', 'OUTPUT', 'ARGUMENT'))
  args = parser.parse_args()
  if args.worker:
    name, output, argument = args.worker
    WORKERS[name](output, argument)
  else:
    print(main(args.results_dir))
