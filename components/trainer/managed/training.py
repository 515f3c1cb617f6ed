"""One managed training: builds its parts and wires them.

The user module only builds a compiled model (`build_model(hparams)`,
`LABEL_KEY`, optional `RAW_LABEL_KEY` and `serving_signatures`); this module
builds it in the strategy (or on the GPipe stage devices) with its
checkpointer, resumes it in the data order `datasets` gives the attempt,
picks the step runner and preemption watcher the strategy's registry entry
calls for and the XLA setting (`xla`), drives the loop (`driver`, with
`progress_writer`), evaluates, exports, and reports the loop's
`training_result.LoopReport` to the process's entry.

Exact resume is built in: the optimizer-step counter is a variable inside the
checkpoint, and the data position is derived from it, so synchronous
strategies resume to the same trajectory as an uninterrupted run.
Parameter-server training is asynchronous: it resumes the variables and the
exact step count, while each worker streams its own shuffled pass over the
data (no global data order exists to resume).
"""

import contextlib
import dataclasses
import time
from typing import Any, Dict, Optional

import tensorflow as tf

from components import patches
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
from components.trainer.managed import progress_writer
from components.trainer.managed import served_data
from components.trainer.managed import step_runners
from components.trainer.managed import votes
from components.trainer.managed import warm_start
from components.trainer.managed import xla
from components.trainer.process.context import ProcessContext
from components.trainer.common.task import TrainingTask
from components.trainer import config as config_lib
from components.trainer import user_module


class ManagedTraining:
  """One managed training's parts, each built from those before it: the
  model and its checkpointer (`build_model`), the data check, order and
  resume (`restore`), the step runner and the loop (`train`), evaluation
  and export, and the report."""

  def __init__(self, context: ProcessContext):
    self.started = time.monotonic()
    # Seconds of each part outside the steps (the report's `timing`).
    self.timing: Dict[str, float] = {}
    self.context = context
    self.task = task = context.task
    self.module = user_module.load(task.module_file, task.module_path)
    self.data = datasets.training_data(task, self.module)
    fault_tolerance = FaultToleranceConfig.from_dict(task.fault_tolerance)
    self.fault_tolerance = fault_tolerance.checkpoint()
    self.skip_unreadable = fault_tolerance.skip_unreadable_records
    self.plan = (partition_plan.read(task.partition_plan_uri)
                 if task.partition_plan_uri else None)
    if self.plan is not None:
      config_lib.check_partition_plan(
          context.spec.name, context.replicas, context.accumulation,
          context.global_batch, self.plan.batch_size)
    self.examples_per_step = context.global_batch * context.accumulation
    self.train_steps = int(task.train_steps)
    self.any_worker, self.all_workers = votes.votes(
        context.strategy, context.spec.lockstep_workers)
    self.progress_writer = progress_writer.ProgressWriter(
        task.model_run_dir if context.is_chief else None, self.train_steps,
        self.examples_per_step)
    # Set by restore: the data checked against its shard indexes (chief),
    # its order, the memory cache's fallback and the warm start, if any.
    self.data_check = datasets.DataCheck()
    self.order = None
    self.cache_fallback = None
    self.warm_started = None
    # Set by build_model and train: the dtype policy, the XLA choice and
    # the steps per call.
    self.precision = None
    self.xla = None
    self.sizer = None
    # Set by train where distribution.offload asks for cells.
    self.offload = None

  # --- model and checkpoint

  def _build_pipelined_model(self):
    """The model with each stage's variables on its own device, and the
    runner of its stages."""
    devices = placement.stage_devices(self.plan.num_devices)
    model = placement.build_model_on_devices(
        lambda: self.module.build_model(self.task.hparams), self.plan, devices)
    return model, pipeline_runner.PipelineRunner(model, self.plan, devices)

  def build_model(self) -> None:
    """Model, optimizer slots and the step counter, in the strategy scope,
    under the dtype policy the module or the config chooses; and their
    checkpointer."""
    context = self.context
    self.pipeline_runner = None
    requested = precision.decide(
        context.config.precision,
        lambda: precision.detect_hardware(context.strategy),
        context.spec.loss_scaling, self.all_workers, self.task.model_weights)
    # GPipe places every stage itself, so it builds outside the strategy.
    scope = (context.strategy.scope() if self.plan is None else
             tf.distribute.get_strategy().scope())
    with scope:
      with precision.building(requested.policy) as module_policy:
        if self.plan is None:
          self.model = self.module.build_model(self.task.hparams)
        else:
          self.model, self.pipeline_runner = self._build_pipelined_model()
        if not self.model.built:
          self.model(datasets.sample_features(self.task, self.data),
                     training=False)
      self.precision = precision.resolve(
          self.model, requested, module_policy.get('module'),
          context.spec.loss_scaling, context.spec.name)
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
        context.is_chief, manifest_extra={
            'examples_per_step': self.examples_per_step,
            'strategy': context.spec.name},
        # Every attempt of this execution (launcher restarts, executor
        # retries) has this model_run; another execution has another.
        run_id=self.task.model_run_dir,
        collective_saves=context.spec.lockstep_workers)

  def restore(self) -> int:
    """Takes the checkpoint folder's lease (chief), then restores and fixes
    the data order; a training with nothing to resume starts from the base
    model, if any."""
    context = self.context
    self.checkpointer.acquire_lease()
    # No worker reads checkpoints before the chief holds the lease: until
    # then another run may still be pruning them.
    self.all_workers(True)
    self.data_check = datasets.check_data(
        self.task, self.data, context.is_chief, self.all_workers,
        self.skip_unreadable)
    start = self.checkpointer.restore()
    self.data, self.cache_fallback = datasets.fit_cache(
        self.data, self.data_check, 1 / context.workers)
    self.order = datasets.attempt_order(
        self.task, self.data, self.data_check, context.config,
        asynchronous=context.spec.asynchronous,
        examples_per_step=self.examples_per_step,
        partitions=context.data_partitions, replicas=context.replicas,
        start=start,
        recorded=self.checkpointer.restored_extra.get('data_order'))
    if self.order is not None:
      # What a resume from any of these checkpoints checks its order with.
      self.checkpointer.save_with_checkpoints('data_order',
                                              self.order.state())
    if start == 0 and self.task.base_model:
      # Every worker reads the same base model: their copies stay equal.
      self.warm_started = warm_start.warm_start(self.model,
                                                self.task.base_model)
      progress.LOGGER.info('Warm start: %d weights from %s.',
                           self.warm_started['weights'], self.task.base_model)
    return start

  def _save_now(self) -> None:
    self.checkpointer.save(int(self.step.numpy()))

  # --- training

  def _replica_step(self, jit_compile: bool):
    context = self.context
    # A lone replica has no cross-replica update: XLA takes the whole step.
    lone_replica = context.replicas == 1 and not context.spec.multi_worker
    return accumulation.replica_step_fn(
        self.model, context.accumulation, self.examples_per_step,
        context.config.per_replica_batch(context.replicas), jit_compile,
        lone_replica)

  def _runner_and_watcher(self, start: int):
    """The step runner for this kind of training, as the XLA choice runs
    it, and its preemption watcher."""
    strategy, spec = self.context.strategy, self.context.spec
    self.offload = served_data.start(self.context, self.order)
    dataset_fn = datasets.attempt_train_dataset_fn(
        self.task, self.data, self.data_check, self.order,
        asynchronous=spec.asynchronous,
        examples_per_step=self.examples_per_step, start=start,
        train_steps=self.train_steps, seed=self.context.config.seed,
        serve=self.offload and self.offload.serve)
    if spec.asynchronous:
      self.xla = self._choose_xla(start, None)
      runner = step_runners.ParameterServerSteps(
          strategy, dataset_fn, self._replica_step(self.xla.enabled),
          self.step, self.train_steps)
      # Only the coordinator checkpoints: our own SIGTERM flag suffices.
      return xla.with_choice(runner, self.xla), preemption.SigtermWatcher(
          self._save_now)
    if self.pipeline_runner is None:
      self.xla = self._choose_xla(start, lambda jit: xla.probe_runner(
          strategy, dataset_fn, self._replica_step, jit,
          spec.host_iterator_input))
      runner = step_runners.SynchronousSteps(
          strategy, dataset_fn, self._replica_step(self.xla.enabled),
          self.step, spec.host_iterator_input)
    else:
      self.xla = self._choose_xla(start, None, 'pipeline stages')
      self.pipeline_runner.jit_compile_stages(self.xla.enabled)
      runner = step_runners.PipelineSteps(
          self.pipeline_runner, dataset_fn(tf.distribute.InputContext()),
          self.step)
    runner = xla.with_choice(runner, self.xla)
    if spec.lockstep_workers:
      return runner, preemption.MultiWorkerPreemptionWatcher(
          strategy, self.checkpoint, self._save_now)
    return runner, preemption.SigtermWatcher(self._save_now)

  def _choose_xla(self, start: int, probe, not_measured: str = ''
                  ) -> xla.XlaChoice:
    """The module's or the config's XLA setting; `auto`: the choice saved
    with the resumed checkpoint, else measured with `probe(jit)` (a step
    runner on probe batches), else off for `not_measured`."""
    spec = self.context.spec
    setting, source = xla.requested(self.model, self.context.config.xla)
    if setting != xla.OFF and not spec.xla:
      return xla.XlaChoice(False, source, (
          f'strategy {spec.name!r} keeps variables on other devices '
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
        choice = xla.measure_restoring(self.checkpoint, probe,
                                       self.all_workers)
    self.checkpointer.save_with_checkpoints(
        'xla', recorded or choice.to_dict())
    return choice

  def train(self, start: int) -> Dict[str, Any]:
    """Trains from step `start`; returns the loop's step summary."""
    setting = self.context.config.steps_per_execution
    if setting == AUTO and self.context.spec.auto_steps_per_call:
      # Workers of a cluster never size calls by their own clocks: they run
      # the same calls.
      setting = self.context.spec.auto_steps_per_call
    self.sizer = call_size.CallSizer(
        setting, max_call=self.fault_tolerance.save_every_steps)
    try:
      runner, watcher = self._runner_and_watcher(start)
      with self.progress_writer.recording(
          self.checkpointer) as record_progress:
        return driver.drive(
            runner, self.checkpointer, watcher, start=start,
            train_steps=self.train_steps, sizer=self.sizer,
            record_progress=record_progress, any_worker=self.any_worker,
            read_step=lambda: int(self.step.numpy()))
    finally:
      if self.offload is not None:
        self.offload.close()

  # --- evaluation, export, report

  def local_copy(self) -> tf.keras.Model:
    """The trained model outside the strategy (parameter-server variables
    live on the ps tasks; eval and export run on the coordinator)."""
    with precision.building(self.precision.policy):
      model = self.module.build_model(self.task.hparams)
    model.set_weights(self.model.get_weights())
    return model

  def evaluate_and_export(self) -> Dict[str, float]:
    context = self.context
    if context.spec.asynchronous:
      model, strategy = self.local_copy(), tf.distribute.get_strategy()
    else:
      model, strategy = self.model, context.strategy
    with self.timed('eval_s'):
      metrics = evaluation.evaluate(
          model, strategy, context.spec.lockstep_workers,
          datasets.eval_dataset_fn(self.task, self.data, context.global_batch,
                                   self.data_check.readable_records),
          self.task.eval_steps,
          self.task.model_run_dir if context.is_chief else None,
          self.train_steps)
    with self.timed('export_s'):
      export.export_trained_model(
          model, self.module, self.data.tf_transform_output,
          self.data.raw_label_key, self.task.serving_model_dir,
          context.is_chief)
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
        gradient_accumulation_steps=self.context.accumulation,
        precision=self.precision.to_dict(), xla=self.xla.to_dict(),
        checkpoint_dir=self.task.checkpoint_dir,
        checkpoints_saved=self.checkpointer.saves,
        checkpoint_s=round(self.checkpointer.save_seconds, 4),
        resume_events=self.checkpointer.events,
        warm_start=self.warm_started,
        shard_index=self.data_check.indexes,
        data_order=None if self.order is None else self.order.state(),
        input_pipeline=self.data.config.to_dict(),
        cache_fallback=self.cache_fallback,
        unreadable_records=self.data_check.unreadable,
        pipeline_parallel=self._pipeline_parallel(),
        offload=self.offload and self.offload.describe(),
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
