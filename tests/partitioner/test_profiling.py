"""Layer graphs of Sequential and Functional models, and per-layer profiles."""

import numpy as np
import pytest
import tensorflow as tf

from components.partitioner import profiling
from components.pipeline_parallel import graph as graph_lib
from pipelines import taxi_module


def _skip_model():
  x = tf.keras.Input((6,), name='x')
  a = tf.keras.layers.Dense(8, name='a')(x)
  b = tf.keras.layers.Dense(8, name='b')(a)
  c = tf.keras.layers.Dense(8, name='c')(b)
  added = tf.keras.layers.Add(name='add')([a, c])
  out = tf.keras.layers.Dense(1, name='out')(added)
  model = tf.keras.Model(x, out)
  model.compile(optimizer='adam', loss='mse')
  return model


def _two_branch_model():
  x = tf.keras.Input((4,), name='x')
  left = tf.keras.layers.Dense(3, name='left1')(x)
  left = tf.keras.layers.Dense(3, name='left2')(left)
  right = tf.keras.layers.Dense(3, name='right1')(x)
  right = tf.keras.layers.Dense(3, name='right2')(right)
  joined = tf.keras.layers.Concatenate(name='join')([left, right])
  return tf.keras.Model(x, tf.keras.layers.Dense(1, name='head')(joined))


def _assert_topological(graph):
  available = set(graph.input_names)
  for call in graph.calls:
    assert set(call.inputs) <= available, call.name
    available.update(call.outputs)


def test_skip_connection_is_live_across_the_skipped_cuts():
  graph = graph_lib.LayerGraph(_skip_model())
  assert [c.name for c in graph.calls] == ['a', 'b', 'c', 'add', 'out']
  assert [graph.live(c) for c in range(6)] == [
      ('x',), ('a:0',), ('a:0', 'b:0'), ('a:0', 'c:0'), ('add:0',),
      ('out:0',)]
  assert graph.class_names() == ['Dense', 'Dense', 'Dense', 'Add', 'Dense']


def test_branches_are_finished_one_at_a_time():
  graph = graph_lib.LayerGraph(_two_branch_model())
  _assert_topological(graph)
  names = [c.name for c in graph.calls]
  # Depth-first: a branch is not interleaved with the other.
  assert names in (['left1', 'left2', 'right1', 'right2', 'join', 'head'],
                   ['right1', 'right2', 'left1', 'left2', 'join', 'head'])
  # Between the branches only the finished branch's output and x are live.
  assert len(graph.live(2)) == 2


def test_replaying_all_calls_reproduces_the_model():
  model = _two_branch_model()
  graph = graph_lib.LayerGraph(model)
  x = np.random.default_rng(0).normal(size=(5, 4)).astype('float32')
  values = graph.run(graph.feed(tf.constant(x)), 0, graph.num_calls,
                     training=False)
  np.testing.assert_allclose(graph.pack_outputs(values).numpy(),
                             model(x).numpy(), rtol=1e-6)


def test_dict_input_model_with_integer_features():
  model = taxi_module.build_model()
  graph = graph_lib.LayerGraph(model)
  _assert_topological(graph)
  features = tf.nest.map_structure(
      lambda kt: tf.ones([3, 1], kt.dtype), model.input)
  expected = model(features).numpy()
  # Parsed tf.Examples come as (batch,) and may be int32: conformed like
  # Keras does, the replay gives the same result.
  features = {key: tf.cast(tf.squeeze(value, -1),
                           tf.int32 if value.dtype == tf.int64 else
                           value.dtype)
              for key, value in features.items()}
  features['unused_extra_feature'] = tf.zeros([3])
  values = graph.run(graph.feed(features), 0, graph.num_calls,
                     training=False)
  np.testing.assert_allclose(graph.pack_outputs(values).numpy(), expected,
                             rtol=1e-6)
  # Integer tensors never need gradients.
  integer_inputs = [n for n in graph.input_names
                    if graph.dtypes[n] == tf.int64]
  assert len(integer_inputs) == 13
  assert not any(graph.is_differentiable(n) for n in integer_inputs)


def test_sequential_model_is_a_chain():
  model = tf.keras.Sequential([
      tf.keras.Input((5,)),
      tf.keras.layers.Dense(4),
      tf.keras.layers.Dense(3),
      tf.keras.layers.Dense(2),
  ])
  graph = graph_lib.LayerGraph(model)
  assert graph.num_calls == 3
  assert all(len(graph.live(c)) == 1 for c in range(4))


def test_shared_layer_calls_are_separate_steps():
  shared = tf.keras.layers.Dense(4, name='shared')
  x = tf.keras.Input((4,), name='x')
  model = tf.keras.Model(x, shared(shared(x)))
  graph = graph_lib.LayerGraph(model)
  assert [c.name for c in graph.calls] == ['shared_call1', 'shared_call2']
  assert len(graph.layers(0, 2)) == 1


def test_subclassed_and_masking_models_are_rejected():
  class Subclassed(tf.keras.Model):

    def call(self, inputs):
      return inputs

  with pytest.raises(ValueError, match='subclassed'):
    graph_lib.LayerGraph(Subclassed())
  tokens = tf.keras.Input((5,), dtype=tf.int32)
  embedded = tf.keras.layers.Embedding(10, 3, mask_zero=True)(tokens)
  masked = tf.keras.Model(tokens, tf.keras.layers.LSTM(2)(embedded))
  with pytest.raises(ValueError, match='mask'):
    graph_lib.LayerGraph(masked)


def test_profile_counts_bytes_and_optimizer_slots():
  model = _skip_model()
  x = tf.zeros([4, 6])
  profile = profiling.profile_model(model, x, repeats=2)
  assert profile.microbatch_size == 4
  assert [layer.name for layer in profile.layers] == [
      'a', 'b', 'c', 'add', 'out']
  assert sum(layer.parameter_bytes for layer in profile.layers) == 4 * (
      model.count_params())
  assert profile.layers[1].parameter_bytes == 4 * (8 * 8 + 8)
  assert all(layer.activation_bytes == 4 * 8 * 4
             for layer in profile.layers[:4])
  assert profile.layers[-1].activation_bytes == 4 * 4
  assert profile.tensor_bytes['x'] == 4 * 6 * 4
  assert profile.optimizer_slot_ratio == pytest.approx(2.0)  # Adam: m, v.
  assert all(layer.forward_seconds >= 0 and layer.backward_seconds >= 0
             for layer in profile.layers)
  assert profile.live_tensors[3] == ('a:0', 'c:0')
  assert profile.cut_bytes(3) == 2 * 4 * 8 * 4


def test_profile_measures_the_optimizers_own_slots():
  model = _skip_model()
  model.compile(optimizer=tf.keras.optimizers.Adagrad(), loss='mse')
  profile = profiling.profile_model(model, tf.zeros([2, 6]), repeats=1)
  assert profile.optimizer_slot_ratio == pytest.approx(1.0)  # Accumulator.
