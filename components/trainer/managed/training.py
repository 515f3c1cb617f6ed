"""One managed training: builds the model and the parts, runs them, reports.

The user module only builds a compiled model (`build_model(hparams)`,
`LABEL_KEY`, optional `RAW_LABEL_KEY` and `serving_signatures`); this module
builds it in the strategy (or on the GPipe stage devices), picks the step
runner and preemption watcher the strategy's registry entry calls for, and
reports the loop's `training_result.LoopReport` to the process's entry.

Exact resume is built in: the optimizer-step counter is a variable inside the
checkpoint, and the data position is derived from it, so synchronous
strategies resume to the same trajectory as an uninterrupted run.
Parameter-server training is asynchronous: it resumes the variables and the
exact step count, while each worker streams its own shuffled pass over the
data (no global data order exists to resume).
"""

import contextlib
import dataclasses
import math
import os
import time
from typing import Any, Dict, Optional

import tensorflow as tf

from components import patches
from components.data import data_order
from components.pipeline_parallel import placement
from components.pipeline_parallel import runner as pipeline_runner
from components.records import partition_plan
from components.records import training_result
from components.trainer.checkpoint.checkpointer import Checkpointer
from components.trainer.checkpoint.config import FaultToleranceConfig
from components.trainer.config import AUTO
from components.trainer.managed import accumulation
from components.trainer.managed import call_size
from components.trainer.managed import datasets
from components.trainer.managed import driver
from components.trainer.managed import evaluation
from components.trainer.managed import export
from components.trainer.managed import precision
from components.trainer.managed import preemption
from components.trainer.common import progress
from components.trainer.managed import step_runners
from components.trainer.managed import votes
from components.trainer.managed import warm_start
from components.trainer.managed import xla
from components.trainer.process.context import ProcessContext
from components.trainer.common.task import TrainingTask
from components.trainer import config as config_lib
from components.trainer import user_module

# Batches each parameter-server worker shuffles over (its own order).
PS_SHUFFLE_BATCHES = 16
# The TensorBoard event file is flushed at most this often.
EVENTS_FLUSH_SECONDS = 1.0
# So that the writer never flushes by itself: record_progress adds at most
# ~100 points in all, and training flushes within 10 minutes (TF keeps
# flush_millis in a 32-bit int).
_EVENTS_MAX_QUEUE = 1000
_EVENTS_FLUSH_MILLIS = 600_000
# Where the XLA probe keeps the variables while it measures (in memory).
XLA_SNAPSHOT_ROOT = 'ram://hpm_xla_probe'


class ManagedTraining:
  """One managed training: the model, its checkpointer, and the loop."""

  def __init__(self, context: ProcessContext):
    self.started = time.monotonic()
    # Seconds of each part outside the steps (the report's `timing`).
    self.timing: Dict[str, float] = {}
    self.task = task = context.task
    self.strategy = strategy = context.strategy
    self.spec = context.spec
    self.is_chief = context.is_chief
    self.module = user_module.load(task.module_file, task.module_path)
    self.data = datasets.training_data(task, self.module)
    self.distribution = context.config
    fault_tolerance = FaultToleranceConfig.from_dict(task.fault_tolerance)
    self.fault_tolerance = fault_tolerance.checkpoint()
    self.skip_unreadable = fault_tolerance.skip_unreadable_records
    self.accumulation = context.accumulation
    self.replicas = context.replicas
    self.workers = context.workers
    self.data_partitions = context.data_partitions
    self.global_batch = context.global_batch
    self.plan = (partition_plan.read(task.partition_plan_uri)
                 if task.partition_plan_uri else None)
    if self.plan is not None:
      config_lib.check_partition_plan(
          self.spec.name, self.replicas, self.accumulation, self.global_batch,
          self.plan.batch_size)
    self.examples_per_step = self.global_batch * self.accumulation
    self.train_steps = int(task.train_steps)
    self.any_worker, self.all_workers = votes.votes(
        strategy, self.spec.lockstep_workers)
    # Flushed by record_progress at most once a second (a flush to an object
    # store uploads the file again), so the writer itself never flushes
    # during training.
    self.writer = (tf.summary.create_file_writer(
        os.path.join(task.model_run_dir, 'train'),
        max_queue=_EVENTS_MAX_QUEUE, flush_millis=_EVENTS_FLUSH_MILLIS)
                   if self.is_chief else None)
    self._events_due = progress.Every(EVENTS_FLUSH_SECONDS)
    self._line_due = progress.Every(progress.LINE_EVERY_SECONDS)
    self.sizer = None
    # Set by restore: the data checked against its shard indexes (chief),
    # and the warm start, if any.
    self.data_check = datasets.DataCheck()
    self.order = None
    self.cache_fallback = None
    self.warm_started = None
    # Set by build_model and train: the dtype policy and XLA choices.
    self.precision = None
    self.xla = None

  # --- model and checkpoint

  def _build_pipelined_model(self) -> tf.keras.Model:
    """The model with each stage's variables on its own device."""
    devices = placement.stage_devices(self.plan.num_devices)
    model = placement.build_model_on_devices(
        lambda: self.module.build_model(self.task.hparams), self.plan, devices)
    self.pipeline_runner = pipeline_runner.PipelineRunner(model, self.plan,
                                                          devices)
    return model

  def build_model(self) -> None:
    """Model, optimizer slots and the step counter, in the strategy scope,
    under the dtype policy the module or the config chooses."""
    self.pipeline_runner = None
    requested = precision.decide(
        self.distribution.precision,
        lambda: precision.detect_hardware(self.strategy),
        self.spec.loss_scaling, self.all_workers, self.task.model_weights)
    # GPipe places every stage itself, so it builds outside the strategy.
    scope = (self.strategy.scope() if self.plan is None else
             tf.distribute.get_strategy().scope())
    with scope:
      with precision.building(requested.policy) as module_policy:
        self.model = (self.module.build_model(self.task.hparams)
                      if self.plan is None else self._build_pipelined_model())
        if not self.model.built:
          self.model(datasets.sample_features(self.task, self.data),
                     training=False)
      self.precision = precision.resolve(
          self.model, requested, module_policy.get('module'),
          self.spec.loss_scaling, self.spec.name)
      self.step = tf.Variable(
          0, dtype=tf.int64, trainable=False, name='global_step',
          aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
      if hasattr(self.model.optimizer, 'build'):
        # Slots must exist before restore, or they would restore lazily.
        self.model.optimizer.build(self.model.trainable_variables)
    if self.precision.policy != precision.FLOAT32 or (
        self.precision.source != 'config'):
      progress.LOGGER.info('Precision %s (%s: %s).', self.precision.policy,
                           self.precision.source, self.precision.reason)
    self.checkpoint = tf.train.Checkpoint(model=self.model,
                                          optimizer=self.model.optimizer,
                                          step=self.step)
    self.checkpointer = Checkpointer(
        self.task.checkpoint_dir, self.checkpoint, self.fault_tolerance,
        self.is_chief, manifest_extra={
            'examples_per_step': self.examples_per_step,
            'strategy': self.spec.name},
        # Every attempt of this execution (launcher restarts, executor
        # retries) has this model_run; another execution has another.
        run_id=self.task.model_run_dir,
        collective_saves=self.spec.lockstep_workers)

  def restore(self) -> int:
    """Takes the checkpoint folder's lease (chief), then restores; a
    training with nothing to resume starts from the base model, if any."""
    self.checkpointer.acquire_lease()
    # No worker reads checkpoints before the chief holds the lease: until
    # then another run may still be pruning them.
    self.all_workers(True)
    self.data_check = datasets.check_data(
        self.task, self.data, self.is_chief, self.all_workers,
        self.skip_unreadable)
    start = self.checkpointer.restore()
    self.data, self.cache_fallback = datasets.fit_cache(
        self.data, self.data_check, 1 / self.workers)
    self._fix_data_order(start)
    if start == 0 and self.task.base_model:
      # Every worker reads the same base model: their copies stay equal.
      self.warm_started = warm_start.warm_start(self.model,
                                                self.task.base_model)
      progress.LOGGER.info('Warm start: %d weights from %s.',
                           self.warm_started['weights'], self.task.base_model)
    return start

  def _fix_data_order(self, start: int) -> None:
    """The synchronous data order, checked against the one the restored
    checkpoint was trained in and saved with every checkpoint."""
    self.order = None
    if self.spec.asynchronous:
      return
    partitions = self.data_partitions
    if self.examples_per_step % partitions or partitions % self.replicas:
      raise ValueError(
          f'The data order has {partitions} partitions (distribution.'
          f'data_partitions={self.distribution.data_partitions}): they must '
          f'divide the {self.examples_per_step} examples of an update and '
          f'be shared evenly by the {self.replicas} replicas.')
    self.order = datasets.train_order(
        self.data, self.data_check, datasets.data_seed(self.distribution.seed),
        self.examples_per_step // partitions, partitions)
    if self.order is None:
      if self.distribution.elastic:
        raise ValueError(
            'An elastic cluster (min_workers < num_workers) trains in the '
            'data order over a shard index, and the train files '
            f'{self.task.train_files} are not one folder to index: pass the '
            "patterns of one split folder (TFX's 'Split-<name>/*').")
      return
    recorded = self.checkpointer.restored_extra.get('data_order')
    if start and recorded:
      data_order.check_resumable(recorded, self.order.state(),
                                 self.task.checkpoint_dir)
    self.checkpointer.save_with_checkpoints('data_order', self.order.state())

  def _save_now(self) -> None:
    self.checkpointer.save(int(self.step.numpy()))

  # --- training

  def record_progress(self, previous: int, current: int, loss: float,
                      stats: driver.StepStats) -> None:
    """Progress marker (at most once a second), TensorBoard loss (~100
    points, written at most once a second), a progress line every few
    seconds."""
    steps_per_sec, whole_attempt = stats.rate()
    details = progress.details(
        step=current, train_steps=self.train_steps, loss=loss,
        steps_per_sec=steps_per_sec, steady=not whole_attempt,
        examples_per_step=self.examples_per_step, elapsed_s=stats.elapsed(),
        checkpoints=self.checkpointer.saves,
        last_checkpoint_step=self.checkpointer.last_save_step)
    self.checkpointer.progress.update(current, details)
    log_every = max(1, self.train_steps // 100)
    if self.writer and current // log_every > previous // log_every and (
        not math.isnan(loss)):
      tf.summary.scalar('loss', loss, step=current)  # Default: self.writer.
    if self.writer and self._events_due():
      self.writer.flush()
    if self._line_due() or current == self.train_steps:
      progress.LOGGER.info('%s', progress.format_line(
          {**details, 'step': current}))

  def _replica_step(self, jit_compile: bool):
    # A lone replica has no cross-replica update: XLA takes the whole step.
    lone_replica = self.replicas == 1 and not self.spec.multi_worker
    return accumulation.replica_step_fn(
        self.model, self.accumulation, self.examples_per_step,
        self.distribution.per_replica_batch(self.replicas), jit_compile,
        lone_replica)

  def _runner_and_watcher(self, start: int):
    """The step runner for this kind of training, and its preemption
    watcher."""
    if self.spec.asynchronous:
      self.xla = self._choose_xla(start, None)
      config = dataclasses.replace(
          self.data.config, shuffle_buffer_batches=max(
              PS_SHUFFLE_BATCHES, self.data.config.shuffle_buffer_batches))
      dataset_fn = datasets.train_dataset_fn(
          self.task, self.data, self.examples_per_step, 0,
          datasets.PER_WORKER_SEED, config)
      runner = step_runners.ParameterServerSteps(
          self.strategy, dataset_fn, self._replica_step(self.xla.enabled),
          self.step, self.train_steps)
      # Only the coordinator checkpoints: our own SIGTERM flag suffices.
      return self._with_xla(runner), preemption.SigtermWatcher(
          self._save_now)
    if self.order is not None:
      dataset_fn = datasets.ordered_train_dataset_fn(
          self.data_check, self.data, self.order, start, self.train_steps)
    else:
      dataset_fn = datasets.train_dataset_fn(
          self.task, self.data, self.examples_per_step, start,
          datasets.data_seed(self.distribution.seed), self.data.config,
          self.data_check.readable_records)
    if self.pipeline_runner is None:
      self.xla = self._choose_xla(
          start, lambda jit: self._probe_runner(dataset_fn, jit))
      runner = step_runners.SynchronousSteps(
          self.strategy, dataset_fn, self._replica_step(self.xla.enabled),
          self.step, self.spec.host_iterator_input)
    else:
      self.xla = self._choose_xla(start, None, 'pipeline stages')
      self.pipeline_runner.jit_compile_stages(self.xla.enabled)
      runner = step_runners.PipelineSteps(
          self.pipeline_runner, dataset_fn(tf.distribute.InputContext()),
          self.step)
    runner = self._with_xla(runner)
    if self.spec.lockstep_workers:
      return runner, preemption.MultiWorkerPreemptionWatcher(
          self.strategy, self.checkpoint, self._save_now)
    return runner, preemption.SigtermWatcher(self._save_now)

  # --- XLA

  def _with_xla(self, runner):
    """`runner` as the XLA choice runs it: logged where it is not the
    default, its compile errors named where XLA is on."""
    if self.xla.enabled or self.xla.source != 'config':
      progress.LOGGER.info('XLA %s (%s: %s).',
                           'on' if self.xla.enabled else 'off',
                           self.xla.source, self.xla.reason)
    return xla.CompileErrorsNamed(runner, self.xla) if self.xla.enabled else (
        runner)

  def _choose_xla(self, start: int, probe, not_measured: str = ''
                  ) -> xla.XlaChoice:
    """The module's or the config's XLA setting; `auto`: the choice saved
    with the resumed checkpoint, else measured with `probe(jit)` (a step
    runner on probe batches), else off for `not_measured`."""
    setting, source = xla.requested(self.model, self.distribution.xla)
    if setting != xla.OFF and not self.spec.xla:
      return xla.XlaChoice(False, source, (
          f'strategy {self.spec.name!r} keeps variables on other devices '
          'than its replicas, which XLA cannot read: trained without XLA'))
    if setting != xla.AUTO:
      return xla.fixed(setting, source)
    recorded = self.checkpointer.restored_extra.get('xla') if start else None
    if recorded:
      choice = dataclasses.replace(xla.XlaChoice.from_dict(recorded),
                                   source='checkpoint')
    elif probe is None:
      choice = xla.XlaChoice(False, xla.AUTO, f'not measured: {not_measured}')
    else:
      with self.timed('xla_probe_s'):
        choice = self._measure_xla(probe)
    self.checkpointer.save_with_checkpoints(
        'xla', recorded or choice.to_dict())
    return choice

  def _probe_runner(self, dataset_fn, jit_compile: bool):
    """A step runner over the training's first batches, each probe call on
    new ones (a model XLA compiles again for a new batch shows it), with a
    counter of its own."""
    batches = (1 + xla.PROBE_CALLS) * xla.PROBE_STEPS * self.replicas
    with self.strategy.scope():
      counter = tf.Variable(
          0, dtype=tf.int64, trainable=False,
          aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    return step_runners.SynchronousSteps(
        self.strategy,
        lambda context: dataset_fn(context).take(batches).repeat(),
        self._replica_step(jit_compile), counter,
        self.spec.host_iterator_input)

  def _measure_xla(self, probe) -> xla.XlaChoice:
    """`xla.measure` with every checkpointed variable written to memory
    before and read back after, so the probe steps train nothing."""
    snapshot = self.checkpoint.write(
        f'{XLA_SNAPSHOT_ROOT}/{os.getpid()}_{id(self)}/state')
    runners = {}

    def run_call(jit_compile: bool) -> None:
      if jit_compile not in runners:
        runners[jit_compile] = probe(jit_compile)
      _, loss = runners[jit_compile](0, xla.PROBE_STEPS)
      float(loss)  # Waits for the steps.

    try:
      return xla.measure(run_call, self.all_workers)
    finally:
      self.checkpoint.read(snapshot).assert_existing_objects_matched()
      tf.io.gfile.rmtree(os.path.dirname(snapshot))

  def train(self, start: int) -> Dict[str, Any]:
    setting = self.distribution.steps_per_execution
    if setting == AUTO and self.spec.auto_steps_per_call:
      # Workers of a cluster never size calls by their own clocks: they run
      # the same calls.
      setting = self.spec.auto_steps_per_call
    self.sizer = call_size.CallSizer(
        setting, max_call=self.fault_tolerance.save_every_steps)
    runner, watcher = self._runner_and_watcher(start)
    # The writer is the default for all of training: leaving `as_default`
    # flushes it, once (`record_progress` flushes at most once a second).
    with (self.writer.as_default() if self.writer else
          contextlib.nullcontext()):
      return driver.drive(
          runner, self.checkpointer, watcher, start=start,
          train_steps=self.train_steps, sizer=self.sizer,
          record_progress=self.record_progress, any_worker=self.any_worker,
          read_step=lambda: int(self.step.numpy()))

  # --- evaluation, export, report

  def local_copy(self) -> tf.keras.Model:
    """The trained model outside the strategy (parameter-server variables
    live on the ps tasks; eval and export run on the coordinator)."""
    with precision.building(self.precision.policy):
      model = self.module.build_model(self.task.hparams)
    model.set_weights(self.model.get_weights())
    return model

  def evaluate_and_export(self) -> Dict[str, float]:
    if self.spec.asynchronous:
      model, strategy = self.local_copy(), tf.distribute.get_strategy()
    else:
      model, strategy = self.model, self.strategy
    with self.timed('eval_s'):
      metrics = evaluation.evaluate(
          model, strategy, self.spec.lockstep_workers,
          datasets.eval_dataset_fn(self.task, self.data, self.global_batch,
                                   self.data_check.readable_records),
          self.task.eval_steps,
          self.task.model_run_dir if self.is_chief else None,
          self.train_steps)
    with self.timed('export_s'):
      export.export_trained_model(
          model, self.module, self.data.tf_transform_output,
          self.data.raw_label_key, self.task.serving_model_dir,
          self.is_chief)
    return metrics

  @contextlib.contextmanager
  def timed(self, name: str):
    began = time.monotonic()
    try:
      yield
    finally:
      self.timing[name] = round(time.monotonic() - began, 3)

  def report(self, summary: Dict[str, Any], eval_metrics: Dict[str, float],
             exported: bool) -> training_result.LoopReport:
    """The loop's `summary` with what the parts chose, checked and saved
    (the resume events after this attempt's own)."""
    if summary['preempted']:
      self.checkpointer.record_preempted(summary['steps'])
    self.checkpointer.record_storage_retries()
    return training_result.LoopReport.of_steps(
        summary, self.sizer.describe(),
        examples_per_step=self.examples_per_step, timing=self.timing,
        eval=eval_metrics, exported=exported,
        serving_model_dir=self.task.serving_model_dir if exported else None,
        gradient_accumulation_steps=self.accumulation,
        precision=self.precision.to_dict(), xla=self.xla.to_dict(),
        checkpoint_dir=self.task.checkpoint_dir,
        checkpoints_saved=self.checkpointer.saves,
        checkpoint_s=round(self.checkpointer.save_seconds, 4),
        resume_events=self.checkpointer.events,
        warm_start=self.warm_started,
        shard_index=self.data_check.indexes,
        data_order=None if self.order is None else self.order.state(),
        cache_fallback=self.cache_fallback,
        unreadable_records=self.data_check.unreadable,
        pipeline_parallel=self._pipeline_parallel(),
        wall_s=round(time.monotonic() - self.started, 3))

  def _pipeline_parallel(self) -> Optional[Dict[str, Any]]:
    if self.plan is None:
      return None
    return {
        'num_stages': self.plan.num_stages,
        'num_microbatches': self.pipeline_runner.num_microbatches,
        'schedule': self.pipeline_runner.schedule,
        'data_parallel_replicas': self.pipeline_runner.data_parallel_replicas,
        'boundaries': list(self.plan.boundaries),
        'remat': self.plan.remat,
    }


def run(context: ProcessContext) -> training_result.LoopReport:
  """Trains (resuming if a checkpoint exists), evaluates and exports.

  Returns the loop's report, which the process's entry makes part of the
  training result that the chief writes; `preempted` means training stopped
  at a checkpoint after SIGTERM: exit with `preemption.PREEMPTED_EXIT_CODE`
  and run again to resume.
  """
  with patches.installed(patches.AUTOGRAPH_SKIPS_TF_KERAS):
    return _train_evaluate_export(context)


def run_managed_training(task: TrainingTask,
                         strategy: tf.distribute.Strategy) -> Dict[str, Any]:
  """`run` in a process that built `strategy` for `task` itself; the report
  as JSON values."""
  return run(ProcessContext.of_strategy(task, strategy)).to_dict()


def _train_evaluate_export(context: ProcessContext
                          ) -> training_result.LoopReport:
  began = time.monotonic()
  training = ManagedTraining(context)
  training.timing['setup_s'] = round(time.monotonic() - began, 3)
  with training.timed('build_model_s'):
    training.build_model()
  try:
    try:
      with training.timed('restore_s'):
        start = training.restore()
      with training.timed('train_s'):
        summary = training.train(start)
    finally:
      training.checkpointer.close()
    if summary['preempted']:
      return training.report(summary, {}, exported=False)
    eval_metrics = training.evaluate_and_export()
    report = training.report(summary, eval_metrics,
                             exported=context.is_chief)
    if training.fault_tolerance.delete_after_export:
      training.checkpointer.delete_all()
    return report
  finally:
    training.checkpointer.release()
