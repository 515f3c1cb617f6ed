"""Shared helpers for the managed-loop, resume and fault tests.

Builds a tiny synthetic problem (examples with an `id` feature, read by
`components/testing/id_recording_module.py`), writes `TrainingTask`s for it,
runs training in real child processes
(`python -m components.testing.trainer_testing TASK_JSON`) and reads back
which ids every optimizer step consumed.
"""

import json
import os
import signal
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from components.records import training_result
from components.trainer.checkpoint import records as run_records
from components.trainer.checkpoint.config import SupervisionConfig
from components.trainer.checkpoint import store as checkpoint_store
from components.trainer.cluster import local_backend
from components.trainer.cluster import supervisor
from components.trainer.cluster import tf_cluster
from components.trainer.common.task import TrainingTask
from components.testing import faulty_storage
from components.testing import id_recording_module

REPO_ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE_PATH = 'components.testing.id_recording_module'
CHILD_TIMEOUT_SECONDS = 300
CLUSTER_TIMEOUT_S = 500
# Examples in the id dataset of the `data` fixture (tests/conftest.py).
NUM_EXAMPLES = 64


def write_id_dataset(directory: str, num_examples: int, num_files: int = 2,
                     seed: int = 0) -> Dict[str, str]:
  """GZIP TFRecords of examples 0..num_examples-1, plus schema.pbtxt."""
  # pylint: disable-next=g-import-not-at-top
  from tensorflow_transform.tf_metadata import schema_utils
  os.makedirs(directory, exist_ok=True)
  rng = np.random.default_rng(seed)
  features = rng.normal(size=(num_examples,
                              id_recording_module.NUM_FEATURES)).astype('f4')
  labels = (features @ np.array([1.0, -2.0, 0.5, 1.5]) > 0).astype('f4')
  options = tf.io.TFRecordOptions(compression_type='GZIP')
  per_file = -(-num_examples // num_files)
  for index in range(num_files):
    path = os.path.join(directory, f'train-{index:02d}.tfrecord.gz')
    with tf.io.TFRecordWriter(path, options) as writer:
      for i in range(index * per_file,
                     min(num_examples, (index + 1) * per_file)):
        example = tf.train.Example(features=tf.train.Features(feature={
            'id': tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
            'x': tf.train.Feature(float_list=tf.train.FloatList(
                value=features[i])),
            'label': tf.train.Feature(float_list=tf.train.FloatList(
                value=[labels[i]])),
        }))
        writer.write(example.SerializeToString())
  schema = schema_utils.schema_from_feature_spec(
      id_recording_module.FEATURE_SPEC)
  schema_path = os.path.join(directory, 'schema.pbtxt')
  with open(schema_path, 'w') as f:
    f.write(str(schema))
  return {'pattern': os.path.join(directory, 'train-*.tfrecord.gz'),
          'schema_path': schema_path}


def copy_dataset(data: Dict[str, str], directory: str) -> Dict[str, str]:
  """`data` (write_id_dataset's files) copied into `directory` (gs://)."""
  tf.io.gfile.makedirs(directory)
  for path in tf.io.gfile.glob(data['pattern']) + [data['schema_path']]:
    tf.io.gfile.copy(path, f'{directory}/{os.path.basename(path)}')
  return {key: f'{directory}/{os.path.basename(path)}'
          for key, path in data.items()}


def make_task(root: str, data: Dict[str, str], *, strategy: str = 'one_device',
              train_steps: int = 20, per_replica_batch_size: int = 4,
              accumulation: int = 1, logical_cpu_devices: int = 0,
              num_workers: int = 1, num_ps: int = 0,
              fault_tolerance: Optional[dict] = None,
              hparams: Optional[dict] = None, eval_steps: int = 2,
              input_pipeline: Optional[dict] = None,
              checkpoint_dir: Optional[str] = None,
              seed: Optional[int] = None,
              deterministic: bool = False,
              id_log: Optional[str] = None) -> TrainingTask:
  """A task over `data` whose outputs all live under `root` (local or
  gs://); the id log (a local file: the test's record of what trained) under
  `root` unless `id_log` says where."""
  tf.io.gfile.makedirs(root)
  return TrainingTask(
      module_file=None, module_path=MODULE_PATH, mode='managed',
      train_files=[data['pattern']], eval_files=[data['pattern']],
      transform_output=None, schema_path=data['schema_path'],
      serving_model_dir=os.path.join(root, 'serving_model'),
      model_run_dir=os.path.join(root, 'model_run'),
      train_steps=train_steps, eval_steps=eval_steps,
      hparams={'id_log': id_log or os.path.join(root, 'ids.jsonl'),
               **(hparams or {})},
      custom_config={},
      distribution={'strategy': strategy,
                    'per_replica_batch_size': per_replica_batch_size,
                    'gradient_accumulation_steps': accumulation,
                    'logical_cpu_devices': logical_cpu_devices,
                    'num_workers': num_workers, 'num_ps': num_ps,
                    'seed': seed, 'deterministic': deterministic},
      fault_tolerance={'save_every_steps': 5, 'delete_after_export': False,
                       **(fault_tolerance or {})},
      checkpoint_dir=checkpoint_dir or os.path.join(root, 'checkpoints'),
      input_pipeline=input_pipeline)


def mwms_task(root: str, data: Dict[str, str], id_log: Optional[str] = None,
              **fault_tolerance) -> TrainingTask:
  """2 MultiWorkerMirrored workers x 2 examples per step: one pass over the
  NUM_EXAMPLES in 16 steps; each worker reads its own file; one relaunch."""
  return make_task(root, data, strategy='multi_worker_mirrored',
                   num_workers=2, train_steps=16, per_replica_batch_size=2,
                   fault_tolerance={'save_every_steps': 4,
                                    'max_restarts': 1, **fault_tolerance},
                   hparams={'step_sleep_seconds': 0.1}, id_log=id_log)


def child_env() -> Dict[str, str]:
  env = dict(os.environ, TF_USE_LEGACY_KERAS='1', TF_CPP_MIN_LOG_LEVEL='2',
             PYTHONPATH=REPO_ROOT)
  return env


def worker_argv(task_path: str) -> List[str]:
  """The production training process, exactly as the executor starts it."""
  return [sys.executable, '-m', 'components.trainer.process.entry', '--task',
          task_path, '--role', 'trainer']


def _trainer_argv(task_path: str, production: bool) -> List[str]:
  return (worker_argv(task_path) if production else
          [sys.executable, '-m', 'components.testing.trainer_testing',
           task_path])


def start_child(task: TrainingTask, root: str, faults: Optional[str] = None,
                production: bool = False) -> subprocess.Popen:
  """Starts `run_managed_training` for `task` in a fresh process.

  By default through `main` below (op determinism always on); `production`
  runs the executor's worker, which does only what the task configures.
  `faults`: a `components.testing.faulty_storage.FaultyStorage` as JSON,
  installed in the child before training.
  """
  task_path = os.path.join(root, 'task.json')
  task.save(task_path)
  argv = _trainer_argv(task_path, production)
  env = child_env()
  if faults:
    env[faulty_storage.ENV] = faults
  # The child owns the log file; it stays open as long as the child runs.
  log = open(os.path.join(root, 'child.log'), 'ab')  # pylint: disable=R1732
  return subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=log,
                          stderr=subprocess.STDOUT)


def run_child(task: TrainingTask, root: str, faults: Optional[str] = None,
              production: bool = False) -> int:
  process = start_child(task, root, faults, production)
  return process.wait(timeout=CHILD_TIMEOUT_SECONDS)


def cluster_argv(task: TrainingTask, root: str, production: bool = False
                ) -> Callable[[str], List[str]]:
  """`argv_for_role` of `tf_cluster.cluster_processes` for `task` (saved
  under `root`): trainers as in `start_child`, servers the production
  worker's."""
  task_path = os.path.join(root, 'task.json')
  task.save(task_path)

  def argv(role: str) -> List[str]:
    if role == 'trainer':
      return _trainer_argv(task_path, production)
    return [sys.executable, '-m', 'components.trainer.process.entry', '--task',
            task_path, '--role', 'server']

  return argv


def run_cluster(task: TrainingTask, root: str, *,
                strategy: str = 'multi_worker_mirrored',
                num_workers: Union[int, Sequence[int]] = 2,
                num_ps: int = 0, production: bool = False,
                max_restarts: Optional[int] = None,
                hang_timeout_s: float = 0,
                timeout_s: float = CLUSTER_TIMEOUT_S
               ) -> supervisor.LaunchResult:
  """`task` as a local cluster under the launcher's supervisor (logs under
  `root`/logs), which reads the chief's progress as the executor's does.
  `num_workers`: a count, or one per attempt (an elastic cluster's
  membership). `max_restarts`: by default the task's (0 if unset). The
  processes get this process's environment (see the `child_env` fixture)."""
  if max_restarts is None:
    max_restarts = task.fault_tolerance.get('max_restarts', 0)
  argv = cluster_argv(task, root, production)
  sizes = [num_workers] if isinstance(num_workers, int) else num_workers
  return local_backend.run_supervised(
      lambda attempt: tf_cluster.cluster_processes(
          strategy, sizes[min(attempt, len(sizes) - 1)], num_ps, argv),
      os.path.join(root, 'logs'),
      SupervisionConfig(max_restarts=max_restarts, timeout_s=timeout_s,
                        hang_timeout_s=hang_timeout_s, progress_every_s=0.5),
      read_progress=lambda: run_records.read_progress(task.checkpoint_dir))


def child_log(root: str) -> str:
  with open(os.path.join(root, 'child.log'), errors='replace') as f:
    return f.read()


def read_id_log(path: str) -> List[dict]:
  """Records in file order; a line cut short by SIGKILL is dropped."""
  records = []
  if not os.path.exists(path):
    return records
  with open(path) as f:
    for line in f:
      try:
        records.append(json.loads(line))
      except ValueError:
        pass
  return records


def wait_for_step(process: subprocess.Popen, id_log: str, step: int,
                  timeout: float = CHILD_TIMEOUT_SECONDS) -> int:
  """Waits until `process` trained step `step`; returns the step seen."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    steps = [r['step'] for r in read_id_log(id_log) if r['pid'] == process.pid]
    if steps and max(steps) >= step:
      return max(steps)
    if process.poll() is not None:
      raise AssertionError(f'child exited ({process.returncode}) before step '
                           f'{step}')
    time.sleep(0.02)
  raise AssertionError(f'child did not reach step {step} in {timeout}s')


def kill_at_step(task: TrainingTask, root: str, step: int,
                 sig: int = signal.SIGKILL) -> Tuple[int, int]:
  """Runs `task` until it trains `step`, signals it; (pid, return code)."""
  process = start_child(task, root)
  try:
    wait_for_step(process, task.hparams['id_log'], step)
    process.send_signal(sig)
    return process.pid, process.wait(timeout=CHILD_TIMEOUT_SECONDS)
  finally:
    if process.poll() is None:
      process.kill()
      process.wait()


def ids_by_step(records: Sequence[dict]) -> Dict[Tuple[int, int], List[int]]:
  """(step, replica) -> ids that the *surviving* trajectory trained on.

  A step redone after a crash appears under several pids; the last process
  (in file order) to train it is the one whose update the final model holds.
  """
  last_pid = {}
  for record in records:
    last_pid[(record['step'], record['replica'])] = record['pid']
  result = {}
  for record in records:
    key = (record['step'], record['replica'])
    if record['pid'] == last_pid[key]:
      result.setdefault(key, []).extend(record['ids'])
  return result


def ids_by_update(records: Sequence[dict],
                  attempt_of: Callable[[int], int]) -> Dict[int, List[int]]:
  """step -> the ids its surviving update trained on, over every replica:
  the records of the last attempt (`attempt_of(pid)`) that trained it."""
  last = {}
  for record in records:
    last[record['step']] = max(last.get(record['step'], -1),
                               attempt_of(record['pid']))
  result = {}
  for record in records:
    if attempt_of(record['pid']) == last[record['step']]:
      result.setdefault(record['step'], []).extend(record['ids'])
  return {step: sorted(ids) for step, ids in result.items()}


def assert_each_id_once(task: TrainingTask, train_steps: int,
                        replicas: int) -> None:
  """The surviving trajectory of `task` (over the `data` fixture) trained
  every step on every replica, and on each of the NUM_EXAMPLES once."""
  by_step = ids_by_step(read_id_log(task.hparams['id_log']))
  assert sorted(by_step) == [(s, r) for s in range(train_steps)
                             for r in range(replicas)]
  assert sorted(i for ids in by_step.values() for i in ids) == list(
      range(NUM_EXAMPLES))


def latest_checkpoint_tensors(checkpoint_dir: str) -> Dict[str, np.ndarray]:
  """Every tensor (weights, optimizer slots, step) of the newest checkpoint."""
  newest = max(n.rstrip('/') for n in tf.io.gfile.listdir(checkpoint_dir)
               if checkpoint_store.is_checkpoint_name(n))
  reader = tf.train.load_checkpoint(os.path.join(
      checkpoint_dir, newest, checkpoint_store.CHECKPOINT_PREFIX))
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()
          if not name.startswith('_CHECKPOINTABLE_OBJECT_GRAPH')}


def final_tensors(task: TrainingTask) -> Dict[str, np.ndarray]:
  """`latest_checkpoint_tensors` of `task`'s checkpoint directory."""
  return latest_checkpoint_tensors(task.checkpoint_dir)


def read_result(task: TrainingTask) -> training_result.TrainingResult:
  return training_result.read(task.model_run_dir)


def main(task_path: str) -> int:
  """Child entry: the production entry (`entry.main`: its failure classes
  and exit codes), with deterministic ops (so resumed and uninterrupted runs
  can be compared bitwise) and storage faults where the environment asks
  for them."""
  from components.trainer.process import entry  # pylint: disable=g-import-not-at-top
  tf.config.experimental.enable_op_determinism()
  if os.environ.get(faulty_storage.ENV):
    faulty_storage.FaultyStorage.from_json(
        os.environ[faulty_storage.ENV]).install()
  return entry.main(['--task', task_path])


if __name__ == '__main__':
  from components.trainer.process import entry  # pylint: disable=g-import-not-at-top
  entry.finish(main(sys.argv[1]))
