"""Where a pipeline runs: a device per stage, each stage's variables on it."""

from typing import Any, Callable, List, Mapping, Sequence, Union

from absl import logging
import tensorflow as tf

from components.pipeline_parallel import graph as graph_lib
from components.records.partition_plan import PlanRecord


def stage_devices(num_stages: int) -> List[str]:
  """One device per stage: GPUs if there are any, else logical CPUs
  (`components.devices.configure_logical_cpus` makes them at process start).

  With fewer devices than stages, stages share devices round-robin: the
  schedule stays correct, only the parallelism is lost.
  """
  available = (tf.config.list_logical_devices('GPU') or
               tf.config.list_logical_devices('CPU'))
  if len(available) < num_stages:
    logging.warning(
        '%d pipeline stages but only %d devices; stages share devices.',
        num_stages, len(available))
  return [available[s % len(available)].name for s in range(num_stages)]


def build_model_on_devices(build_model_fn: Callable[[], tf.keras.Model],
                           plan: Union[PlanRecord, Mapping[str, Any]],
                           devices: Sequence[str]) -> tf.keras.Model:
  """Builds the model with each stage's variables on that stage's device.

  Keras creates variables while the model is built, before its layer graph
  (and so each variable's stage) is known. So the model is built twice: a
  probe build records which stage owns the i-th created variable, and the
  real build places the i-th variable on that stage's device. Optimizer
  slots follow their variables. `build_model_fn` must be deterministic.
  """
  plan = PlanRecord.from_dict(plan)
  created = []

  def record(next_creator, **kwargs):
    variable = next_creator(**kwargs)
    created.append(variable)
    return variable

  with tf.variable_creator_scope(record):
    probe = build_model_fn()
  probe_graph = graph_lib.LayerGraph(probe)
  plan.check_layer_signature(probe_graph.class_names())
  owner = {}
  for s, (start, end) in enumerate(plan.stage_spans):
    for layer in probe_graph.layers(start, end):
      for weight in layer.weights:
        owner.setdefault(id(weight), s)
  placement = [(devices[owner[id(v)]] if id(v) in owner else None, v.shape)
               for v in created]
  del probe, probe_graph
  created.clear()

  placed = []

  def place(next_creator, **kwargs):
    index = len(placed)
    device = placement[index][0] if index < len(placement) else None
    if device is None:
      variable = next_creator(**kwargs)
    else:
      with tf.device(device):
        variable = next_creator(**kwargs)
    placed.append(variable)
    return variable

  with tf.variable_creator_scope(place):
    model = build_model_fn()
  if [v.shape for v in placed] != [shape for _, shape in placement]:
    raise ValueError(
        'build_model created different variables on its second call; '
        'build_model_on_devices needs a deterministic model builder.')
  return model
