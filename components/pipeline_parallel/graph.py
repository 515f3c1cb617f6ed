"""A Keras Sequential/Functional model as layer calls in topological order.

Profiling and the GPipe runner both need to run any contiguous range of a
model's layer calls on their own, feeding in the tensors that are live
across the cut. tf-keras keeps the call graph of a graph network in its
nodes; this module reads it once and replays it.

The order is a topological order that finishes one branch before starting
the next where it can (depth-first Kahn), which keeps fewer tensors live
across cuts than Keras's breadth-first depth order.
"""

import dataclasses
import inspect
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import tensorflow as tf

from components.patches import tensorflow_internals

_KerasTensor = tf.keras.__internal__.KerasTensor


@dataclasses.dataclass(frozen=True)
class _TensorRef:
  """Placeholder for a graph tensor inside a call's argument structure."""
  name: str


@dataclasses.dataclass(frozen=True)
class LayerCall:
  """One call of a layer in the model: what it reads and what it produces."""
  name: str
  layer: tf.keras.layers.Layer
  inputs: Tuple[str, ...]
  outputs: Tuple[str, ...]
  arguments: Any  # (args, kwargs) with _TensorRef in place of tensors.
  accepts_training: bool

  def __call__(self, values: Mapping[str, tf.Tensor],
               training: bool) -> Dict[str, tf.Tensor]:
    args, kwargs = tf.nest.map_structure(
        lambda x: values[x.name] if isinstance(x, _TensorRef) else x,
        self.arguments)
    if self.accepts_training and 'training' not in kwargs:
      kwargs = {**kwargs, 'training': training}
    results = tf.nest.flatten(self.layer(*args, **kwargs))
    return dict(zip(self.outputs, results))


class LayerGraph:
  """Layer calls of a Keras graph network in topological order.

  Tensors are named '<call>:<output index>'; model inputs by their Input
  layer's name. Cut c sits before call c (cut 0: the model inputs, cut n:
  the model outputs).
  """

  def __init__(self, model: tf.keras.Model):
    by_depth = tensorflow_internals.graph_network_nodes(model)
    if by_depth is None:
      raise ValueError(
          f'model {model.name!r} is a subclassed Keras model; GPipe '
          'partitioning needs a Sequential or Functional model, whose layer '
          'graph is known.')
    self.model = model
    nodes = [node for depth in sorted(by_depth, reverse=True)
             for node in by_depth[depth]]
    tensor_names = {}
    self.dtypes: Dict[str, tf.DType] = {}
    self._input_shapes: Dict[str, tf.TensorShape] = {}
    for node in nodes:
      if node.is_input:
        kt = tf.nest.flatten(node.outputs)[0]
        tensor_names[id(kt)] = node.layer.name
        self.dtypes[node.layer.name] = kt.dtype
        self._input_shapes[node.layer.name] = kt.shape
    uses = {}
    for node in nodes:
      if not node.is_input:
        uses[node.layer.name] = uses.get(node.layer.name, 0) + 1
    seen = {}
    calls = []
    for node in nodes:
      if node.is_input:
        continue
      layer = node.layer
      seen[layer.name] = seen.get(layer.name, 0) + 1
      name = (layer.name if uses[layer.name] == 1 else
              f'{layer.name}_call{seen[layer.name]}')
      outputs = tf.nest.flatten(node.outputs)
      for index, kt in enumerate(outputs):
        if getattr(kt, '_keras_mask', None) is not None:
          raise ValueError(
              f'layer {layer.name!r} produces a Keras mask; masks do not '
              'cross pipeline stages, so masking layers are not supported.')
        tensor_names[id(kt)] = f'{name}:{index}'
        self.dtypes[f'{name}:{index}'] = kt.dtype
      calls.append((name, node, outputs))

    self.calls: Tuple[LayerCall, ...] = tuple(
        self._topological_order([
            self._make_call(name, node, outputs, tensor_names)
            for name, node, outputs in calls
        ]))
    self.input_names = tuple(tensor_names[id(kt)] for kt in model.inputs)
    self.output_names = tuple(tensor_names[id(kt)] for kt in model.outputs)
    self._input_structure = tf.nest.map_structure(
        lambda kt: tensor_names[id(kt)], model.input)
    self._live = self._live_tensors()

  @staticmethod
  def _make_call(name, node, outputs, tensor_names) -> LayerCall:
    inputs = []

    def to_ref(x):
      if isinstance(x, _KerasTensor):
        ref = _TensorRef(tensor_names[id(x)])
        if ref.name not in inputs:
          inputs.append(ref.name)
        return ref
      return x

    arguments = tf.nest.map_structure(to_ref,
                                      (node.call_args, node.call_kwargs))
    parameters = inspect.signature(node.layer.call).parameters
    return LayerCall(
        name=name,
        layer=node.layer,
        inputs=tuple(inputs),
        outputs=tuple(f'{name}:{i}' for i in range(len(outputs))),
        arguments=arguments,
        accepts_training='training' in parameters)

  @staticmethod
  def _topological_order(calls: List[LayerCall]) -> List[LayerCall]:
    """Depth-first Kahn order; ties follow Keras's (valid) depth order."""
    producer = {out: i for i, call in enumerate(calls) for out in call.outputs}
    waiting_on = [{producer[t] for t in call.inputs if t in producer}
                  for call in calls]
    consumers = [[] for _ in calls]
    for i, deps in enumerate(waiting_on):
      for dep in deps:
        consumers[dep].append(i)
    stack = [i for i in reversed(range(len(calls))) if not waiting_on[i]]
    order = []
    while stack:
      i = stack.pop()
      order.append(calls[i])
      ready = []
      for consumer in consumers[i]:
        waiting_on[consumer].discard(i)
        if not waiting_on[consumer]:
          ready.append(consumer)
      stack.extend(sorted(ready, reverse=True))
    return order

  def _live_tensors(self) -> Tuple[Tuple[str, ...], ...]:
    n = len(self.calls)
    produced_at = {name: -1 for name in self.input_names}
    last_use = {}
    for position, call in enumerate(self.calls):
      for name in call.inputs:
        last_use[name] = position
      for name in call.outputs:
        produced_at[name] = position
    for name in self.output_names:
      last_use[name] = n
    order = list(produced_at)  # Model inputs, then outputs in call order.
    return tuple(
        tuple(name for name in order
              if produced_at[name] < cut <= last_use.get(name, -1))
        for cut in range(n + 1))

  @property
  def num_calls(self) -> int:
    return len(self.calls)

  def is_differentiable(self, name: str) -> bool:
    return self.dtypes[name].is_floating or self.dtypes[name].is_complex

  def live(self, cut: int) -> Tuple[str, ...]:
    """Tensors crossing cut `cut`: produced before it, needed at or after."""
    return self._live[cut]

  def class_names(self) -> List[str]:
    return [type(call.layer).__name__ for call in self.calls]

  def feed(self, features) -> Dict[str, tf.Tensor]:
    """Model inputs by tensor name, from data shaped like `model.input`.

    A dict-input model takes its keys from a (possibly larger) features dict.
    Like a Functional model's own call, a missing or extra trailing unit
    dimension is fixed and the dtype cast to the Input's.
    """
    if isinstance(self._input_structure, dict):
      named = {name: features[key]
               for key, name in self._input_structure.items()}
    else:
      named = dict(zip(tf.nest.flatten(self._input_structure),
                       tf.nest.flatten(features)))
    return {name: self._conform(name, value) for name, value in named.items()}

  def _conform(self, name: str, value) -> tf.Tensor:
    value = tf.convert_to_tensor(value)
    rank, expected = value.shape.rank, self._input_shapes[name]
    if rank is not None and expected.rank is not None:
      if rank == expected.rank + 1 and value.shape[-1] == 1:
        value = tf.squeeze(value, axis=-1)
      elif rank == expected.rank - 1 and expected[-1] == 1:
        value = tf.expand_dims(value, axis=-1)
    return tf.cast(value, self.dtypes[name])

  def pack_outputs(self, values: Mapping[str, tf.Tensor]):
    """Model outputs from `values`, in the structure of `model.output`."""
    return tf.nest.pack_sequence_as(
        self.model.output, [values[name] for name in self.output_names])

  def run(self, values: Mapping[str, tf.Tensor], start: int, end: int,
          training: bool) -> Dict[str, tf.Tensor]:
    """Runs calls [start, end); returns `values` plus everything produced."""
    values = dict(values)
    for call in self.calls[start:end]:
      values.update(call(values, training))
    return values

  def layers(self, start: int, end: int) -> List[tf.keras.layers.Layer]:
    """Distinct layers of calls [start, end), in call order."""
    layers = []
    for call in self.calls[start:end]:
      if not any(layer is call.layer for layer in layers):
        layers.append(call.layer)
    return layers


def tensor_bytes(value: tf.Tensor) -> int:
  return int(tf.size(value)) * value.dtype.size


def unique_variables(variables: Sequence[tf.Variable]) -> List[tf.Variable]:
  """Variables without repeats (shared layers list theirs more than once)."""
  seen = set()
  result = []
  for variable in variables:
    if id(variable) not in seen:
      seen.add(id(variable))
      result.append(variable)
  return result
