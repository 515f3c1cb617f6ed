"""Fault-tolerant resume benchmark: HighPerfTrainer against Keras BackupAndRestore.

    python -m benchmarks.bench_resume

Writes benchmarks/results/resume.md with three measurements, all on real
processes killed with SIGKILL:

1. Lost work after a kill (optimizer steps redone) against the save interval:
   our loop saving every 5 / 25 / 100 (default) steps, and `model.fit` with
   `tf.keras.callbacks.BackupAndRestore` at its defaults (a backup per epoch,
   epochs of 100 steps), three seeded kill points each, same model and data.
   The model (tests/id_recording_module.py) logs the example ids of every
   step, so the redone steps are counted exactly, and so are the examples the
   surviving trajectory trained on twice or never (the data position).
2. Checkpoint overhead at the default interval, on the taxi model over
   synthetic transformed taxi features: time spent checkpointing as a share of
   the training time (ours: every 100 steps, including the manifest hashes;
   Keras: its per-epoch backup, epochs of 100 steps).
3. Time from the restart (process spawn) to the first resumed step, with a
   fresh start for reference.

Both sides run with the same autograph fix (`loop.skip_autograph_for_tf_keras`)
so that Keras tracing is not slowed by converting tf_keras.
"""

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

import numpy as np

from benchmarks import report
from tests import trainer_testing as tt

# Part 1: lost work.
ID_EXAMPLES = 1200
ID_BATCH = 4
ID_STEPS = ID_EXAMPLES // ID_BATCH  # one pass over the data
ID_STEP_SLEEP_S = 0.02
OUR_INTERVALS = (5, 25, 100)
KERAS_STEPS_PER_EPOCH = 100
KILL_TRIALS = 3
KILL_RANGE = (60, 240)
SEED = 20240611
# Parts 2 and 3: the taxi model.
TAXI_EXAMPLES = 16000
TAXI_BATCH = 32
TAXI_STEPS = 400
TAXI_SAVE_EVERY = 100
TAXI_KILL_AFTER_STEPS = 250


def _python_child(argv: List[str], log_path: str) -> subprocess.Popen:
  log = open(log_path, 'ab')  # pylint: disable=consider-using-with
  return subprocess.Popen([sys.executable] + argv, cwd=tt.REPO_ROOT,
                          env=tt.child_env(), stdout=log,
                          stderr=subprocess.STDOUT)


# ------------------------------------------------------ Keras child process


def keras_child(config_path: str) -> None:
  """model.fit with BackupAndRestore; writes timings to config['stats']."""
  # pylint: disable=g-import-not-at-top
  import importlib
  import tensorflow as tf
  from components.trainer import loop
  from components.transform import input_pipeline
  # pylint: enable=g-import-not-at-top
  with open(config_path) as f:
    config = json.load(f)
  loop.skip_autograph_for_tf_keras()
  module = importlib.import_module(config['module_path'])
  model = module.build_model(config['hparams'])
  feature_spec = loop._feature_spec_from_schema(config['schema_path'])  # pylint: disable=protected-access
  dataset = input_pipeline.build_dataset(
      [config['pattern']], feature_spec, module.LABEL_KEY,
      batch_size=config['batch_size'], seed=loop.DATA_SEED)

  class TimedBackupAndRestore(tf.keras.callbacks.BackupAndRestore):
    """BackupAndRestore (defaults) that times its backups and first step."""

    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      self.backup_seconds = 0.0
      self.backups = 0
      self.first_step_time = None
      self.resumed_from = None

    def on_train_batch_begin(self, batch, logs=None):
      if self.resumed_from is None:
        self.resumed_from = int(self.model.optimizer.iterations.numpy())
      super().on_train_batch_begin(batch, logs)

    def on_train_batch_end(self, batch, logs=None):
      if self.first_step_time is None:
        self.first_step_time = time.time()
      super().on_train_batch_end(batch, logs)

    def _backup(self, epoch, batch=0):
      began = time.monotonic()
      super()._backup(epoch, batch)
      self.backup_seconds += time.monotonic() - began
      self.backups += 1

  callback = TimedBackupAndRestore(config['backup_dir'])
  began = time.monotonic()
  model.fit(dataset, epochs=config['epochs'],
            steps_per_epoch=config['steps_per_epoch'], callbacks=[callback],
            verbose=0)
  with open(config['stats'], 'w') as f:
    json.dump({'fit_seconds': time.monotonic() - began,
               'backup_seconds': callback.backup_seconds,
               'backups': callback.backups,
               'first_step_time': callback.first_step_time,
               'resumed_from': callback.resumed_from,
               'iterations': int(model.optimizer.iterations.numpy())}, f)


def _keras_config(root: str, data: Dict[str, str], module_path: str,
                  hparams: Dict[str, Any], batch_size: int,
                  total_steps: int) -> str:
  os.makedirs(root, exist_ok=True)
  config = {'module_path': module_path, 'hparams': hparams,
            'schema_path': data['schema_path'], 'pattern': data['pattern'],
            'batch_size': batch_size,
            'epochs': total_steps // KERAS_STEPS_PER_EPOCH,
            'steps_per_epoch': KERAS_STEPS_PER_EPOCH,
            'backup_dir': os.path.join(root, 'backup'),
            'stats': os.path.join(root, 'stats.json')}
  path = os.path.join(root, 'keras.json')
  with open(path, 'w') as f:
    json.dump(config, f)
  return path


def _start_keras(config_path: str, root: str) -> subprocess.Popen:
  return _python_child(['-m', 'benchmarks.bench_resume', '--keras-child',
                        config_path], os.path.join(root, 'child.log'))


def _start_ours(task, root: str) -> subprocess.Popen:
  return tt.start_child(task, root)


# ------------------------------------------------------- 1. lost work


def _kill_when_step(process, id_log: str, step: int) -> None:
  tt.wait_for_step(process, id_log, step)
  process.send_signal(signal.SIGKILL)
  process.wait()


def _lost_work_trial(start, id_log: str, kill_step: int) -> Dict[str, Any]:
  """Kill at `kill_step`, rerun; counts redone steps and data errors."""
  killed = start()
  _kill_when_step(killed, id_log, kill_step)
  resumed = start()
  if resumed.wait(timeout=tt.CHILD_TIMEOUT_SECONDS) != 0:
    raise RuntimeError(f'resumed run failed, see {id_log} and child.log')
  records = tt.read_id_log(id_log)
  killed_steps = [r['step'] for r in records if r['pid'] == killed.pid]
  resumed_steps = [r['step'] for r in records if r['pid'] == resumed.pid]
  trained = [i for ids in tt.ids_by_step(records).values() for i in ids]
  counts = np.bincount(trained, minlength=ID_EXAMPLES)
  return {'killed_at': max(killed_steps) + 1,
          'resumed_from': min(resumed_steps),
          'redone': max(killed_steps) + 1 - min(resumed_steps),
          'twice': int(np.sum(counts > 1)), 'never': int(np.sum(counts == 0))}


def measure_lost_work(work_dir: str) -> List[List[Any]]:
  data = tt.write_id_dataset(os.path.join(work_dir, 'ids'), ID_EXAMPLES)
  hparams = {'step_sleep_seconds': ID_STEP_SLEEP_S}
  kill_steps = [random.Random(SEED + t).randrange(*KILL_RANGE)
                for t in range(KILL_TRIALS)]
  rows = []
  setups = [(f'HighPerfTrainer, every {n} steps'
             + (' (default)' if n == 100 else ''), n) for n in OUR_INTERVALS]
  setups.append(('Keras BackupAndRestore (default: per epoch of '
                 f'{KERAS_STEPS_PER_EPOCH} steps)', None))
  for name, interval in setups:
    trials = []
    for trial, kill_step in enumerate(kill_steps):
      root = os.path.join(work_dir, f'lost-{interval or "keras"}-{trial}')
      if interval:
        task = tt.make_task(root, data, train_steps=ID_STEPS,
                            per_replica_batch_size=ID_BATCH, eval_steps=1,
                            fault_tolerance={'save_every_steps': interval},
                            hparams=hparams)
        start = lambda task=task, root=root: _start_ours(task, root)
        id_log = task.hparams['id_log']
      else:
        id_log = os.path.join(root, 'ids.jsonl')
        config = _keras_config(
            root, data, tt.MODULE_PATH, {**hparams, 'id_log': id_log},
            ID_BATCH, ID_STEPS)
        start = lambda config=config, root=root: _start_keras(config, root)
      trials.append(_lost_work_trial(start, id_log, kill_step))
    rows.append([
        name,
        ', '.join(f'{t["killed_at"]}->{t["resumed_from"]}' for t in trials),
        statistics.mean(t['redone'] for t in trials),
        max(t['redone'] for t in trials),
        sum(t['twice'] for t in trials), sum(t['never'] for t in trials)])
  return rows


# ------------------------------------------- 2 and 3. overhead, restart


def write_taxi_data(directory: str) -> Dict[str, str]:
  """Random values in the shapes and ranges of the transformed taxi data."""
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from pipelines import taxi_module as taxi
  from tensorflow_transform.tf_metadata import schema_utils
  # pylint: enable=g-import-not-at-top
  os.makedirs(directory, exist_ok=True)
  rng = np.random.default_rng(SEED)
  name = taxi.transformed_name
  spec, columns = {}, {}
  for key in taxi.DENSE_FLOAT_FEATURE_KEYS:
    spec[name(key)] = tf.io.FixedLenFeature([], tf.float32)
    columns[name(key)] = rng.normal(size=TAXI_EXAMPLES)
  ranges = ([(k, taxi.VOCAB_SIZE + taxi.OOV_SIZE)
             for k in taxi.VOCAB_FEATURE_KEYS] +
            [(k, taxi.FEATURE_BUCKET_COUNT) for k in taxi.BUCKET_FEATURE_KEYS] +
            list(zip(taxi.CATEGORICAL_FEATURE_KEYS,
                     taxi.CATEGORICAL_NUM_TOKENS)))
  for key, size in ranges:
    spec[name(key)] = tf.io.FixedLenFeature([], tf.int64)
    columns[name(key)] = rng.integers(0, size, size=TAXI_EXAMPLES)
  spec[taxi.LABEL_KEY] = tf.io.FixedLenFeature([], tf.int64)
  columns[taxi.LABEL_KEY] = (columns[name('fare')] > 0).astype(np.int64)
  options = tf.io.TFRecordOptions(compression_type='GZIP')
  for shard in range(4):
    path = os.path.join(directory, f'taxi-{shard}.tfrecord.gz')
    with tf.io.TFRecordWriter(path, options) as writer:
      for i in range(shard, TAXI_EXAMPLES, 4):
        feature = {}
        for key, values in columns.items():
          if spec[key].dtype == tf.float32:
            feature[key] = tf.train.Feature(
                float_list=tf.train.FloatList(value=[values[i]]))
          else:
            feature[key] = tf.train.Feature(
                int64_list=tf.train.Int64List(value=[values[i]]))
        writer.write(tf.train.Example(features=tf.train.Features(
            feature=feature)).SerializeToString())
  schema_path = os.path.join(directory, 'schema.pbtxt')
  with open(schema_path, 'w') as f:
    f.write(str(schema_utils.schema_from_feature_spec(spec)))
  return {'pattern': os.path.join(directory, 'taxi-*.tfrecord.gz'),
          'schema_path': schema_path}


def _taxi_task(root: str, data: Dict[str, str]):
  task = tt.make_task(root, data, train_steps=TAXI_STEPS,
                      per_replica_batch_size=TAXI_BATCH, eval_steps=1,
                      fault_tolerance={'save_every_steps': TAXI_SAVE_EVERY})
  task.module_path = 'pipelines.taxi_module'
  task.hparams = {}
  return task


def _run_timed(start, kill_after_s=None):
  """(spawn time, process) after it finished or was killed."""
  spawned = time.time()
  process = start()
  if kill_after_s is None:
    if process.wait(timeout=tt.CHILD_TIMEOUT_SECONDS) != 0:
      raise RuntimeError('benchmark child failed')
  else:
    time.sleep(kill_after_s)
    process.send_signal(signal.SIGKILL)
    process.wait()
  return spawned


def measure_taxi(work_dir: str) -> Dict[str, Dict[str, float]]:
  data = write_taxi_data(os.path.join(work_dir, 'taxi'))
  ours, keras = {}, {}

  root = os.path.join(work_dir, 'taxi-ours')
  task = _taxi_task(root, data)
  spawned = _run_timed(lambda: _start_ours(task, root))
  result = tt.read_result(task)
  step_s = result['examples_per_step'] / result['examples_per_sec']
  per_save = result['checkpoint_seconds'] / result['checkpoints_saved']
  ours['step_ms'] = 1000 * step_s
  ours['checkpoint_ms'] = 1000 * per_save
  ours['overhead_pct'] = 100 * per_save / (TAXI_SAVE_EVERY * step_s)
  ours['fresh_first_step_s'] = result['first_step_time'] - spawned
  kill_after = (result['first_step_time'] - spawned +
                TAXI_KILL_AFTER_STEPS * step_s)
  ours['checkpoint_bytes'] = sum(
      os.path.getsize(os.path.join(dirpath, name))
      for dirpath, _, names in os.walk(
          os.path.join(task.checkpoint_dir, sorted(
              os.listdir(task.checkpoint_dir))[0]))
      for name in names)

  root = os.path.join(work_dir, 'taxi-ours-killed')
  task = _taxi_task(root, data)
  _run_timed(lambda: _start_ours(task, root), kill_after_s=kill_after)
  spawned = _run_timed(lambda: _start_ours(task, root))
  result = tt.read_result(task)
  ours['restart_first_step_s'] = result['first_step_time'] - spawned
  ours['resumed_from'] = result['start_step']

  root = os.path.join(work_dir, 'taxi-keras')
  config = _keras_config(root, data, 'pipelines.taxi_module', {}, TAXI_BATCH,
                         TAXI_STEPS)
  spawned = _run_timed(lambda: _start_keras(config, root))
  with open(os.path.join(root, 'stats.json')) as f:
    stats = json.load(f)
  step_s = stats['fit_seconds'] / stats['iterations']
  per_save = stats['backup_seconds'] / stats['backups']
  keras['step_ms'] = 1000 * step_s
  keras['checkpoint_ms'] = 1000 * per_save
  keras['overhead_pct'] = 100 * per_save / (KERAS_STEPS_PER_EPOCH * step_s)
  keras['fresh_first_step_s'] = stats['first_step_time'] - spawned
  kill_after = (stats['first_step_time'] - spawned +
                TAXI_KILL_AFTER_STEPS * step_s)

  root = os.path.join(work_dir, 'taxi-keras-killed')
  config = _keras_config(root, data, 'pipelines.taxi_module', {}, TAXI_BATCH,
                         TAXI_STEPS)
  _run_timed(lambda: _start_keras(config, root), kill_after_s=kill_after)
  spawned = _run_timed(lambda: _start_keras(config, root))
  with open(os.path.join(root, 'stats.json')) as f:
    stats = json.load(f)
  keras['restart_first_step_s'] = stats['first_step_time'] - spawned
  keras['resumed_from'] = stats['resumed_from']
  return {'ours': ours, 'keras': keras}


def main(results_dir: str = 'benchmarks/results') -> str:
  with tempfile.TemporaryDirectory(prefix='bench-resume-') as work_dir:
    lost = measure_lost_work(work_dir)
    taxi = measure_taxi(work_dir)
  ours, keras = taxi['ours'], taxi['keras']
  body = '\n\n'.join([
      '## 1. Lost work after SIGKILL against the save interval',
      f'Id-recording model, {ID_BATCH} examples per step, '
      f'{ID_STEP_SLEEP_S * 1000:.0f} ms steps, {ID_STEPS} steps (one pass over '
      f'{ID_EXAMPLES} examples); killed at seeded random steps '
      f'{KILL_RANGE[0]}-{KILL_RANGE[1]}, then rerun to the end. "Redone" = '
      'steps trained again after the restart (exact, from the model\'s step '
      'log); "twice" / "never" = examples the final trajectory trained on '
      'twice / never (over all trials).',
      report.table(['setup', 'killed at -> resumed from', 'redone (mean)',
                    'redone (max)', 'examples twice', 'examples never'],
                   lost),
      '## 2. Checkpoint overhead at the default interval',
      f'Taxi model (pipelines/taxi_module.build_model) on {TAXI_EXAMPLES} '
      f'synthetic transformed examples, batch {TAXI_BATCH}, {TAXI_STEPS} '
      f'steps; ours every {TAXI_SAVE_EVERY} steps (default), Keras '
      f'BackupAndRestore every epoch of {KERAS_STEPS_PER_EPOCH} steps. '
      'Overhead = one checkpoint / the training time of one interval.',
      report.table(
          ['setup', 'step ms', 'one checkpoint ms', 'overhead % of step time',
           'checkpoint size bytes'],
          [['HighPerfTrainer', ours['step_ms'], ours['checkpoint_ms'],
            ours['overhead_pct'], ours['checkpoint_bytes']],
           ['Keras BackupAndRestore', keras['step_ms'], keras['checkpoint_ms'],
            keras['overhead_pct'], '-'],
           ['ratio ours / Keras', ours['step_ms'] / keras['step_ms'],
            ours['checkpoint_ms'] / keras['checkpoint_ms'],
            ours['overhead_pct'] / keras['overhead_pct'], '-']]),
      '## 3. Restart to the first resumed step',
      f'Same taxi runs, killed (SIGKILL) after about '
      f'{TAXI_KILL_AFTER_STEPS} steps and rerun: seconds from spawning the '
      'process to the end of its first training step (Python and TF start, '
      'restore with verification, tracing), and the same for a fresh start.',
      report.table(
          ['setup', 'fresh start s', 'restart s', 'resumed from step'],
          [['HighPerfTrainer', ours['fresh_first_step_s'],
            ours['restart_first_step_s'], ours['resumed_from']],
           ['Keras BackupAndRestore', keras['fresh_first_step_s'],
            keras['restart_first_step_s'], keras['resumed_from']]]),
  ])
  return report.write(results_dir, 'resume',
                      'Fault-tolerant resume: HighPerfTrainer vs Keras '
                      'BackupAndRestore', body)


if __name__ == '__main__':
  parser = argparse.ArgumentParser(prog='python -m benchmarks.bench_resume')
  parser.add_argument('--keras-child', help=argparse.SUPPRESS)
  parser.add_argument('--results-dir', default='benchmarks/results')
  args = parser.parse_args()
  if args.keras_child:
    keras_child(args.keras_child)
  else:
    print(main(args.results_dir))
