"""Pipeline-parallel training (GPipe or 1F1B) of a Keras model from a plan.

Integration API (what a training loop such as HighPerfTrainer's calls):

    from components.devices import configure_logical_cpus
    from components.pipeline_parallel import placement, runner
    from components.records import partition_plan

    plan = partition_plan.read(partition_plan_artifact.uri)
    # A device per stage of each data-parallel copy of the pipeline.
    # CPU only, at process start, before TensorFlow initializes its devices:
    configure_logical_cpus(plan.num_devices)
    devices = placement.stage_devices(plan.num_devices)
    model = placement.build_model_on_devices(
        lambda: module.build_model(hparams), plan, devices)
    pipeline = runner.PipelineRunner(model, plan, devices)
    for features, labels in dataset:  # mini-batches of plan.batch_size
      loss = pipeline.train_step(features, labels)
    # `model` is the ordinary Keras model (its variables merely live on the
    # stage devices), so it exports as a normal SavedModel. The runner does
    # its own data parallelism (the plan's data_parallel_replicas): use the
    # default strategy, not Mirrored/MultiWorker.

`PipelineRunner.gradients(features, labels)` returns (loss, gradients aligned
with `model.trainable_variables`) without updating, for checks against
single-device training.

One step is one tf.function holding the plan's whole schedule
(`schedules`): M micro-batches, stage s on device s in the schedule's order
(control dependencies per device, dataflow between stages), gradients
summed on each stage's device and applied in one update. With
`data_parallel_replicas` R, R pipeline copies each take 1/R of the batch,
read the variables from copy 0's devices and add their gradient sums there
before the update, so the step equals one device on the whole batch.
Re-materialized micro-batches stash only a stage's inputs and rerun its
forward inside its backward. Under a LossScaleOptimizer (float16) the last
stage's backward starts from the scaled loss and the summed gradients are
unscaled once; the optimizer skips a non-finite update.

Limitations: random layers (Dropout) draw new randomness when recomputed;
BatchNormalization normalizes per micro-batch; Keras masks do not cross
stages (rejected by graph.LayerGraph); the step is traced without AutoGraph,
so custom layers must use tf.cond/tf.while_loop rather than Python control
flow on tensors (Keras's built-in layers do).
"""

import dataclasses
from typing import Any, List, Mapping, Sequence, Set, Tuple, Union

import tensorflow as tf

from components.pipeline_parallel import graph as graph_lib
from components.pipeline_parallel import schedules
from components.pipeline_parallel import stage as stage_lib
from components.records.partition_plan import PlanRecord

HOST_DEVICE = '/device:CPU:0'


def _kept_activations(orders, remat: str) -> Set[Tuple[int, int]]:
  """(stage, micro-batch) whose forward keeps its activations for the
  backward instead of re-materializing them."""
  return {
      (s, m) for s, order in enumerate(orders)
      for (phase, m), follows in zip(order, schedules.backward_follows(order))
      if phase == schedules.FORWARD and (
          remat == 'never' or (remat == 'except_last' and follows))}


def _gradient_accumulators(replica_stages) -> List[List[List[tf.Variable]]]:
  """Per replica and stage, a zero variable per stage variable, on the
  stage's device.

  Gradients are summed across micro-batches in variables: grappler would
  turn a chain of tensor adds into one AddN that keeps every micro-batch's
  gradients alive at the same time.
  """
  accumulators = []
  for r, replica in enumerate(replica_stages):
    accumulators.append([])
    for stage in replica:
      with tf.device(stage.device):
        accumulators[r].append([
            tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                        name=f'pipeline_replica{r}_stage{stage.index}_'
                        'gradient_sum')
            for v in stage.variables])
  return accumulators


class PipelineRunner:
  """Runs the schedule of `plan` (GPipe or 1F1B) for `model` on `devices`."""

  def __init__(self, model: tf.keras.Model,
               plan: Union[PlanRecord, Mapping[str, Any]],
               devices: Sequence[str], host_device: str = HOST_DEVICE):
    if getattr(model, 'optimizer', None) is None or not getattr(
        model, 'compiled_loss', None):
      raise ValueError('PipelineRunner needs a model compiled with a loss '
                       'and an optimizer.')
    plan = PlanRecord.from_dict(plan)
    num_stages = plan.num_stages
    self._replicas = plan.data_parallel_replicas
    if len(devices) != plan.num_devices:
      raise ValueError(
          f'the plan has {num_stages} stages x {self._replicas} data-parallel '
          f'replicas but {len(devices)} devices were given: {list(devices)}.')
    self.model = model
    self._graph = graph_lib.LayerGraph(model)
    plan.check_layer_signature(self._graph.class_names())
    self._num_microbatches = plan.num_microbatches
    self._schedule = plan.schedule
    self._remat = plan.remat
    self._orders = schedules.stage_orders(self._schedule, num_stages,
                                          self._num_microbatches)
    self._kept = _kept_activations(self._orders, self._remat)
    self._offload = plan.offload_activations
    self._host = host_device
    self._step = stage_lib.StageStep(model, self._graph,
                                     self._num_microbatches * self._replicas)
    stages = stage_lib.build_stages(self._graph, plan, devices)
    # Replica r runs stage s on devices[r * K + s]; the variables live on
    # replica 0's stage devices, and every replica reads them from there.
    self.replica_stages = tuple(
        tuple(dataclasses.replace(stage, device=devices[r * num_stages + s])
              for s, stage in enumerate(stages))
        for r in range(self._replicas))
    self.stages = self.replica_stages[0]
    self._accumulators = _gradient_accumulators(self.replica_stages)
    # The schedule is plain Python loops over stages and micro-batches;
    # AutoGraph would only add tracing time (16 of 17 s for a small model).
    self._gradients_fn = tf.function(self._loss_and_gradients,
                                     autograph=False)
    self._train_fn = tf.function(self._train_step, autograph=False)

  @property
  def num_microbatches(self) -> int:
    return self._num_microbatches

  @property
  def schedule(self) -> str:
    return self._schedule

  @property
  def data_parallel_replicas(self) -> int:
    return self._replicas

  def jit_compile_stages(self, enabled: bool) -> None:
    """Each stage's layers as one XLA computation (before the first step)."""
    self._step.jit_compile(enabled)

  def gradients(self, features, labels):
    """(mean loss, gradients aligned with model.trainable_variables)."""
    return self._gradients_fn(features, labels)

  def train_step(self, features, labels) -> tf.Tensor:
    """One step: M micro-batches, one optimizer update; the loss."""
    return self._train_fn(features, labels)

  def _train_step(self, features, labels):
    loss, grads = self._loss_and_gradients(features, labels)
    self.model.optimizer.apply_gradients(
        zip(grads, self.model.trainable_variables))
    return loss

  def _split(self, features, labels):
    """Model inputs and labels cut into R x M equal micro-batches on the
    host: replica r gets pieces r*M .. r*M + M-1."""
    m = self._num_microbatches * self._replicas
    with tf.device(self._host):
      inputs = self._graph.feed(features)
      batch = next(iter(inputs.values())).shape[0]
      if batch is not None and batch % m:
        raise ValueError(
            f'batch size {batch} is not divisible by the '
            f'{self._num_microbatches} micro-batches x {self._replicas} '
            'data-parallel replicas of the partition plan.')
      pieces = {name: tf.split(value, m) for name, value in inputs.items()}
      label_pieces = [tf.split(y, m) for y in tf.nest.flatten(labels)]
    micro_inputs = [{name: parts[i] for name, parts in pieces.items()}
                    for i in range(m)]
    micro_labels = [
        tf.nest.pack_sequence_as(labels, [parts[i] for parts in label_pieces])
        for i in range(m)
    ]
    return micro_inputs, micro_labels

  def _loss_and_gradients(self, features, labels):
    micro_inputs, micro_labels = self._split(features, labels)
    local_losses = []
    for r, replica in enumerate(self.replica_stages):
      first = r * self._num_microbatches
      local_losses += self._run_schedule(
          replica, self._accumulators[r],
          micro_inputs[first:first + self._num_microbatches],
          micro_labels[first:first + self._num_microbatches], r)
    with tf.device(self._host):
      loss = tf.add_n(local_losses)
    # The all-reduce: each variable's gradient is the sum of its stages'
    # (shared layers) and replicas' accumulators, on the variable's device.
    # Automatic control dependencies read each sum after its last update.
    sums = {}
    for replica, replica_accumulators in zip(self.replica_stages,
                                             self._accumulators):
      for stage, accumulators in zip(replica, replica_accumulators):
        for variable, accumulator in zip(stage.variables, accumulators):
          sums.setdefault(id(variable), []).append(accumulator.read_value())
    grads = []
    for v in self.model.trainable_variables:
      with tf.device(v.device):
        grads.append(tf.add_n(sums[id(v)]) if id(v) in sums else
                     tf.zeros_like(v))
    optimizer = self.model.optimizer
    if isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer):
      # The stages' backward passes started from the scaled loss.
      grads = optimizer.get_unscaled_gradients(grads)
    return loss, grads

  def _run_schedule(self, stages, accumulators, micro_inputs, micro_labels,
                    replica: int) -> List[tf.Tensor]:
    """One pipeline copy's schedule; returns its loss shares."""
    # Each device's latest task results: orders its next task after them.
    last_task = [[] for _ in stages]
    sent = {}  # (stage, m) -> forward outputs.
    sent_grads = {}  # (stage, m) -> gradients for its received tensors.
    stashed = {}
    local_losses = []
    first_backward = [True] * len(stages)
    for s, phase, m in schedules.execution_order(self._orders):
      stage = stages[s]
      with tf.name_scope(
          f'pipeline/replica{replica}/stage{s}/microbatch{m}/{phase}'), \
          tf.device(stage.device), \
          tf.control_dependencies(last_task[s]):
        if phase == schedules.FORWARD:
          received = micro_inputs[m] if s == 0 else sent.pop((s - 1, m))
          inputs = {n: tf.identity(received[n]) for n in stage.inputs}
          if (s, m) in self._kept:
            with tf.GradientTape() as tape:
              tape.watch([inputs[n] for n in stage.grad_inputs])
              outputs, local = self._step.forward(stage, inputs,
                                                  micro_labels[m], True)
            stashed[(m, s)] = stage_lib.Stash(inputs, tape, outputs, local)
          else:
            outputs, _ = self._step.forward(stage, inputs, micro_labels[m],
                                            False)
            stashed[(m, s)] = stage_lib.Stash(stage_lib.stash_inputs(
                inputs, self._host if self._offload else None))
          sent[(s, m)] = outputs
          last_task[s] = list(outputs.values())
          continue
        upstream = sent_grads.pop((s + 1, m), {})
        input_grads, stage_grads, loss_share = self._step.backward(
            stage, stashed.pop((m, s)), upstream, micro_labels[m])
        # The device's next task waits for these sums: otherwise, on a busy
        # machine, several micro-batches' gradients wait for their adds at
        # once and the peak depends on the scheduler.
        sums = [
            (accumulator.assign if first_backward[s] else
             accumulator.assign_add)(grad, read_value=False)
            for accumulator, grad in zip(accumulators[s], stage_grads)]
        first_backward[s] = False
        if loss_share is not None:
          local_losses.append(loss_share)
        sent_grads[(s, m)] = input_grads
        last_task[s] = [*sums, *input_grads.values()]
    return local_losses
