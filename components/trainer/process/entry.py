"""Entry point of every task process of a cluster (chief, worker, ps), and
of in-process training.

    python -m components.trainer.process.entry --task task.json --role trainer
    python -m components.trainer.process.entry --task task.json --role server

A `trainer` validates its distribution config (once), splits the CPU into
logical devices (before TensorFlow starts), seeds itself, builds the strategy
from its registry entry, resolves its `ProcessContext` and trains: the
managed loop (`managed.training.run`) or the module's `run_fn`. The chief
writes `training_result.json` into the model_run dir, once. A `server` (the
parameter-server ps and workers) runs a tf.distribute.Server until the
supervisor stops it; it runs only functions the coordinator traced, whose
random ops carry the coordinator's seeds, so it has nothing to seed. No TFX
import here: managed-mode processes start fast.
"""

import argparse
import logging as std_logging
import os
import resource
import sys
import time
from typing import Optional

# The suite uses tf-keras; set before anything imports TensorFlow.
os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')
_IMPORTS_BEGAN = time.monotonic()

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import logging as absl_logging
import tensorflow as tf

from components.data import input_pipeline
from components.data import shard_check
from components.records import training_result
from components.trainer.common.exit_codes import NOT_RETRYABLE_EXIT_CODE
from components.trainer.common import failures
from components.trainer.cluster import tf_cluster
from components.trainer.config import DistributionConfig
from components.trainer.managed import preemption
from components.trainer.process.context import ProcessContext
from components.trainer.common import cpu_threads
from components.trainer.common.split_source import split_source
from components.trainer.common import tf_config as tf_config_lib
from components.trainer.common.task import TrainingTask
from components.trainer.strategies import choice
from components.trainer.strategies import registry
# pylint: enable=g-import-not-at-top,wrong-import-position
_IMPORT_SECONDS = time.monotonic() - _IMPORTS_BEGAN


def run_server() -> None:
  """Serves this process's ps/worker task of TF_CONFIG until killed."""
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  server = tf.distribute.Server(
      resolver.cluster_spec(), job_name=resolver.task_type,
      task_index=resolver.task_id, protocol=resolver.rpc_layer or 'grpc',
      start=True)
  print(f'{resolver.task_type}-{resolver.task_id} serving at '
        f'{server.target}', flush=True)
  server.join()


def seed_process(config: DistributionConfig) -> None:
  """Seeds Python, NumPy and TF, and turns on op determinism, as configured.

  Every training process calls it before the model (or the module's run_fn)
  builds anything, so that initializers and random ops repeat per seed.
  """
  if config.seed is not None:
    tf.keras.utils.set_random_seed(config.seed)
  if config.deterministic:
    tf.config.experimental.enable_op_determinism()


def train(task: TrainingTask, shared_process: bool = False,
          config: Optional[DistributionConfig] = None
         ) -> training_result.TrainingResult:
  """Trains as this process's part of the task; returns its result, which
  the chief writes. `shared_process`: this is the executor's process
  (launcher in_process), which passes the `config` it validated."""
  began = time.monotonic()
  config = config or DistributionConfig.from_dict(task.distribution)
  logical_cpus = config.logical_cpu_devices
  if task.partition_plan_uri:
    # Pipeline stages (of each data-parallel copy) need a device each;
    # without GPUs they are logical CPUs.
    from components.records import partition_plan  # pylint: disable=g-import-not-at-top
    logical_cpus = max(logical_cpus or 1, partition_plan.read(
        task.partition_plan_uri).num_devices)
  choice.configure_logical_cpus(logical_cpus)
  threads = cpu_threads.configure(config.intra_op_threads, shared_process,
                                  task.model_weights)
  seed_process(config)
  context = ProcessContext.resolve(
      task, config, registry.get(config.strategy).build(config))
  setup_s = time.monotonic() - began
  start = time.time()
  if task.mode == 'managed':
    from components.trainer.managed import training  # pylint: disable=g-import-not-at-top
    loop = training.run(context)
    steps = loop.steps
  else:
    from components.trainer import fn_args  # pylint: disable=g-import-not-at-top
    loop, steps = None, fn_args.run_user_fn(context)
  result = training_result.TrainingResult(
      mode=task.mode, strategy=config.strategy, steps=steps,
      num_replicas=context.replicas, num_workers=context.workers,
      per_replica_batch_size=context.config.per_replica_batch_size,
      global_batch_size=context.global_batch,
      train_steps=context.task.train_steps,
      eval_steps=context.task.eval_steps, seed=config.seed,
      deterministic=config.deterministic, intra_op_threads=threads,
      train_wall_s=time.time() - start,
      worker_imports_s=round(_IMPORT_SECONDS, 3),
      worker_setup_s=round(setup_s, 3),
      # Linux counts ru_maxrss in KiB.
      peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
      loop=loop)
  if context.is_chief:
    training_result.write(task.model_run_dir, result)
  return result


def run_in_process(task: TrainingTask, config: DistributionConfig
                  ) -> training_result.TrainingResult:
  """launcher='in_process': this process's role comes from TF_CONFIG;
  `config`: the executor's validated and resolved distribution config."""
  task_type = tf_config_lib.from_env().get('task', {}).get('type')
  if (registry.get(task.distribution['strategy']).cluster ==
      registry.PARAMETER_SERVERS and task_type in ('ps', 'worker')):
    run_server()
  return train(task, shared_process=True, config=config)


def log_at_info() -> None:
  """INFO lines (absl's and the progress lines) go to this process's log.

  A fresh process has no log handler and absl's level is WARNING, so the
  training processes' progress went nowhere. TensorFlow gave its logger a
  handler of its own (the root had none as it started): without it, its
  lines are not written twice.
  """
  tf_logger = tf.get_logger()
  for handler in list(tf_logger.handlers):
    tf_logger.removeHandler(handler)
  std_logging.basicConfig(
      level=std_logging.INFO, force=True,
      format='%(asctime)s %(levelname).1s %(name)s %(filename)s:%(lineno)d] '
      '%(message)s')
  absl_logging.set_verbosity(absl_logging.INFO)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--task', required=True, help='TrainingTask JSON file.')
  parser.add_argument('--role', choices=tf_cluster.ROLES, default='trainer')
  args = parser.parse_args(argv)
  log_at_info()
  if args.role == 'server':
    run_server()
  task = TrainingTask.load(args.task)
  try:
    result = train(task)
  except Exception as e:  # pylint: disable=broad-except
    failure_class = failures.classify(e)
    if failure_class.retry:
      raise  # A traceback and exit 1: the supervisor relaunches.
    absl_logging.exception('Not retryable (%s):', failure_class.name)
    # The last line of the log: the supervisor's error starts with it.
    print(failures.record_line(failure_class,
                               describe_failure(task, failure_class, e)),
          flush=True)
    return NOT_RETRYABLE_EXIT_CODE
  # A preempted run stopped at a checkpoint: tell the launcher that a rerun
  # resumes.
  return preemption.exit_code(result.preempted)


def describe_failure(task: TrainingTask,
                     failure_class: failures.FailureClass,
                     error: BaseException) -> str:
  """What broke and where: for damaged data, the file and the record, found
  by reading the task's files once (TF's error names neither); for storage,
  which of the task's locations."""
  where = failures.short_text(error)
  # Our own errors say where already; TF's and the OS's name a file.
  problem = failures.LOCATION_PROBLEMS.get(failure_class)
  if problem and not type(error).__module__.startswith('components.'):
    for role, path in (('checkpoint', task.checkpoint_dir),
                       ('model', task.serving_model_dir),
                       ('model_run', task.model_run_dir)):
      if path in where:
        where = (f'The {role} location {path} {problem[1]} '
                 f'({type(error).__name__}: {where})')
        break
  if isinstance(error, tf.errors.DataLossError):
    config = input_pipeline.InputPipelineConfig.from_dict(
        task.input_pipeline or {})
    damaged = shard_check.first_damaged(
        [pattern for patterns in (task.train_files, task.eval_files)
         if patterns for pattern in split_source(
             config, patterns, task.checkpoint_dir).patterns],
        config.read_compression())
    if damaged:
      where = (f'The data file {damaged["path"]} is damaged after record '
               f'{damaged["readable_records"]} (the records before it read '
               f'fine): {damaged["error"]}')
  return failures.describe(failure_class, where)


def finish(code: int) -> None:
  """Exits with `code`.

  A process alone in its cluster skips Python's and TensorFlow's teardown
  (module finalizers, thread pools), which costs most of a second and
  writes nothing: its files are closed and its logs are flushed first. A
  process of a larger cluster exits normally, as TensorFlow's shutdown at
  exit is where its tasks leave the coordination service together.
  """
  if tf_config_lib.task_count(tf_config_lib.from_env()) > 1:
    sys.exit(code)
  std_logging.shutdown()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)  # pylint: disable=protected-access


if __name__ == '__main__':
  finish(main())
