"""Input offload: the trainer on one core, its reader in a cell on another.

    python -m benchmarks.bench_offload [--rounds R] [--train-steps N]

`distribution.offload` has the trainer's partitions produced by tf.data
service cells (`components/offload`). On this machine the training process
is pinned to its last core (`os.sched_setaffinity`, inherited by its
threads) and a local cell runs on the others (`launch.spare_cpus`). The
reader is made expensive: the full taxi data read raw and transformed on
the fly (`transform_placement='on_the_fly'`: the stock Transform's graph
applied in the reader), the taxi model (`pipelines/taxi_module.py`), global
batch BATCH (and LARGE_BATCH), the managed loop as the executor starts it
(`components.trainer.process.entry`). Each measurement in a fresh process:

- trainer: training_result.json's steady examples/s without offload and
  with one cell (`offload={'cells': 1}`), and, for where the time goes, of
  the trainer reading Transform's materialized examples instead (the reader
  parses only), ROUNDS interleaved rounds, medians. Goal: >= GOAL x with the
  cell, judged at each batch size.
- cost: the consumer's CPU per batch (`time.process_time` of a process on
  one core) pulled through `ordered_pipeline.build_ordered_dataset` by a
  traced loop, as the trainer's steps pull theirs: from the local on-the-fly
  reader, from an in-memory stream of the same batches and from a cell
  (`served.Offload.serve`), per batch size of COST_BATCHES, COST_ROUNDS rounds,
  medians; at BATCH also the tf.data service client alone (the cell's
  dataset read directly: no pump thread, no queue). The served wall
  rate is the cell's production rate (the consumer waits on it). Every
  update's features and label are hashed: served and local must be
  equal.
- image: one cell's production rate of image-sized records (JPEGs decoded,
  cropped, resized and flipped to 224x224x3 uint8) and the consumer's CPU per
  batch.

On paper: `sizing.cells_needed` for a HOST_CORES-core host with
ACCELERATORS accelerators, from the measured cell rates and assumed
accelerator rates (ASSUMED_RATES).
"""

import json
import os
import tempfile
import time

from benchmarks import bench_offload_report as offload_report
from benchmarks import bench_offload_runs as offload_runs
from benchmarks import harness
from benchmarks import report
from benchmarks.bench_offload_runs import (COST_ROUNDS, ROUNDS, SETUPS,
                                           TRAIN_STEPS)

MODULE = 'benchmarks.bench_offload'


def main(results_dir: str = 'benchmarks/results', rounds: int = ROUNDS,
         train_steps: int = TRAIN_STEPS) -> str:
  began = time.monotonic()
  work = tempfile.mkdtemp(prefix='bench_offload_')
  load_before = os.getloadavg()[0]
  inputs = harness.run_mode(MODULE, work, 'prepare', {})
  trainer = {setup: [] for setup in SETUPS}
  for round_index, order in harness.interleaved_rounds(list(SETUPS), rounds):
    for setup in order:
      run = harness.run_mode(MODULE, work, 'trainer', {
          'inputs': inputs, 'setup': setup, 'train_steps': train_steps,
          'root': os.path.join(work, f'trainer-{setup}-{round_index}')})
      trainer[setup].append(run)
      print(f'[bench_offload] round {round_index} {setup}: '
            f'{run["examples_per_sec"]:,.0f} examples/s', flush=True)
  costs = {int(batch): value for batch, value in harness.run_mode(
      MODULE, work, 'cost', {'inputs': inputs, 'rounds': COST_ROUNDS}).items()}
  images = harness.run_mode(MODULE, work, 'image', {})
  paper = offload_runs.paper_cells(costs, images)
  with open(os.path.join(work, 'results.json'), 'w') as f:
    json.dump({'trainer': trainer, 'costs': costs, 'images': images,
               'paper': paper}, f, indent=1)
  print(f'[bench_offload] every measurement: {f.name}', flush=True)
  body = offload_report.body(trainer, costs, images, paper, train_steps,
               sorted(os.sched_getaffinity(0)),
               [load_before, os.getloadavg()[0]], time.monotonic() - began)
  return report.write(results_dir, 'offload',
                      'Input offload: the trainer\'s reader in a tf.data '
                      'service cell', body)


MODES = {
    'prepare': lambda root, spec: offload_runs.prepare(
        os.path.join(root, 'upstream')),
    'trainer': lambda root, spec: offload_runs.run_trainer(
        spec['inputs'], spec['root'], spec['setup'], spec['train_steps']),
    'cost': lambda root, spec: offload_runs.measure_costs(spec['inputs'],
                                                          spec['rounds']),
    'image': lambda root, spec: offload_runs.measure_images(root),
}


if __name__ == '__main__':
  parser = harness.parser(MODULE)
  parser.add_argument('--rounds', type=int, default=ROUNDS)
  parser.add_argument('--train-steps', type=int, default=TRAIN_STEPS)
  harness.entry(parser, lambda args: main(args.results_dir, args.rounds,
                                          args.train_steps), MODES)
