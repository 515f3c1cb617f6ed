"""One pipeline stage: its layers, what it sends and receives, and one
micro-batch's forward and backward through it."""

import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence

import tensorflow as tf

from components.pipeline_parallel import graph as graph_lib
from components.records.partition_plan import PlanRecord


@dataclasses.dataclass(frozen=True)
class Stage:
  index: int
  start: int
  end: int
  device: str
  inputs: tuple  # Tensors received: live across the stage's first cut.
  outputs: tuple  # Tensors sent on: live across its last cut.
  grad_inputs: tuple  # Received tensors that need a gradient sent back.
  variables: tuple  # Trainable variables of its layers.
  loss_layers: tuple  # Layers whose `losses` this stage adds.
  is_last: bool


@dataclasses.dataclass
class Stash:
  """What a stage keeps between a micro-batch's forward and backward."""
  inputs: Dict[str, tf.Tensor]  # On the stage or the host device.
  tape: Optional[tf.GradientTape] = None  # Set when activations are kept.
  outputs: Optional[Dict[str, tf.Tensor]] = None
  local_loss: Optional[tf.Tensor] = None


def build_stages(graph: graph_lib.LayerGraph, plan: PlanRecord,
                 devices: Sequence[str]) -> List[Stage]:
  """The plan's stages of `graph`, stage s on devices[s]."""
  produced = {name for call in graph.calls for name in call.outputs}
  needs_grad = {name for name in produced if graph.is_differentiable(name)}
  stages = []
  seen_layers = set()
  for s, (start, end) in enumerate(plan.stage_spans):
    layers = graph.layers(start, end)
    inputs = graph.live(start)
    stages.append(Stage(
        index=s,
        start=start,
        end=end,
        device=devices[s],
        inputs=inputs,
        outputs=graph.live(end),
        grad_inputs=tuple(name for name in inputs if name in needs_grad),
        variables=tuple(graph_lib.unique_variables(
            [v for layer in layers for v in layer.trainable_weights])),
        loss_layers=tuple(layer for layer in layers
                          if id(layer) not in seen_layers),
        is_last=s == plan.num_stages - 1))
    seen_layers.update(id(layer) for layer in layers)
  return stages


def stash_inputs(inputs: Dict[str, tf.Tensor], host_device: Optional[str]
                 ) -> Dict[str, tf.Tensor]:
  """The stage inputs a re-materialized backward reruns from; copied to
  `host_device` (offloaded) unless it is None."""
  if host_device is None:
    return inputs
  with tf.device(host_device):
    return {name: tf.identity(value) for name, value in inputs.items()}


def loss_scale(optimizer) -> tf.Tensor:
  """What the loss is multiplied by before its gradients: a
  LossScaleOptimizer's current scale (float16), else 1."""
  if isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer):
    return optimizer.loss_scale
  return tf.constant(1.0)


class StageStep:
  """Forward and backward of one micro-batch through one stage of `model`."""

  def __init__(self, model: tf.keras.Model, graph: graph_lib.LayerGraph,
               loss_scale: int):
    self._model = model
    self._graph = graph
    # Micro-batches x replicas: the loss shares sum to the mini-batch mean.
    self._loss_scale = loss_scale
    # Stage index -> its layers as one XLA computation (`jit_compile`).
    self._compiled = None

  def jit_compile(self, enabled: bool) -> None:
    """Runs each stage's layers as one XLA computation on its device (the
    schedule between stages stays TensorFlow's)."""
    self._compiled = {} if enabled else None

  def _run(self, stage: Stage, inputs):
    if self._compiled is None:
      return self._graph.run(inputs, stage.start, stage.end, training=True)
    if stage.index not in self._compiled:
      self._compiled[stage.index] = tf.function(
          lambda values: self._graph.run(values, stage.start, stage.end,
                                         training=True),
          jit_compile=True, autograph=False)
    return self._compiled[stage.index](inputs)

  def forward(self, stage: Stage, inputs, labels, with_loss: bool):
    """The stage's outputs and, if asked, its share of the loss."""
    values = self._run(stage, inputs)
    outputs = {name: values[name] for name in stage.outputs}
    if not with_loss:
      return outputs, None
    losses = [loss for layer in stage.loss_layers for loss in layer.losses]
    if stage.is_last:
      losses.append(self._model.compiled_loss(
          labels, self._graph.pack_outputs(outputs)))
    if not losses:
      return outputs, None
    # float32: a float16 model's loss and its float32 regularizers add up.
    return outputs, tf.add_n([tf.cast(loss, tf.float32) for loss in losses]
                             ) / self._loss_scale

  def backward(self, stage: Stage, stashed: Stash,
               upstream: Mapping[str, tf.Tensor], labels):
    """Gradients of one micro-batch through one stage.

    Returns (gradients for the received tensors, gradients for the stage's
    variables, the stage's share of the loss or None).
    """
    output_grads = {n: tf.identity(g) for n, g in upstream.items()
                    if n in stage.outputs}
    if stashed.tape is None:
      # Re-materialize: rerun the forward pass from the stash once the
      # incoming gradients exist. The control dependencies also keep it
      # distinct from the original forward pass for grappler's common
      # subexpression elimination (the benchmark's peak memory shows it).
      with tf.control_dependencies(list(output_grads.values())):
        inputs = {n: tf.identity(v) for n, v in stashed.inputs.items()}
      with tf.GradientTape() as tape:
        tape.watch([inputs[n] for n in stage.grad_inputs])
        outputs, loss_share = self.forward(stage, inputs, labels, True)
    else:
      inputs, tape = stashed.inputs, stashed.tape
      outputs, loss_share = stashed.outputs, stashed.local_loss
    targets = [outputs[n] for n in output_grads]
    target_grads = list(output_grads.values())
    if loss_share is not None:
      targets.append(loss_share)
      target_grads.append(tf.ones_like(loss_share) * tf.cast(
          loss_scale(self._model.optimizer), loss_share.dtype))
    sources = [inputs[n] for n in stage.grad_inputs]
    if not targets:
      return {}, [tf.zeros_like(v) for v in stage.variables], None
    all_grads = tape.gradient(
        targets, sources + list(stage.variables),
        output_gradients=target_grads,
        unconnected_gradients=tf.UnconnectedGradients.ZERO)
    input_grads = dict(zip(stage.grad_inputs, all_grads))
    return input_grads, all_grads[len(sources):], loss_share
