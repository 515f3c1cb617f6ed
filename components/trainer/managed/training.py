"""One managed training, as phases that each return a complete record.

The user module only builds a compiled model (`build_model(hparams)`,
`LABEL_KEY`, optional `RAW_LABEL_KEY` and `serving_signatures`). `build`
builds it in the strategy (or on the GPipe stage devices) with its
checkpointer (`Built`); `restore` checks the data, resumes and fixes the
attempt's data order (`Restored`); `train` picks the step runner and
preemption watcher the strategy's registry entry calls for and the XLA
setting, and drives the loop (`Trained`); `evaluate_and_export` evaluates
and exports (`Evaluated`); `report` assembles the loop's
`training_result.LoopReport` from them, for the process's entry. Each phase
is a function of the `ProcessContext` and the records before it.

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
from typing import Any, Callable, Dict, Iterator, Optional

import tensorflow as tf

from components import patches
from components.pipeline_parallel import placement
from components.pipeline_parallel import runner as pipeline_runner
from components.records import partition_plan
from components.records import training_result
from components.trainer.checkpoint.checkpointer import Checkpointer
from components.trainer.checkpoint.config import CheckpointConfig
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


class Stopwatch:
  """Seconds of each part outside the steps (the report's `timing`)."""

  def __init__(self):
    self.started = time.monotonic()
    self.seconds: Dict[str, float] = {}

  @contextlib.contextmanager
  def timed(self, name: str) -> Iterator[None]:
    began = time.monotonic()
    try:
      yield
    finally:
      self.seconds[name] = round(time.monotonic() - began, 3)


@dataclasses.dataclass(frozen=True)
class Built:
  """The model in its strategy (or on its stage devices) with its step
  counter and checkpointer, and what the task gave to build it."""
  module: Any
  data: datasets.TrainingData
  fault_tolerance: CheckpointConfig
  skip_unreadable: bool
  plan: Optional[partition_plan.PlanRecord]
  # (any worker says yes, all workers say yes): `votes.votes`.
  any_worker: Callable[[bool], bool]
  all_workers: Callable[[bool], bool]
  progress_writer: progress_writer.ProgressWriter
  model: tf.keras.Model
  # The GPipe stages' runner; None without a partition plan.
  pipeline_runner: Optional[pipeline_runner.PipelineRunner]
  precision: precision.PrecisionChoice
  step: tf.Variable
  checkpoint: tf.train.Checkpoint
  checkpointer: Checkpointer

  def save_now(self) -> None:
    self.checkpointer.save(int(self.step.numpy()))


@dataclasses.dataclass(frozen=True)
class Restored:
  """Where this attempt starts, what it reads, and the warm start of a
  fresh training from a base model."""
  start: int
  attempt: datasets.AttemptData
  warm_start: Optional[Dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Trained:
  """The loop's step summary (`driver.StepStats.summary`), the call lengths
  it ran (`CallSizer.describe`), the XLA choice, and the cells that served
  the partitions (None where the process read them itself)."""
  summary: Dict[str, Any]
  call_lengths: Dict[str, Any]
  xla: xla.XlaChoice
  offload: Optional[Dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Evaluated:
  """The eval metrics, and whether this process exported the model."""
  metrics: Dict[str, float]
  exported: bool


# --- build

def build(context: ProcessContext, clock: Stopwatch) -> Built:
  """Model, optimizer slots and the step counter, in the strategy scope,
  under the dtype policy the module or the config chooses; and their
  checkpointer."""
  task = context.task
  with clock.timed('setup_s'):
    module = user_module.load(task.module_file, task.module_path)
    data = datasets.training_data(task, module)
    fault_tolerance = FaultToleranceConfig.from_dict(task.fault_tolerance)
    plan = (partition_plan.read(task.partition_plan_uri)
            if task.partition_plan_uri else None)
    if plan is not None:
      config_lib.check_partition_plan(
          context.spec.name, context.replicas, context.accumulation,
          context.global_batch, plan.batch_size)
    any_worker, all_workers = votes.votes(context.strategy,
                                          context.spec.lockstep_workers)
    writer = progress_writer.ProgressWriter(
        task.model_run_dir if context.is_chief else None,
        context.train_steps, context.examples_per_step)
  with clock.timed('build_model_s'):
    return _build_model(context, module, data, fault_tolerance, plan,
                        any_worker, all_workers, writer)


def _build_model(context: ProcessContext, module, data, fault_tolerance,
                 plan, any_worker, all_workers, writer) -> Built:
  task = context.task
  requested = precision.decide(
      context.config.precision,
      lambda: precision.detect_hardware(context.strategy),
      context.spec.loss_scaling, all_workers, task.model_weights)
  stages = None
  # GPipe places every stage itself, so it builds outside the strategy.
  scope = (context.strategy.scope() if plan is None else
           tf.distribute.get_strategy().scope())
  with scope:
    with precision.building(requested.policy) as module_policy:
      if plan is None:
        model = module.build_model(task.hparams)
      else:
        model, stages = _build_pipelined_model(module, task, plan)
      if not model.built:
        model(datasets.sample_features(task, data), training=False)
    chosen = precision.resolve(
        model, requested, module_policy.get('module'),
        context.spec.loss_scaling, context.spec.name)
    step = tf.Variable(
        0, dtype=tf.int64, trainable=False, name='global_step',
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    if hasattr(model.optimizer, 'build'):
      # Slots must exist before restore, or they would restore lazily.
      model.optimizer.build(model.trainable_variables)
  if chosen.policy != precision.FLOAT32 or chosen.source != 'config':
    progress.LOGGER.info('Precision %s (%s: %s).', chosen.policy,
                         chosen.source, chosen.reason)
  checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer,
                                   step=step)
  checkpoint_config = fault_tolerance.checkpoint()
  checkpointer = Checkpointer(
      task.checkpoint_dir, checkpoint, checkpoint_config, context.is_chief,
      manifest_extra={'examples_per_step': context.examples_per_step,
                      'strategy': context.spec.name},
      # Every attempt of this execution (launcher restarts, executor
      # retries) has this model_run; another execution has another.
      run_id=task.model_run_dir,
      collective_saves=context.spec.lockstep_workers)
  return Built(
      module=module, data=data, fault_tolerance=checkpoint_config,
      skip_unreadable=fault_tolerance.skip_unreadable_records, plan=plan,
      any_worker=any_worker, all_workers=all_workers, progress_writer=writer,
      model=model, pipeline_runner=stages, precision=chosen, step=step,
      checkpoint=checkpoint, checkpointer=checkpointer)


def _build_pipelined_model(module, task: TrainingTask,
                           plan: partition_plan.PlanRecord):
  """The model with each stage's variables on its own device, and the
  runner of its stages."""
  devices = placement.stage_devices(plan.num_devices)
  model = placement.build_model_on_devices(
      lambda: module.build_model(task.hparams), plan, devices)
  return model, pipeline_runner.PipelineRunner(model, plan, devices)


# --- restore

def restore(context: ProcessContext, built: Built) -> Restored:
  """Takes the checkpoint folder's lease (chief), then restores and fixes
  the data order; a training with nothing to resume starts from the base
  model, if any."""
  task, checkpointer = context.task, built.checkpointer
  checkpointer.acquire_lease()
  # No worker reads checkpoints before the chief holds the lease: until
  # then another run may still be pruning them.
  built.all_workers(True)
  check = datasets.check_data(task, built.data, context.is_chief,
                              built.all_workers, built.skip_unreadable)
  start = checkpointer.restore()
  attempt = datasets.attempt_data(
      context, built.data, check, start,
      recorded=checkpointer.restored_extra.get('data_order'))
  if attempt.order is not None:
    # What a resume from any of these checkpoints checks its order with.
    checkpointer.save_with_checkpoints('data_order', attempt.order.state())
  warm_started = None
  if start == 0 and task.base_model:
    # Every worker reads the same base model: their copies stay equal.
    warm_started = warm_start.warm_start(built.model, task.base_model)
    progress.LOGGER.info('Warm start: %d weights from %s.',
                         warm_started['weights'], task.base_model)
  return Restored(start=start, attempt=attempt, warm_start=warm_started)


# --- train

def train(context: ProcessContext, built: Built, restored: Restored,
          clock: Stopwatch) -> Trained:
  """Trains from the restored step to the task's last."""
  setting = context.config.steps_per_execution
  if setting == AUTO and context.spec.auto_steps_per_call:
    # Workers of a cluster never size calls by their own clocks: they run
    # the same calls.
    setting = context.spec.auto_steps_per_call
  sizer = call_size.CallSizer(
      setting, max_call=built.fault_tolerance.save_every_steps)
  offload = served_data.start(context, restored.attempt.order)
  try:
    runner, watcher, choice = _runner_and_watcher(context, built, restored,
                                                  offload, clock)
    with built.progress_writer.recording(
        built.checkpointer) as record_progress:
      summary = driver.drive(
          runner, built.checkpointer, watcher, start=restored.start,
          train_steps=context.train_steps, sizer=sizer,
          record_progress=record_progress, any_worker=built.any_worker,
          read_step=lambda: int(built.step.numpy()))
  finally:
    if offload is not None:
      offload.close()
  return Trained(summary=summary, call_lengths=sizer.describe(), xla=choice,
                 offload=offload and offload.describe())


def _replica_step(context: ProcessContext, model: tf.keras.Model,
                  jit_compile: bool):
  # A lone replica has no cross-replica update: XLA takes the whole step.
  lone_replica = context.replicas == 1 and not context.spec.multi_worker
  return accumulation.replica_step_fn(
      model, context.accumulation, context.examples_per_step,
      context.config.per_replica_batch(context.replicas), jit_compile,
      lone_replica)


def _runner_and_watcher(context: ProcessContext, built: Built,
                        restored: Restored, offload, clock: Stopwatch):
  """The step runner for this kind of training, as the XLA choice runs it,
  its preemption watcher, and that choice."""
  strategy, spec = context.strategy, context.spec
  dataset_fn = datasets.attempt_train_dataset_fn(
      context, restored.attempt, restored.start,
      serve=offload and offload.serve)

  def replica_step(jit: bool):
    return _replica_step(context, built.model, jit)

  def choose(probe, not_measured: str = '') -> xla.XlaChoice:
    return _choose_xla(context, built, restored.start, probe, clock,
                       not_measured)

  if spec.asynchronous:
    choice = choose(None)
    runner = step_runners.ParameterServerSteps(
        strategy, dataset_fn, replica_step(choice.enabled), built.step,
        context.train_steps)
    # Only the coordinator checkpoints: our own SIGTERM flag suffices.
    return (xla.with_choice(runner, choice),
            preemption.SigtermWatcher(built.save_now), choice)
  if built.pipeline_runner is None:
    choice = choose(lambda jit: xla.probe_runner(
        strategy, dataset_fn, replica_step, jit, spec.host_iterator_input))
    runner = step_runners.SynchronousSteps(
        strategy, dataset_fn, replica_step(choice.enabled), built.step,
        spec.host_iterator_input)
  else:
    choice = choose(None, 'pipeline stages')
    built.pipeline_runner.jit_compile_stages(choice.enabled)
    runner = step_runners.PipelineSteps(
        built.pipeline_runner, dataset_fn(tf.distribute.InputContext()),
        built.step)
  runner = xla.with_choice(runner, choice)
  if spec.lockstep_workers:
    return runner, preemption.MultiWorkerPreemptionWatcher(
        strategy, built.checkpoint, built.save_now), choice
  return runner, preemption.SigtermWatcher(built.save_now), choice


def _choose_xla(context: ProcessContext, built: Built, start: int, probe,
                clock: Stopwatch, not_measured: str) -> xla.XlaChoice:
  """The module's or the config's XLA setting; `auto`: the choice saved
  with the resumed checkpoint, else measured with `probe(jit)` (a step
  runner on probe batches), else off for `not_measured`."""
  spec = context.spec
  setting, source = xla.requested(built.model, context.config.xla)
  if setting != xla.OFF and not spec.xla:
    return xla.XlaChoice(False, source, (
        f'strategy {spec.name!r} keeps variables on other devices '
        'than its replicas, which XLA cannot read: trained without XLA'))
  if setting != xla.AUTO:
    return xla.fixed(setting, source)
  checkpointer = built.checkpointer
  recorded = checkpointer.restored_extra.get('xla') if start else None
  if recorded:
    choice = dataclasses.replace(xla.XlaChoice.from_dict(recorded),
                                 source='checkpoint')
  elif probe is None:
    choice = xla.XlaChoice(False, xla.AUTO, f'not measured: {not_measured}')
  else:
    with clock.timed('xla_probe_s'):
      choice = xla.measure_restoring(built.checkpoint, probe,
                                     built.all_workers)
  checkpointer.save_with_checkpoints('xla', recorded or choice.to_dict())
  return choice


# --- evaluation and export

def _local_copy(context: ProcessContext, built: Built) -> tf.keras.Model:
  """The trained model outside the strategy (parameter-server variables
  live on the ps tasks; eval and export run on the coordinator)."""
  with precision.building(built.precision.policy):
    model = built.module.build_model(context.task.hparams)
  model.set_weights(built.model.get_weights())
  return model


def evaluate_and_export(context: ProcessContext, built: Built,
                        restored: Restored, clock: Stopwatch) -> Evaluated:
  task = context.task
  if context.spec.asynchronous:
    model, strategy = _local_copy(context, built), tf.distribute.get_strategy()
  else:
    model, strategy = built.model, context.strategy
  with clock.timed('eval_s'):
    metrics = evaluation.evaluate(
        model, strategy, context.spec.lockstep_workers,
        datasets.eval_dataset_fn(context, restored.attempt),
        task.eval_steps, task.model_run_dir if context.is_chief else None,
        context.train_steps)
  with clock.timed('export_s'):
    export.export_trained_model(
        model, built.module, built.data.tf_transform_output,
        built.data.raw_label_key, task.serving_model_dir, context.is_chief)
  return Evaluated(metrics=metrics, exported=context.is_chief)


# --- report

def report(context: ProcessContext, built: Built, restored: Restored,
           trained: Trained, evaluated: Evaluated,
           clock: Stopwatch) -> training_result.LoopReport:
  """The loop's report: its step summary with what the phases chose,
  checked and saved (the resume events after this attempt's own)."""
  checkpointer, attempt = built.checkpointer, restored.attempt
  if trained.summary['preempted']:
    checkpointer.record_preempted(trained.summary['steps'])
  checkpointer.record_storage_retries()
  return training_result.LoopReport.of_steps(
      trained.summary, trained.call_lengths,
      examples_per_step=context.examples_per_step, timing=clock.seconds,
      eval=evaluated.metrics, exported=evaluated.exported,
      serving_model_dir=(context.task.serving_model_dir
                         if evaluated.exported else None),
      gradient_accumulation_steps=context.accumulation,
      precision=built.precision.to_dict(), xla=trained.xla.to_dict(),
      checkpoint_dir=context.task.checkpoint_dir,
      checkpoints_saved=checkpointer.saves,
      checkpoint_s=round(checkpointer.save_seconds, 4),
      resume_events=checkpointer.events,
      warm_start=restored.warm_start,
      shard_index=attempt.check.indexes,
      data_order=None if attempt.order is None else attempt.order.state(),
      input_pipeline=attempt.data.config.to_dict(),
      cache_fallback=attempt.cache_fallback,
      unreadable_records=attempt.check.unreadable,
      pipeline_parallel=_pipeline_parallel(built),
      offload=trained.offload,
      wall_s=round(time.monotonic() - clock.started, 3))


def _pipeline_parallel(built: Built) -> Optional[Dict[str, Any]]:
  if built.plan is None:
    return None
  stages = built.pipeline_runner
  return {
      'num_stages': built.plan.num_stages,
      'num_microbatches': stages.num_microbatches,
      'schedule': stages.schedule,
      'data_parallel_replicas': stages.data_parallel_replicas,
      'boundaries': list(built.plan.boundaries),
      'remat': built.plan.remat,
  }


NOT_EVALUATED = Evaluated(metrics={}, exported=False)


def run(context: ProcessContext) -> training_result.LoopReport:
  """Trains (resuming if a checkpoint exists), evaluates and exports.

  Returns the loop's report, which the process's entry makes part of the
  training result that the chief writes; `preempted` means training stopped
  at a checkpoint after SIGTERM: exit with `preemption.PREEMPTED_EXIT_CODE`
  and run again to resume.
  """
  with patches.installed(patches.AUTOGRAPH_SKIPS_TF_KERAS):
    return _phases(context)


def run_managed_training(task: TrainingTask, strategy: tf.distribute.Strategy
                        ) -> training_result.LoopReport:
  """`run` in a process that built `strategy` for `task` itself."""
  return run(ProcessContext.of_strategy(task, strategy))


def _phases(context: ProcessContext) -> training_result.LoopReport:
  clock = Stopwatch()
  built = build(context, clock)
  try:
    try:
      with clock.timed('restore_s'):
        restored = restore(context, built)
      with clock.timed('train_s'):
        trained = train(context, built, restored, clock)
    finally:
      built.checkpointer.close()
    if trained.summary['preempted']:
      return report(context, built, restored, trained, NOT_EVALUATED, clock)
    evaluated = evaluate_and_export(context, built, restored, clock)
    loop = report(context, built, restored, trained, evaluated, clock)
    if built.fault_tolerance.delete_after_export:
      built.checkpointer.delete_all()
    return loop
  finally:
    built.checkpointer.release()
