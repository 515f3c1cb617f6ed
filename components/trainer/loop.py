"""HighPerfTrainer's managed training loop: distribution-aware and resumable.

In managed mode the user module only builds a compiled model
(`build_model(hparams)`, `LABEL_KEY`, optional `RAW_LABEL_KEY` and
`serving_signatures(model, tf_transform_output)`); this loop owns the rest:
data (`input_pipeline.build_dataset`), the strategy, gradient accumulation,
checkpoints, preemption, evaluation, TensorBoard and export.

Exact resume is built in: the optimizer-step counter is a variable inside the
checkpoint, and the data position is derived from it (the dataset is a pure
function of files, config and seed, so a resumed run skips exactly the batches
the checkpointed steps consumed). Synchronous strategies therefore resume to
the same trajectory as an uninterrupted run. Parameter-server training is
asynchronous: it resumes the variables and the exact step count, while each
worker streams its own shuffled pass over the data (no global data order
exists to resume).

With a partition plan (GPipePartitioner) the model's stages live on their own
devices and every step runs the GPipe schedule (`partitioner.gpipe`) instead
of data-parallel replicas; checkpoints, resume, eval and export are the same.
"""

import dataclasses
import importlib
import importlib.util
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, Optional

from absl import logging
import tensorflow as tf

from components.pipeline_parallel import gpipe
from components.trainer import checkpointing
from components.trainer import export
from components.trainer import fn_args
from components.trainer import preemption
from components.trainer.config import DistributionConfig
from components.trainer.task import TrainingTask
from components.data import input_pipeline

# Seed of the data order; fixed so that every attempt replays the same order.
DATA_SEED = 20240611
# The chief records the last step reached (to count the steps a crash lost)
# in the background, at most this often: object stores throttle repeated
# writes to one object (about one per second on GCS).
PROGRESS_EVERY_SECONDS = 1.0
# Parameter-server steps scheduled between two joins (checkpoint and
# preemption checks happen at joins).
PS_STEPS_PER_JOIN = 50
# Batches each parameter-server worker shuffles over (its own order).
PS_SHUFFLE_BATCHES = 16
_PER_WORKER_SEED = object()


# ----------------------------------------------------------------- setup


def load_user_module(task: TrainingTask):
  """Imports the user module from `module_path` or `module_file`."""
  if task.module_path:
    return importlib.import_module(task.module_path)
  if not task.module_file:
    raise ValueError('The training task names no module_file or module_path.')
  path = task.module_file
  if not os.path.exists(path):  # gs://, hdfs://: copy it here first.
    local = os.path.join(tempfile.mkdtemp(prefix='hpm-module-'),
                         os.path.basename(path))
    tf.io.gfile.copy(path, local)
    path = local
  name = os.path.splitext(os.path.basename(path))[0]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@dataclasses.dataclass
class _Data:
  """How to parse the examples, and what to export with."""
  feature_spec: Dict[str, Any]
  label_key: str
  raw_label_key: Optional[str]
  config: input_pipeline.InputPipelineConfig
  tf_transform_output: Any  # tft.TFTransformOutput or None


def _data_for(task: TrainingTask, module) -> _Data:
  """Feature spec from the Transform output, else from the schema."""
  for name in ('build_model', 'LABEL_KEY'):
    if not hasattr(module, name):
      raise ValueError(f'Managed mode needs `{name}` in the module '
                       f'{module.__name__}; it does not define it.')
  feature_spec = fn_args.feature_spec(task)
  tf_transform_output = None
  if task.transform_output:
    import tensorflow_transform as tft  # pylint: disable=g-import-not-at-top
    tf_transform_output = tft.TFTransformOutput(task.transform_output)
  config = input_pipeline.InputPipelineConfig.from_dict(task.input_pipeline)
  if not config.deterministic:
    logging.warning('input_pipeline.deterministic is False: a resumed run '
                    'will not see exactly the examples an uninterrupted run '
                    'would have seen.')
  return _Data(feature_spec=feature_spec, label_key=module.LABEL_KEY,
               raw_label_key=getattr(module, 'RAW_LABEL_KEY', None),
               config=config, tf_transform_output=tf_transform_output)


def _rows(value, start, size: int):
  """Rows [start, start + size) of a dense, ragged or sparse batch."""
  if isinstance(value, tf.sparse.SparseTensor):
    rank = tf.shape(value.dense_shape)[0]
    begin = tf.concat([[tf.cast(start, tf.int64)],
                       tf.zeros([rank - 1], tf.int64)], 0)
    extent = tf.concat([[tf.constant(size, tf.int64)], value.dense_shape[1:]],
                       0)
    return tf.sparse.slice(value, begin, extent)
  return value[start:start + size]


def _per_example_loss(model: tf.keras.Model) -> Callable:
  """The compiled loss of `model`, one value per example (no reduction).

  Used instead of `model.compute_loss`, which also updates a loss metric:
  a cross-replica update that some strategies (central storage) cannot run
  inside the accumulation loop.
  """
  loss = model.loss
  if loss is None or isinstance(loss, (dict, list, tuple)):
    raise ValueError(
        f'Managed mode needs a model compiled with one loss; got loss={loss!r}.'
        ' Use one output with one loss, or a run_fn.')
  loss = tf.keras.losses.get(loss)
  if isinstance(loss, tf.keras.losses.Loss):
    loss = type(loss).from_config({**loss.get_config(), 'reduction': 'none'})

  def per_example(labels, predictions):
    # What Keras' compiled loss does before calling the loss.
    if labels.shape.rank == 1 and predictions.shape.rank == 2:
      labels = tf.expand_dims(labels, -1)
    if labels.dtype.is_floating and predictions.dtype.is_floating:
      labels = tf.cast(labels, predictions.dtype)
    return loss(labels, predictions)

  return per_example


def _clock_seed() -> tf.Tensor:
  """A seed read from the clock where the dataset is created (each worker).

  Not a random op: those need a fixed seed (the same on every worker) under
  `enable_op_determinism`.
  """
  return tf.cast(tf.timestamp() * 1e6, tf.int64) % (2**31 - 1)


def _num_workers(strategy: tf.distribute.Strategy) -> int:
  """Worker processes that read input (chief and workers of the cluster)."""
  resolver = getattr(strategy, 'cluster_resolver', None)
  jobs = resolver.cluster_spec().as_dict() if resolver else {}
  return max(1, len(jobs.get('worker', [])) + len(jobs.get('chief', [])))


def _is_chief(strategy: tf.distribute.Strategy) -> bool:
  return bool(strategy.extended.should_checkpoint)


def _strategy_kind(strategy: tf.distribute.Strategy) -> str:
  if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
    return 'parameter_server'
  if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return 'multi_worker_mirrored'
  return 'single_worker'


def _json_value(value):
  """Numpy / tensor scalars to plain Python for JSON."""
  if isinstance(value, dict):
    return {k: _json_value(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_json_value(v) for v in value]
  if hasattr(value, 'numpy'):
    value = value.numpy()
  if hasattr(value, 'item'):
    return value.item()
  return value


# ------------------------------------------------------------ the loop


class _ManagedTraining:
  """State shared by the synchronous and the parameter-server loops."""

  def __init__(self, task: TrainingTask, strategy: tf.distribute.Strategy):
    self.started = time.monotonic()
    self.task = task
    self.strategy = strategy
    self.kind = _strategy_kind(strategy)
    self.is_chief = _is_chief(strategy)
    self.module = load_user_module(task)
    self.data = _data_for(task, self.module)
    self.distribution = DistributionConfig.from_dict(task.distribution)
    self.fault_tolerance = checkpointing.CheckpointConfig.from_dict(
        task.fault_tolerance)
    self.accumulation = self.distribution.gradient_accumulation_steps
    self.replicas = strategy.num_replicas_in_sync
    self.global_batch = self.distribution.global_batch(self.replicas)
    self.plan = (gpipe.load_plan(task.partition_plan_uri)
                 if task.partition_plan_uri else None)
    if self.plan is not None:
      self._check_plan_fits()
    self.examples_per_step = self.global_batch * self.accumulation
    self.train_steps = self._train_steps()
    self.saves = 0
    self.save_seconds = 0.0
    self.last_save_step = -1
    self.last_save_path = None
    self.last_save_time = None  # Set when the training loop starts.
    self.writer = (tf.summary.create_file_writer(
        os.path.join(task.model_run_dir, 'train')) if self.is_chief else None)

  def _train_steps(self) -> int:
    if self.task.train_steps < 1:
      raise ValueError(
          f'train_steps={self.task.train_steps} must be >= 1; '
          'worker.resolve_lengths turns train_epochs into steps first.')
    return int(self.task.train_steps)

  def _check_plan_fits(self) -> None:
    """GPipe replaces data parallelism and accumulates micro-batches itself."""
    if self.replicas != 1 or self.kind == 'parameter_server':
      raise ValueError(
          f'A partition plan runs the model across devices itself; it needs a '
          f'single-replica strategy (one_device), not {self.kind!r} with '
          f'{self.replicas} replicas.')
    if self.accumulation != 1:
      raise ValueError(
          f'gradient_accumulation_steps={self.accumulation} with a partition '
          'plan: GPipe already accumulates over the plan\'s micro-batches; '
          'use 1.')
    if self.global_batch != self.plan['batch_size']:
      raise ValueError(
          f'The global batch {self.global_batch} differs from the partition '
          f"plan's batch_size {self.plan['batch_size']}; set "
          'per_replica_batch_size to the batch the plan was made for.')

  # --- model and checkpoint

  def _build_pipelined_model(self) -> tf.keras.Model:
    """The model with each stage's variables on its own device."""
    devices = gpipe.stage_devices(self.plan['num_stages'])
    model = gpipe.build_model_on_devices(
        lambda: self.module.build_model(self.task.hparams), self.plan, devices)
    self.gpipe_runner = gpipe.GPipeRunner(model, self.plan, devices)
    return model

  def build_model(self) -> None:
    """Model, optimizer slots and the step counter, in the strategy scope."""
    self.gpipe_runner = None
    # GPipe places every stage itself, so it builds outside the strategy.
    scope = (self.strategy.scope() if self.plan is None else
             tf.distribute.get_strategy().scope())
    with scope:
      self.model = (self.module.build_model(self.task.hparams)
                    if self.plan is None else self._build_pipelined_model())
      if not self.model.built:
        self.model(self._sample_features(), training=False)
      self.step = tf.Variable(
          0, dtype=tf.int64, trainable=False, name='global_step',
          aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
      if hasattr(self.model.optimizer, 'build'):
        # Slots must exist before restore, or they would restore lazily.
        self.model.optimizer.build(self.model.trainable_variables)
    self.checkpoint = tf.train.Checkpoint(model=self.model,
                                          optimizer=self.model.optimizer,
                                          step=self.step)
    self.store = checkpointing.CheckpointStore(
        self.task.checkpoint_dir, self.checkpoint,
        keep_last=self.fault_tolerance.keep_last, is_chief=self.is_chief)
    self.progress = checkpointing.ProgressMarker(self.store,
                                                 PROGRESS_EVERY_SECONDS)

  def _sample_features(self):
    """One small batch of features, to build a subclassed model."""
    dataset = input_pipeline.build_dataset(
        self.task.train_files, self.data.feature_spec, self.data.label_key,
        batch_size=1, config=self.data.config, shuffle=False)
    features, _ = next(iter(dataset))
    return features

  def restore(self) -> int:
    """Restores the newest valid checkpoint; records why we start where."""
    progress = self.store.read_progress()
    restored = self.store.restore_latest()
    reached = progress['step'] if progress else None
    if restored:
      event = {'event': 'resumed', 'from_step': restored.step,
               'checkpoint': restored.path,
               'skipped_checkpoints': restored.skipped}
      if reached is not None:
        event['steps_lost'] = max(0, reached - restored.step)
      logging.warning('Resuming from step %d (%s); %s step(s) lost.',
                      restored.step, restored.path,
                      event.get('steps_lost', 'unknown'))
    elif reached:
      event = {'event': 'restarted', 'from_step': 0, 'steps_lost': reached,
               'skipped_checkpoints': [],
               'reason': 'no usable checkpoint from the previous attempt'}
      logging.warning('Restarting from step 0: the previous attempt reached '
                      'step %d but left no usable checkpoint.', reached)
    else:
      others = self.store.other_fingerprints()
      if not others:
        self.events = self.store.read_events()
        return 0
      event = {'event': 'fresh_start', 'from_step': 0,
               'reason': ('the inputs or the training config changed: no '
                          'checkpoint for this fingerprint, but for '
                          f'{others}')}
      logging.warning('Starting fresh in %s: %s', self.task.checkpoint_dir,
                      event['reason'])
    event['time'] = time.time()
    self.events = self.store.append_event(event)
    return restored.step if restored else 0

  def save(self, step: int) -> str:
    began = time.monotonic()
    path = self.store.save(step, extra={
        'examples_per_step': self.examples_per_step, 'strategy': self.kind})
    self.progress.update(step)
    self.saves += 1
    self.save_seconds += time.monotonic() - began
    self.last_save_step = step
    self.last_save_path = path
    self.last_save_time = time.monotonic()
    logging.info('Checkpoint at step %d: %s', step, path)
    return path

  def due_by_steps(self, step: int) -> bool:
    every = self.fault_tolerance.save_every_steps
    return bool(every) and step % every == 0

  def due_by_time(self) -> bool:
    every = self.fault_tolerance.save_every_seconds
    return bool(every) and time.monotonic() - self.last_save_time >= every

  def record_progress(self, step: int, loss: float) -> None:
    self.progress.update(step)
    log_every = max(1, self.train_steps // 100)
    if self.writer and step % log_every == 0:
      with self.writer.as_default():
        tf.summary.scalar('loss', loss, step=step)
    if step % max(1, self.train_steps // 10) == 0:
      logging.info('Step %d/%d: loss %.5f', step, self.train_steps, loss)

  # --- the replica step

  def replica_step_fn(self) -> Callable:
    """One optimizer update from one (possibly k-times larger) batch.

    With k accumulation micro-steps the batch is split into k micro-batches
    whose gradients are summed in a loop (activations of one micro-batch at a
    time) before a single update. Every loss term is a sum over examples
    divided by the examples of the whole update (all replicas, all
    micro-steps), so the update equals the one from the k-times larger batch.
    """
    model = self.model
    accumulation = self.accumulation
    examples_per_step = self.examples_per_step
    micro_batch = self.distribution.per_replica_batch(self.replicas)
    per_example_loss = _per_example_loss(model)

    # Autograph would convert all of tf_keras (seconds of tracing); Keras
    # converts the layers' `call`s itself where needed.
    @tf.autograph.experimental.do_not_convert
    def loss_and_gradients(features, labels):
      with tf.GradientTape() as tape:
        predictions = model(features, training=True)
        loss = tf.nn.compute_average_loss(
            per_example_loss(labels, predictions),
            global_batch_size=examples_per_step)
        if model.losses:
          loss += tf.nn.scale_regularization_loss(
              tf.add_n(model.losses)) / accumulation
      return loss, tape.gradient(loss, model.trainable_variables)

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(gradients):
      model.optimizer.apply_gradients(zip(gradients,
                                          model.trainable_variables))

    def replica_step(batch):
      features, labels = batch
      if accumulation == 1:
        loss, gradients = loss_and_gradients(features, labels)
      else:
        loss = tf.constant(0.0)
        gradients = [tf.zeros_like(v) for v in model.trainable_variables]
        for i in tf.range(accumulation):
          micro_features, micro_labels = tf.nest.map_structure(
              lambda t: _rows(t, i * micro_batch, micro_batch),
              (features, labels))
          micro_loss, micro_gradients = loss_and_gradients(micro_features,
                                                           micro_labels)
          loss += micro_loss
          gradients = [g + tf.convert_to_tensor(m)
                       for g, m in zip(gradients, micro_gradients)]
      apply_gradients(gradients)
      return loss

    return replica_step

  def train_dataset_fn(self, start_step: int, seed,
                       config: input_pipeline.InputPipelineConfig):
    """`seed`: an int, or `_PER_WORKER_SEED` for a new seed per dataset."""
    def dataset_fn(input_context: tf.distribute.InputContext):
      # Each step takes one batch per replica from its input pipeline.
      batches_per_step = (input_context.num_replicas_in_sync //
                          input_context.num_input_pipelines)
      return input_pipeline.build_dataset(
          self.task.train_files, self.data.feature_spec, self.data.label_key,
          batch_size=self.examples_per_step, config=config,
          seed=_clock_seed() if seed is _PER_WORKER_SEED else seed,
          input_context=input_context,
          skip_batches=start_step * batches_per_step)
    return dataset_fn

  # --- synchronous strategies

  def train_synchronous(self, start: int) -> Dict[str, Any]:
    dataset_fn = self.train_dataset_fn(start, DATA_SEED, self.data.config)
    strategy, step = self.strategy, self.step
    if self.gpipe_runner is None:
      iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
      replica_step = self.replica_step_fn()

      @tf.function
      def train_step(iterator):
        losses = strategy.run(replica_step, args=(next(iterator),))
        step.assign_add(1)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)
    else:
      iterator = iter(dataset_fn(tf.distribute.InputContext()))
      runner = self.gpipe_runner

      def train_step(iterator):
        # The runner's step is one tf.function holding the GPipe schedule.
        loss = runner.train_step(*next(iterator))
        step.assign_add(1)
        return loss

    @tf.function
    def any_worker(flag):
      flags = strategy.run(lambda f: f, args=(flag,))
      return strategy.reduce(tf.distribute.ReduceOp.SUM, flags, axis=None) > 0

    # Workers must agree on time-based saves (saving runs collectives).
    def due_by_time() -> bool:
      due = self.due_by_time()
      if self.kind == 'multi_worker_mirrored':
        due = bool(any_worker(tf.constant(int(due))))
      return due

    watcher = preemption.make_watcher(
        strategy, self.checkpoint, lambda: self.save(int(self.step.numpy())))
    stats = _StepStats(start)
    self.last_save_time = time.monotonic()
    try:
      current, loss = start, float('nan')
      while current < self.train_steps:
        loss = float(watcher.run(train_step, iterator))
        current += 1
        stats.step_done()
        if self.due_by_steps(current) or (
            self.fault_tolerance.save_every_seconds and due_by_time()):
          self.save(current)
        self.record_progress(current, loss)
    except preemption.Preempted:
      return stats.summary(int(self.step.numpy()), loss, preempted=True)
    finally:
      watcher.close()
    if self.last_save_step != current and current > start:
      self.save(current)  # A crash during eval or export costs no training.
    return stats.summary(current, loss, preempted=False)

  # --- parameter servers

  def train_parameter_server(self, start: int) -> Dict[str, Any]:
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(
        self.strategy)
    # Workers share no data order: each streams its own shuffle of the data,
    # seeded when its dataset is created (again after a worker restart).
    config = dataclasses.replace(
        self.data.config, shuffle_buffer_batches=max(
            PS_SHUFFLE_BATCHES, self.data.config.shuffle_buffer_batches))
    dataset_fn = self.train_dataset_fn(0, _PER_WORKER_SEED, config)
    strategy, step, train_steps = self.strategy, self.step, self.train_steps
    per_worker_dataset = coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(dataset_fn))
    iterator = iter(per_worker_dataset)
    replica_step = self.replica_step_fn()

    @tf.function
    def worker_step(iterator):
      # A closure may run twice (retried after a worker loss); the guard
      # keeps the number of updates exact.
      if step < train_steps:
        loss = strategy.run(replica_step, args=(next(iterator),))
        step.assign_add(1)
        return loss
      return tf.constant(0.0)

    watcher = preemption.SigtermWatcher(
        lambda: self.save(int(self.step.numpy())))
    stats = _StepStats(start)
    self.last_save_time = time.monotonic()
    current, loss = start, float('nan')
    try:
      while current < train_steps:
        chunk = min(train_steps - current, PS_STEPS_PER_JOIN,
                    self.fault_tolerance.save_every_steps or train_steps)
        results = [coordinator.schedule(worker_step, args=(iterator,))
                   for _ in range(chunk)]
        coordinator.join()
        loss = float(results[-1].fetch())
        previous, current = current, int(self.step.numpy())
        stats.steps_done(current - previous)
        watcher.save_if_requested()
        every = self.fault_tolerance.save_every_steps
        if (every and current // every > previous // every) or (
            self.due_by_time()):
          self.save(current)
        self.record_progress(current, loss)
    except preemption.Preempted:
      return stats.summary(current, loss, preempted=True)
    finally:
      watcher.close()
    if self.last_save_step != current and current > start:
      self.save(current)
    return stats.summary(current, loss, preempted=False)

  # --- evaluation and export

  def eval_dataset(self) -> Optional[tf.data.Dataset]:
    if not self.task.eval_steps or not self.task.eval_files:
      return None
    dataset = input_pipeline.build_dataset(
        self.task.eval_files, self.data.feature_spec, self.data.label_key,
        batch_size=self.global_batch, config=self.data.config, shuffle=False,
        seed=DATA_SEED)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        fn_args.auto_shard_policy(
            len(input_pipeline.list_files(self.task.eval_files)),
            _num_workers(self.strategy)))
    return dataset.with_options(options)

  def evaluate(self, model: tf.keras.Model,
               strategy: tf.distribute.Strategy) -> Dict[str, float]:
    """The compiled loss and metrics over `eval_steps` batches.

    `model.test_step` in our own tf.function rather than `model.evaluate`:
    TF 2.16's autograph does not skip tf_keras (only `keras`), and converting
    it makes every Keras-traced function take seconds to build.
    """
    dataset = self.eval_dataset()
    if dataset is None:
      return {}
    iterator = iter(strategy.experimental_distribute_dataset(dataset))
    test_step = tf.autograph.experimental.do_not_convert(model.test_step)

    @tf.function
    def eval_step(iterator):
      strategy.run(test_step, args=(next(iterator),))

    model.reset_metrics()
    with strategy.scope():
      for _ in range(self.task.eval_steps):
        eval_step(iterator)
    metrics = {name: float(value)
               for name, value in model.get_metrics_result().items()}
    if self.is_chief:
      writer = tf.summary.create_file_writer(
          os.path.join(self.task.model_run_dir, 'eval'))
      with writer.as_default():
        for name, value in metrics.items():
          tf.summary.scalar(name, value, step=self.train_steps)
      writer.flush()
    return metrics

  def export(self, model: tf.keras.Model) -> None:
    """The chief exports; MWMS workers take part in the save collectives."""
    export_dir = self.task.serving_model_dir
    if not self.is_chief:
      export_dir = tempfile.mkdtemp(prefix='hpm-nonchief-export-')
    try:
      tft_output = self.data.tf_transform_output
      if hasattr(self.module, 'serving_signatures'):
        signatures = self.module.serving_signatures(model, tft_output)
        tf.saved_model.save(model, export_dir, signatures=signatures)
      elif tft_output is not None:
        export.export_saved_model(model, tft_output, self.data.raw_label_key,
                                  export_dir)
      else:
        tf.saved_model.save(model, export_dir)
    finally:
      if not self.is_chief:
        shutil.rmtree(export_dir, ignore_errors=True)

  def local_copy(self) -> tf.keras.Model:
    """The trained model outside the strategy (parameter-server variables
    live on the ps tasks; eval and export run on the coordinator)."""
    model = self.module.build_model(self.task.hparams)
    model.set_weights(self.model.get_weights())
    return model

  def result(self, summary: Dict[str, Any], eval_metrics: Dict[str, float],
             exported: bool) -> Dict[str, Any]:
    if summary['preempted']:
      self.events = self.store.append_event({
          'event': 'preempted', 'at_step': summary['steps'],
          'checkpoint': self.last_save_path, 'time': time.time()})
    result = dict(summary)
    result['examples_per_sec'] = round(
        result.pop('steps_per_sec') * self.examples_per_step, 2)
    result.update({
        'train_steps': self.train_steps,
        'eval': eval_metrics,
        'exported': exported,
        'serving_model_dir': self.task.serving_model_dir if exported else None,
        'strategy': type(self.strategy).__name__,
        'num_replicas': self.replicas,
        'global_batch_size': self.global_batch,
        'gradient_accumulation_steps': self.accumulation,
        'examples_per_step': self.examples_per_step,
        'checkpoint_dir': self.task.checkpoint_dir,
        'checkpoints_saved': self.saves,
        'checkpoint_seconds': round(self.save_seconds, 4),
        'resume_events': self.events,
        'wall_seconds': round(time.monotonic() - self.started, 3),
        'pipeline_parallel': None if self.plan is None else {
            'num_stages': self.plan['num_stages'],
            'num_microbatches': self.gpipe_runner.num_microbatches,
            'boundaries': self.plan['boundaries'],
            'remat': self.plan['remat'],
        },
    })
    return _json_value(result)


class _StepStats:
  """Steps of this attempt and their steady rate (after the first step, which
  includes tracing; the periodic checkpoint waits are included).

  Where all steps ended at once (one parameter-server join), there is no
  steady part: the rate then spans the whole attempt, tracing included, and
  `rate_includes_first_step` says so.
  """

  def __init__(self, start_step: int):
    self.start_step = start_step
    self.steps = 0
    self.began = time.monotonic()
    self.first_step_seconds = None
    self.first_step_time = None
    self.first = None  # (monotonic time, steps) when the first step ended.
    self.last = None

  def step_done(self) -> None:
    self.steps_done(1)

  def steps_done(self, count: int) -> None:
    if not count:
      return
    self.steps += count
    now = time.monotonic()
    if self.first is None:
      self.first_step_seconds = now - self.began
      self.first_step_time = time.time()
      self.first = (now, self.steps)
    self.last = (now, self.steps)

  def summary(self, step: int, loss: float, preempted: bool) -> Dict[str, Any]:
    steps_per_sec, whole_attempt = 0.0, False
    if self.first and self.last[1] > self.first[1]:
      steps_per_sec = (self.last[1] - self.first[1]) / max(
          self.last[0] - self.first[0], 1e-9)
    elif self.first:
      steps_per_sec = self.steps / max(self.first[0] - self.began, 1e-9)
      whole_attempt = True
    return {'steps': step, 'start_step': self.start_step,
            'steps_this_attempt': self.steps, 'train_loss': loss,
            'first_step_seconds': self.first_step_seconds,
            'first_step_time': self.first_step_time,
            'steps_per_sec': steps_per_sec,
            'rate_includes_first_step': whole_attempt,
            'preempted': preempted}


def skip_autograph_for_tf_keras() -> None:
  """Makes autograph leave tf_keras alone, as it does for `keras`.

  TF 2.16's conversion rules skip the `keras` package but not `tf_keras`, so
  with TF_USE_LEGACY_KERAS every function tracing Keras code (model calls,
  metrics, SavedModel export) converts all of tf_keras: about ten seconds
  per function on a small model instead of under one. Keras converts user
  layers' `call` itself, so user code keeps autograph. The rules live in a
  private module; if it moves, this does nothing and only speed suffers.
  """
  try:
    # pylint: disable=g-import-not-at-top
    from tensorflow.python.autograph.core import config as autograph_config
    from tensorflow.python.autograph.core import config_lib
    # pylint: enable=g-import-not-at-top
    rules = tuple(autograph_config.CONVERSION_RULES)
    if not any(isinstance(r, config_lib.DoNotConvert) and r.matches('tf_keras')
               for r in rules):
      autograph_config.CONVERSION_RULES = (
          (config_lib.DoNotConvert('tf_keras'),) + rules)
  except (ImportError, AttributeError) as e:
    logging.info('Autograph rules not adjusted for tf_keras: %s', e)


def run_managed_training(task: TrainingTask,
                         strategy: tf.distribute.Strategy) -> Dict[str, Any]:
  """Trains (resuming if a checkpoint exists), evaluates and exports.

  Returns the JSON-serializable result (the worker's chief writes it, with
  what it adds, to `<model_run_dir>/training_result.json`); `preempted: true`
  means training stopped at a checkpoint after SIGTERM: exit with
  `preemption.PREEMPTED_EXIT_CODE` and run again to resume.
  """
  skip_autograph_for_tf_keras()
  training = _ManagedTraining(task, strategy)
  training.build_model()
  try:
    start = training.restore()
    if training.kind == 'parameter_server':
      summary = training.train_parameter_server(start)
    else:
      summary = training.train_synchronous(start)
  finally:
    training.progress.close()
  if summary['preempted']:
    return training.result(summary, {}, exported=False)
  if training.kind == 'parameter_server':
    model, model_strategy = training.local_copy(), tf.distribute.get_strategy()
  else:
    model, model_strategy = training.model, strategy
  eval_metrics = training.evaluate(model, model_strategy)
  training.export(model)
  result = training.result(summary, eval_metrics, exported=training.is_chief)
  if training.fault_tolerance.delete_after_export:
    training.store.delete_all()
  return result
