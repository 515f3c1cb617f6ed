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
--mode, `bench_partitioner_workers`), because logical devices and the
allocator must be configured before TensorFlow starts.
"""

import json
import os
import tempfile
import time

import numpy as np

from benchmarks import bench_partitioner_workers as workers
from benchmarks import harness
from benchmarks import report
from benchmarks.bench_partitioner_workers import (
    LOGICAL_DEVICES, MEMORY_BATCH, MEMORY_MICROBATCHES, MEMORY_WIDTH,
    PIPELINE_BATCH, PIPELINE_LAYERS, PIPELINE_WIDTH, REAL_MODEL_MICROBATCH,
    SCHEDULE_CHART, SCHEDULE_CHART_CASE, STAGE_COUNTS, TIMED_ROUNDS)
from components.partitioner import partition
from components.partitioner import plan as plan_lib
from components.partitioner import report as partition_report
from components.pipeline_parallel import simulator

MODULE = 'benchmarks.bench_partitioner'
# A worker's longest run.
WORKER_TIMEOUT_S = 1800


def _run_worker(name, argument='', extra_env=None):
  """Worker `name` (`workers.WORKERS`) on `argument` in a fresh process."""
  with tempfile.TemporaryDirectory() as scratch:
    return harness.run_mode(MODULE, scratch, name, argument, env=extra_env,
                            capture=True, timeout=WORKER_TIMEOUT_S)


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
    rows.append([label, num_layers, num_stages, harness.median(times),
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
        phase: [harness.median(t.end - t.start for t in tasks
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


MODES = {name: (lambda root, argument, worker=worker: worker(argument))
         for name, worker in workers.WORKERS.items()}


if __name__ == '__main__':
  harness.entry(harness.parser(MODULE), lambda args: main(args.results_dir),
                MODES)
