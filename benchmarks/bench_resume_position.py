"""Resume cost against the step resumed at: step 100 against step 50,000.

    python -m benchmarks.bench_resume_position

One training of the taxi model (batch 32, synthetic transformed taxi data of
16,000 examples, so an epoch is 500 steps) saves every 100 steps and keeps
them all. The run is then restarted from a copy of the checkpoint folder
that holds only the checkpoint of step 100, 50,000 or 50,400 (400 steps into
an epoch, the most rows to drop), and the seconds from spawning the process
to the end of its first resumed step are measured (3 interleaved rounds),
with the same for a fresh start (the trainer resumes in its data order,
`data_order`). Beside it, in this process: the seconds to the first batch of
`build_dataset` at those positions (`skip_batches`, which builds the resumed
epoch and drops the rows before the position: what a resume does without a
shard index) against `dataset.skip(n)` on the same pipeline (what a stock
user does), which reads and discards every earlier batch. The cost against
the rows, not the steps: `bench_scale`.
"""

import os
import shutil
import tempfile
import time
from typing import Dict, List

from benchmarks import bench_resume
from benchmarks import harness
from benchmarks import report
from components.trainer.checkpoint import records as records_lib
from components.trainer.checkpoint import store as checkpoint_store
from components.testing import trainer_testing as tt

BATCH = bench_resume.TAXI_BATCH
SAVE_EVERY = 100
POSITIONS = (100, 50_000, 50_400)
TRAIN_STEPS = max(POSITIONS) + 1
GOAL_RATIO = 1.2
ROUNDS = 3
# 50,401 steps on a shared 2-core machine.
CHILD_TIMEOUT_S = 1800


def _task(root: str, data, checkpoint_dir: str):
  task = tt.make_task(
      root, data, train_steps=TRAIN_STEPS, per_replica_batch_size=BATCH,
      eval_steps=1, checkpoint_dir=checkpoint_dir,
      fault_tolerance={'save_every_steps': SAVE_EVERY,
                       'keep_last': TRAIN_STEPS // SAVE_EVERY + 1})
  task.module_path = 'pipelines.taxi_module'
  task.hparams = {}
  return task


def _fresh_start_seconds(task, root: str) -> float:
  """Trains to the end; seconds from spawn to the end of the first step."""
  spawned = time.time()
  if tt.start_child(task, root).wait(timeout=CHILD_TIMEOUT_S) != 0:
    raise RuntimeError(f'training failed:\n{tt.child_log(root)[-4000:]}')
  result = harness.read_training_result(task.model_run_dir)
  return result.loop.first_step_time - spawned


def _restart_seconds(task, root: str, position: int) -> float:
  """Seconds from spawn to the chief's first progress record past
  `position` (written right after the first resumed call), then SIGKILL."""
  spawned = time.time()
  process = tt.start_child(task, root)
  deadline = time.monotonic() + CHILD_TIMEOUT_S
  try:
    while time.monotonic() < deadline:
      record = records_lib.read_progress(task.checkpoint_dir)
      if record and record['step'] > position:
        return record['time'] - spawned
      if process.poll() is not None:
        raise RuntimeError(f'training ended before its first resumed step:'
                           f'\n{tt.child_log(root)[-4000:]}')
      time.sleep(0.02)
    raise RuntimeError(f'no resumed step within {CHILD_TIMEOUT_S} s')
  finally:
    process.kill()
    process.wait()


def measure_trainer(work_dir: str, data) -> Dict[str, List[float]]:
  full_dir = os.path.join(work_dir, 'all_checkpoints')
  root = os.path.join(work_dir, 'full')
  measured = {'fresh': [_fresh_start_seconds(_task(root, data, full_dir),
                                             root)]}
  for round_index in range(ROUNDS):
    for position in POSITIONS:
      name = checkpoint_store.checkpoint_name(position)
      only = os.path.join(work_dir, f'from_{position}_{round_index}')
      shutil.copytree(os.path.join(full_dir, name), os.path.join(only, name))
      root = os.path.join(work_dir, f'restart_{position}_{round_index}')
      measured.setdefault(position, []).append(
          _restart_seconds(_task(root, data, only), root, position))
  return measured


def measure_dataset(data) -> Dict[str, Dict[int, List[float]]]:
  """Seconds to the first batch at each position, ours and `skip(n)`."""
  # pylint: disable=g-import-not-at-top
  from tensorflow_transform.tf_metadata import schema_utils
  from tfx.utils import io_utils
  from tensorflow_metadata.proto.v0 import schema_pb2
  from components.data import input_pipeline
  from pipelines import taxi_module as taxi
  # pylint: enable=g-import-not-at-top
  schema = io_utils.parse_pbtxt_file(data['schema_path'], schema_pb2.Schema())
  spec = schema_utils.schema_as_feature_spec(schema).feature_spec

  def build(skip):
    return input_pipeline.build_dataset(
        [data['pattern']], spec, taxi.LABEL_KEY, BATCH, seed=1,
        skip_batches=skip)

  times = {'ours': {}, 'skip': {}}
  for _ in range(ROUNDS):
    for position in POSITIONS:
      for way, make in (('ours', lambda p: build(p)),
                        ('skip', lambda p: build(0).skip(p))):
        start = time.perf_counter()
        next(iter(make(position)))
        times[way].setdefault(position, []).append(time.perf_counter() -
                                                   start)
  return times


def main(results_dir: str = 'benchmarks/results') -> str:
  with tempfile.TemporaryDirectory(prefix='bench-resume-position-') as work:
    data = bench_resume.write_taxi_data(os.path.join(work, 'taxi'))
    dataset = measure_dataset(data)
    trainer = measure_trainer(work, data)
  base = POSITIONS[0]
  median = harness.median
  seconds = {p: median(trainer[p]) for p in POSITIONS}
  ratio = max(seconds[p] for p in POSITIONS[1:]) / seconds[base]
  rows = [['fresh start', '-', f'{trainer["fresh"][0]:.2f}', '-',
           f'{trainer["fresh"][0]:.2f}']]
  for position in POSITIONS:
    rows.append([f'resume at step {position:,}',
                 f'{position * BATCH // bench_resume.TAXI_EXAMPLES}',
                 f'{seconds[position]:.2f}',
                 f'{seconds[position] / seconds[base]:.2f}',
                 ' / '.join(f'{t:.2f}' for t in trainer[position])])
  data_rows = [[f'{position:,}', f'{median(dataset["ours"][position]):.3f}',
                f'{median(dataset["skip"][position]):.3f}',
                '{:.1f}x'.format(median(dataset['skip'][position]) /
                                 median(dataset['ours'][position]))]
               for position in POSITIONS]
  body = '\n\n'.join([
      __doc__.split('\n\n', 2)[2].strip(),
      '## Restart to the first resumed step (trainer process)',
      f'Median of {ROUNDS} interleaved restarts; the end of the first '
      'resumed step is when the chief records it (progress.json), a few '
      'milliseconds after the call.',
      report.table(['start', 'epochs before it', 'seconds from spawn',
                    f'vs step {base}', 'all rounds'], rows),
      report.table(['goal', 'measured', 'met'], [[
          f'restart at step 50,000 (or 50,400) within {GOAL_RATIO}x of step '
          f'{base}', f'{ratio:.2f}x',
          'yes' if ratio < GOAL_RATIO else '**no**']]),
      '## First batch of the input pipeline at a position (this process)',
      f'Median of {ROUNDS} rounds, seconds.',
      report.table(['batch position', 'ours (skip_batches) s',
                    'dataset.skip(n) s', 'skip(n) / ours'], data_rows),
  ])
  return report.write(results_dir, 'resume_position',
                      'Resume cost against the resume position', body)


if __name__ == '__main__':
  harness.entry(harness.parser('benchmarks.bench_resume_position'),
                lambda args: main(args.results_dir))
