"""The Ray launcher against the local launcher: start-up and steady rate.

    python -m benchmarks.bench_ray

The same MultiWorkerMirrored training (2 workers, the taxi model on
synthetic transformed taxi data, batch 32 per replica) through the local
launcher (processes on this machine) and through the Ray launcher on a
two-node Ray cluster on localhost (components/testing/ray_cluster.py:
`ray start --head` plus a second `ray start --address` node, started once
before the runs; its start is not counted, as a Ray cluster exists before a
pipeline runs).
Measured per run: start-up, the seconds from the launcher call to the end
of the first training step (placement group, actors, TF_CONFIG, process
start and TensorFlow's cluster set-up for Ray), and the steady examples/s
after the first step. Runs alternate local / Ray; medians.
"""

import os
import sys
import tempfile
import time
from typing import Dict, List

from benchmarks import bench_resume
from benchmarks import harness
from benchmarks import report
from components.trainer.checkpoint.config import SupervisionConfig
from components.trainer.cluster import local_backend
from components.trainer.cluster import ray_backend
from components.trainer.cluster import tf_cluster
from components.testing import ray_cluster
from components.testing import trainer_testing as tt

WORKERS = 2
BATCH = 32
TRAIN_STEPS = 600
PAIRS = 3
STARTUP_GOAL_S = 10.0
RATE_GOAL = 0.95
TIMEOUT_S = 900


def _task(root: str, data):
  task = tt.make_task(root, data, strategy='multi_worker_mirrored',
                      num_workers=WORKERS, train_steps=TRAIN_STEPS,
                      per_replica_batch_size=BATCH, eval_steps=1,
                      fault_tolerance={'save_every_steps': TRAIN_STEPS})
  task.module_path = 'pipelines.taxi_module'
  task.hparams = {}
  return task


def _local(task, root: str) -> float:
  task_path = os.path.join(root, 'task.json')
  task.save(task_path)
  argv = [sys.executable, '-m', 'components.trainer.process.entry', '--task',
          task_path]
  began = time.time()
  local_backend.run_supervised(
      lambda attempt: tf_cluster.cluster_processes(
          'multi_worker_mirrored', WORKERS, 0, lambda role: argv),
      os.path.join(root, 'logs'), SupervisionConfig(timeout_s=TIMEOUT_S))
  return began


def _ray(task, root: str) -> float:
  argv = [ray_backend.PYTHON, '-m', 'components.trainer.process.entry',
          '--task', ray_backend.TASK_FILE]
  began = time.time()
  ray_backend.run_on_ray(
      'multi_worker_mirrored', WORKERS, 0, lambda role: argv, task.to_json(),
      os.path.join(root, 'logs'), placement_strategy='SPREAD',
      resources={'cpus': 1, 'gpus': 0, 'memory_mb': 0}, local_paths={},
      supervision=SupervisionConfig(timeout_s=TIMEOUT_S))
  return began


def measure(work: str, data) -> Dict[str, List[Dict[str, float]]]:
  runs = {'local': [], 'ray': []}
  for pair in range(PAIRS):
    for name, run in (('local', _local), ('ray', _ray)):
      root = os.path.join(work, f'{name}-{pair}')
      task = _task(root, data)
      began = run(task, root)
      result = harness.read_training_result(task.model_run_dir)
      runs[name].append({'startup_s': result.loop.first_step_time - began,
                         'examples_per_sec': result.loop.examples_per_sec})
      print(f'[bench_ray] {name} {pair}: {runs[name][-1]}', flush=True)
  return runs


def main(results_dir: str = 'benchmarks/results') -> str:
  env = tt.child_env()
  os.environ.update(env)
  with tempfile.TemporaryDirectory(prefix='bench-ray-') as work:
    data = bench_resume.write_taxi_data(os.path.join(work, 'taxi'))
    with ray_cluster.local_ray_cluster(work, env) as cluster:
      with ray_cluster.connected(cluster):
        runs = measure(work, data)
  median = {name: {key: harness.median(r[key] for r in rs)
                   for key in ('startup_s', 'examples_per_sec')}
            for name, rs in runs.items()}
  extra_s = median['ray']['startup_s'] - median['local']['startup_s']
  ratio = median['ray']['examples_per_sec'] / median['local'][
      'examples_per_sec']
  rows = [[name, ', '.join(f'{r["startup_s"]:.1f}' for r in runs[name]),
           f'{median[name]["startup_s"]:.1f}',
           ', '.join(f'{r["examples_per_sec"]:.0f}' for r in runs[name]),
           f'{median[name]["examples_per_sec"]:.0f}'] for name in runs]
  body = '\n\n'.join([
      __doc__.split('\n\n', 2)[2].strip(),
      f'{TRAIN_STEPS} steps, {WORKERS} workers x {BATCH} examples per step.',
      report.table(['launcher', 'start-up s (runs)', 'start-up s (median)',
                    'examples/s (runs)', 'examples/s (median)'], rows),
      report.table(['goal', 'measured', 'met'], [
          [f'Ray start-up within {STARTUP_GOAL_S:g} s of local',
           f'{extra_s:+.1f} s', 'yes' if extra_s <= STARTUP_GOAL_S else
           '**no**'],
          [f'Ray steady rate within {100 - RATE_GOAL * 100:g}% of local',
           f'{ratio:.3f}x', 'yes' if ratio >= RATE_GOAL else '**no**']]),
  ])
  return report.write(results_dir, 'ray', 'Ray launcher vs local launcher',
                      body)


if __name__ == '__main__':
  harness.entry(harness.parser('benchmarks.bench_ray'),
                lambda args: main(args.results_dir))
