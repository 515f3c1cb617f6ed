"""Fault-tolerant resume benchmark: HighPerfTrainer vs Keras BackupAndRestore.

    python -m benchmarks.bench_resume

Writes benchmarks/results/resume.md with three measurements, all on real
processes killed with SIGKILL:

1. Lost work after a kill (optimizer steps redone) against the save interval:
   our loop saving every 5 / 25 / 100 (default) steps, and `model.fit` with
   `tf.keras.callbacks.BackupAndRestore` at its defaults (a backup per epoch,
   epochs of 100 steps), three seeded kill points each, same model and data.
   The model (components/testing/id_recording_module.py) logs the example ids of
   every step, so the redone steps are counted exactly, and so are the
   examples the surviving trajectory trained on twice or never (the data
   position).
2. Checkpoint overhead at the default interval, on the taxi model over
   synthetic transformed taxi features: time spent checkpointing as a share of
   the training time (ours: every 100 steps, including the manifest hashes;
   Keras: its per-epoch backup, epochs of 100 steps).
3. Time from the restart (process spawn) to the first resumed step, with a
   fresh start for reference.

Both sides run with the same autograph fix
(`components.patches.AUTOGRAPH_SKIPS_TF_KERAS`) so that Keras tracing is not
slowed by converting tf_keras.
"""

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

import numpy as np

from benchmarks import harness
from benchmarks import report
from components.trainer.checkpoint import store as checkpoint_store
from components.testing import trainer_testing as tt

# Part 1: lost work.
# A multiple of the input pipeline's shuffle window (8 batches): the first
# pass reads every example exactly once.
ID_EXAMPLES = 1280
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
TAXI_STEPS = 1000
TAXI_SAVE_EVERY = 100
TAXI_KILL_AFTER_STEPS = 250
# Alternating runs without / with checkpoints; medians (a shared machine).
OVERHEAD_PAIRS = 3


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
  import types
  import tensorflow as tf
  from components.data import input_pipeline
  from components.trainer.managed import datasets
  from components.trainer.common import task as task_lib
  # pylint: enable=g-import-not-at-top
  with open(config_path) as f:
    config = json.load(f)
  module = importlib.import_module(config['module_path'])
  model = module.build_model(config['hparams'])
  feature_spec = task_lib.feature_spec(types.SimpleNamespace(
      transform_output=None, schema_path=config['schema_path']))
  dataset = input_pipeline.build_dataset(
      [config['pattern']], feature_spec, module.LABEL_KEY,
      batch_size=config['batch_size'], seed=datasets.DATA_SEED)

  class TimedBackupAndRestore(tf.keras.callbacks.BackupAndRestore):
    """BackupAndRestore at its defaults, timing its backups."""

    def __init__(self, *args, **kwargs):
      super().__init__(*args, **kwargs)
      self.backup_seconds = 0.0
      self.backups = 0

    def _backup(self, epoch, batch=0):
      began = time.monotonic()
      super()._backup(epoch, batch)
      self.backup_seconds += time.monotonic() - began
      self.backups += 1

  class Progress(tf.keras.callbacks.Callback):
    """Where training resumed, when its steps ended, and a progress file."""

    def __init__(self):
      super().__init__()
      self.resumed_from = None
      self.step_times = []

    def on_train_batch_begin(self, batch, logs=None):
      if self.resumed_from is None:
        self.resumed_from = int(self.model.optimizer.iterations.numpy())

    def on_train_batch_end(self, batch, logs=None):
      self.step_times.append(time.time())
      if len(self.step_times) % 10 == 0:
        with open(config['progress'], 'w') as f:
          f.write(str(self.resumed_from + len(self.step_times)))

  progress = Progress()
  callbacks = [progress]
  backup = None
  if config['backup']:
    backup = TimedBackupAndRestore(config['backup_dir'])
    callbacks.insert(0, backup)
  model.fit(dataset, epochs=config['epochs'],
            steps_per_epoch=config['steps_per_epoch'], callbacks=callbacks,
            verbose=0)
  times = progress.step_times
  with open(config['stats'], 'w') as f:
    json.dump({'step_seconds': (times[-1] - times[0]) / (len(times) - 1),
               'backup_seconds': backup.backup_seconds if backup else 0.0,
               'backups': backup.backups if backup else 0,
               'first_step_time': times[0],
               'resumed_from': progress.resumed_from}, f)


def _keras_config(root: str, data: Dict[str, str], module_path: str,
                  hparams: Dict[str, Any], batch_size: int, total_steps: int,
                  backup: bool = True) -> str:
  os.makedirs(root, exist_ok=True)
  config = {'module_path': module_path, 'hparams': hparams,
            'schema_path': data['schema_path'], 'pattern': data['pattern'],
            'batch_size': batch_size,
            'epochs': total_steps // KERAS_STEPS_PER_EPOCH,
            'steps_per_epoch': KERAS_STEPS_PER_EPOCH, 'backup': backup,
            'backup_dir': os.path.join(root, 'backup'),
            'progress': os.path.join(root, 'progress'),
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
        harness.mean(t['redone'] for t in trials),
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


def _taxi_task(root: str, data: Dict[str, str], save_every_steps):
  task = tt.make_task(root, data, train_steps=TAXI_STEPS,
                      per_replica_batch_size=TAXI_BATCH, eval_steps=1,
                      fault_tolerance={'save_every_steps': save_every_steps})
  task.module_path = 'pipelines.taxi_module'
  task.hparams = {}
  return task


def _read_number(path: str, key=None) -> int:
  try:
    with open(path) as f:
      text = f.read()
    return int(json.loads(text)[key] if key else text)
  except (OSError, ValueError, KeyError):
    return -1


def _run(start, progress=None, kill_at_step=None) -> float:
  """Runs a child to the end, or SIGKILLs it once `progress()` reaches
  `kill_at_step`; returns its spawn time."""
  spawned = time.time()
  process = start()
  if kill_at_step is None:
    if process.wait(timeout=tt.CHILD_TIMEOUT_SECONDS) != 0:
      raise RuntimeError('benchmark child failed')
    return spawned
  deadline = time.monotonic() + tt.CHILD_TIMEOUT_SECONDS
  while progress() < kill_at_step:
    if process.poll() is not None or time.monotonic() > deadline:
      raise RuntimeError('benchmark child ended before it was killed')
    time.sleep(0.01)
  process.send_signal(signal.SIGKILL)
  process.wait()
  return spawned


def _ours(work_dir: str, data) -> Dict[str, float]:
  step_ms = lambda r: 1000 * r.loop.examples_per_step / r.loop.examples_per_sec
  off, on = [], []
  for pair in range(OVERHEAD_PAIRS):
    for every, runs in ((None, off), (TAXI_SAVE_EVERY, on)):
      root = os.path.join(work_dir, f'taxi-ours-{every}-{pair}')
      task = _taxi_task(root, data, every)
      spawned = _run(lambda task=task, root=root: _start_ours(task, root))
      runs.append((harness.read_training_result(task.model_run_dir), spawned,
                   task))
  measured = {
      'step_off_ms': harness.median(step_ms(r) for r, _, _ in off),
      'step_on_ms': harness.median(step_ms(r) for r, _, _ in on),
      'wait_ms': harness.median(
          1000 * r.loop.checkpoint_s / r.loop.checkpoints_saved
          for r, _, _ in on),
      'fresh_s': harness.median(r.loop.first_step_time - spawned
                                for r, spawned, _ in on)}
  task = on[0][2]
  newest = max(n for n in os.listdir(task.checkpoint_dir)
               if checkpoint_store.is_checkpoint_name(n))
  measured['bytes'] = sum(
      os.path.getsize(os.path.join(task.checkpoint_dir, newest, name))
      for name in os.listdir(os.path.join(task.checkpoint_dir, newest)))

  root = os.path.join(work_dir, 'taxi-ours-killed')
  task = _taxi_task(root, data, TAXI_SAVE_EVERY)
  progress = os.path.join(task.checkpoint_dir, 'progress.json')
  _run(lambda: _start_ours(task, root), lambda: _read_number(progress, 'step'),
       TAXI_KILL_AFTER_STEPS)
  spawned = _run(lambda: _start_ours(task, root))
  result = harness.read_training_result(task.model_run_dir)
  measured['restart_s'] = result.loop.first_step_time - spawned
  measured['resumed_from'] = result.loop.start_step
  return measured


def _keras(work_dir: str, data) -> Dict[str, float]:
  off, on = [], []
  for pair in range(OVERHEAD_PAIRS):
    for backup, runs in ((False, off), (True, on)):
      root = os.path.join(work_dir, f'taxi-keras-{backup}-{pair}')
      config = _keras_config(root, data, 'pipelines.taxi_module', {},
                             TAXI_BATCH, TAXI_STEPS, backup=backup)
      spawned = _run(lambda config=config, root=root: _start_keras(config,
                                                                   root))
      with open(os.path.join(root, 'stats.json')) as f:
        runs.append((json.load(f), spawned))
  measured = {
      'step_off_ms': harness.median(1000 * s['step_seconds']
                                    for s, _ in off),
      'step_on_ms': harness.median(1000 * s['step_seconds'] for s, _ in on),
      'wait_ms': harness.median(1000 * s['backup_seconds'] / s['backups']
                                for s, _ in on),
      'fresh_s': harness.median(s['first_step_time'] - spawned
                                for s, spawned in on)}

  root = os.path.join(work_dir, 'taxi-keras-killed')
  config = _keras_config(root, data, 'pipelines.taxi_module', {}, TAXI_BATCH,
                         TAXI_STEPS)
  _run(lambda: _start_keras(config, root),
       lambda: _read_number(os.path.join(root, 'progress')),
       TAXI_KILL_AFTER_STEPS)
  spawned = _run(lambda: _start_keras(config, root))
  with open(os.path.join(root, 'stats.json')) as f:
    stats = json.load(f)
  measured['restart_s'] = stats['first_step_time'] - spawned
  measured['resumed_from'] = stats['resumed_from']
  return measured


def measure_taxi(work_dir: str) -> Dict[str, Dict[str, float]]:
  data = write_taxi_data(os.path.join(work_dir, 'taxi'))
  return {'ours': _ours(work_dir, data), 'keras': _keras(work_dir, data)}


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
      f'BackupAndRestore every epoch of {KERAS_STEPS_PER_EPOCH} steps (its '
      'default). Step time = steady state after the first step, checkpoint '
      'waits included; '
      'medians of '
      f'{OVERHEAD_PAIRS} alternating runs each. "Wait" = time the training '
      'loop stands still per checkpoint (ours: write, sha256 of every file, '
      'manifest, pruning); "overhead" = wait / (interval x step time without '
      'checkpoints). The measured step-time difference is shown too, but on '
      'this shared 2-core machine it is mostly noise (it can be negative).',
      report.table(
          ['setup', 'step ms, no checkpoints', 'step ms, default',
           'measured difference %', 'wait per checkpoint ms', 'overhead %',
           'checkpoint bytes'],
          [[name, m['step_off_ms'], m['step_on_ms'],
            100 * (m['step_on_ms'] / m['step_off_ms'] - 1), m['wait_ms'],
            100 * m['wait_ms'] / (interval * m['step_off_ms']),
            m.get('bytes', '-')]
           for name, m, interval in (
               ('HighPerfTrainer', ours, TAXI_SAVE_EVERY),
               ('Keras BackupAndRestore', keras, KERAS_STEPS_PER_EPOCH))]),
      '## 3. Restart to the first resumed step',
      f'Same setups, killed (SIGKILL) at step {TAXI_KILL_AFTER_STEPS} and '
      'rerun: seconds from spawning the process to the end of its first '
      'training step (Python and TF start, restore with verification, '
      'tracing), and the same for a fresh start.',
      report.table(
          ['setup', 'fresh start s', 'restart s', 'resumed from step'],
          [[name, m['fresh_s'], m['restart_s'], m['resumed_from']]
           for name, m in (('HighPerfTrainer', ours),
                           ('Keras BackupAndRestore', keras))]),
  ])
  return report.write(results_dir, 'resume',
                      'Fault-tolerant resume: HighPerfTrainer vs Keras '
                      'BackupAndRestore', body)


if __name__ == '__main__':
  parser = harness.parser('benchmarks.bench_resume')
  # A Keras run in this process (`_start_keras`, killed on purpose).
  parser.add_argument('--keras-child', help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.keras_child:
    from components import patches  # pylint: disable=g-import-not-at-top
    with patches.installed(patches.AUTOGRAPH_SKIPS_TF_KERAS):
      keras_child(args.keras_child)
  else:
    print(main(args.results_dir))
