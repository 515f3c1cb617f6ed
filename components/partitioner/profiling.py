"""Per-layer profile of a Keras model on a sample micro-batch.

For every layer call, in the topological order of `graph.LayerGraph`: the
median time of its forward pass and of forward+backward (each compiled with
tf.function, timed after a warm-up call, less the median time of calling an
identity tf.function on the same inputs: inside the pipeline's single graph
a layer pays no per-call overhead), the bytes of the weights it introduces
and of the tensors it outputs. Backward time is the difference. The model
should be a throwaway: profiling builds its optimizer's slots.
"""

import statistics
import time
from typing import Callable, Mapping

import tensorflow as tf

from components.partitioner import plan as plan_lib
from components.pipeline_parallel import graph as graph_lib


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
  fn()  # Trace and warm up.
  tf.test.experimental.sync_devices()
  samples = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    tf.test.experimental.sync_devices()
    samples.append(time.perf_counter() - start)
  return statistics.median(samples)


def _is_differentiable(value: tf.Tensor) -> bool:
  return value.dtype.is_floating or value.dtype.is_complex


def _time_call(call: graph_lib.LayerCall, inputs: Mapping[str, tf.Tensor],
               repeats: int):
  """(forward seconds, backward seconds) of one layer call."""
  forward = tf.function(lambda values: call(values, training=True),
                        autograph=False)
  weights = call.layer.trainable_weights

  @tf.function(autograph=False)
  def forward_backward(values):
    sources = [v for v in values.values() if _is_differentiable(v)]
    with tf.GradientTape() as tape:
      tape.watch(sources)
      outputs = [t for t in call(values, training=True).values()
                 if _is_differentiable(t)]
    if not outputs:
      return []
    return tape.gradient(
        outputs, sources + weights,
        output_gradients=[tf.ones_like(t) for t in outputs],
        unconnected_gradients=tf.UnconnectedGradients.ZERO)

  identity = tf.function(lambda values: values, autograph=False)
  overhead = _median_seconds(lambda: identity(inputs), repeats)
  forward_seconds = max(
      _median_seconds(lambda: forward(inputs), repeats) - overhead, 0.0)
  total_seconds = max(
      _median_seconds(lambda: forward_backward(inputs), repeats) - overhead,
      0.0)
  return forward_seconds, max(total_seconds - forward_seconds, 0.0)


def _optimizer_slot_ratio(model: tf.keras.Model) -> float:
  """Optimizer state bytes per trainable weight byte (Adam: 2, SGD: 0)."""
  optimizer = getattr(model, 'optimizer', None)
  weights = model.trainable_weights
  trainable = sum(graph_lib.tensor_bytes(w) for w in weights)
  if optimizer is None or not trainable:
    return 0.0
  # Zero gradients create every optimizer's slots without moving a weight of
  # any usual optimizer; the model is a throwaway anyway.
  optimizer.apply_gradients([(tf.zeros_like(w), w) for w in weights])
  variables = optimizer.variables
  variables = variables() if callable(variables) else variables
  slots = [v for v in variables if v is not optimizer.iterations]
  return sum(graph_lib.tensor_bytes(v) for v in slots) / trainable


def profile_model(model: tf.keras.Model, features,
                  repeats: int) -> plan_lib.ModelProfile:
  """Profiles `model` on `features`, a micro-batch shaped like its input."""
  graph = graph_lib.LayerGraph(model)
  values = graph.feed(features)
  microbatch_size = int(tf.shape(next(iter(values.values())))[0])
  counted = set()
  layers = []
  for call in graph.calls:
    inputs = {name: values[name] for name in call.inputs}
    forward_seconds, backward_seconds = _time_call(call, inputs, repeats)
    values.update(call(inputs, training=True))
    new_weights = [w for w in call.layer.weights if id(w) not in counted]
    counted.update(id(w) for w in new_weights)
    layers.append(plan_lib.LayerProfile(
        name=call.name,
        class_name=type(call.layer).__name__,
        forward_seconds=forward_seconds,
        backward_seconds=backward_seconds,
        parameter_bytes=sum(graph_lib.tensor_bytes(w) for w in new_weights),
        trainable_bytes=sum(graph_lib.tensor_bytes(w) for w in new_weights
                            if w.trainable),
        activation_bytes=sum(graph_lib.tensor_bytes(values[name])
                             for name in call.outputs),
        inputs=call.inputs,
        outputs=call.outputs))
  return plan_lib.ModelProfile(
      microbatch_size=microbatch_size,
      optimizer_slot_ratio=_optimizer_slot_ratio(model),
      layers=tuple(layers),
      tensor_bytes={name: graph_lib.tensor_bytes(value)
                    for name, value in values.items()},
      live_tensors=tuple(graph.live(c) for c in range(graph.num_calls + 1)))
