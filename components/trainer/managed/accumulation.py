"""One optimizer update per replica, optionally accumulated over micro-steps.

`replica_step_fn` is what every synchronous and parameter-server step runs on
each replica: the compiled loss of the user's model (one value per example),
scaled by the examples of the whole update, and with k accumulation
micro-steps the batch split into k micro-batches whose gradients are summed
before one update, which equals the update from the k-times larger batch.

Under a LossScaleOptimizer (float16) each micro-step's loss is scaled and the
sum unscaled once, as PyTorch's GradScaler does; the optimizer skips a
non-finite update. With `jit_compile` the update of a lone replica is one
XLA computation, as Keras `fit` compiles its train step; with several
replicas each micro-step's forward and backward pass is, and the update with
its cross-replica all-reduce stays outside (a multi-worker all-reduce inside
XLA crashed the CPU runtime, Mirrored replicas on logical CPUs were
refused; tf-keras optimizers compile their own update with XLA on GPUs).
"""

from typing import Callable

import tensorflow as tf

from components.trainer.managed import precision


def rows(value, start, size: int):
  """Rows [start, start + size) of a dense, ragged or sparse batch."""
  if isinstance(value, tf.sparse.SparseTensor):
    rank = tf.shape(value.dense_shape)[0]
    begin = tf.concat([[tf.cast(start, tf.int64)],
                       tf.zeros([rank - 1], tf.int64)], 0)
    extent = tf.concat([[tf.constant(size, tf.int64)], value.dense_shape[1:]],
                       0)
    return tf.sparse.slice(value, begin, extent)
  return value[start:start + size]


def per_example_loss(model: tf.keras.Model) -> Callable:
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


def replica_step_fn(model: tf.keras.Model, accumulation: int,
                    examples_per_step: int, micro_batch: int,
                    jit_compile: bool = False,
                    lone_replica: bool = False) -> Callable:
  """The per-replica update: `(features, labels) -> loss` (see module doc).

  Every loss term is a sum over examples divided by the examples of the whole
  update (all replicas, all micro-steps). The loss returned is unscaled.
  """
  example_loss = per_example_loss(model)
  scaler = precision.loss_scaler(model.optimizer)

  # Autograph would convert all of tf_keras (seconds of tracing); Keras
  # converts the layers' `call`s itself where needed.
  @tf.autograph.experimental.do_not_convert
  def loss_and_gradients(features, labels):
    with tf.GradientTape() as tape:
      predictions = model(features, training=True)
      loss = tf.nn.compute_average_loss(
          example_loss(labels, predictions),
          global_batch_size=examples_per_step)
      if model.losses:
        loss += tf.nn.scale_regularization_loss(
            tf.add_n(model.losses)) / accumulation
      scaled = loss if scaler is None else scaler.get_scaled_loss(loss)
    return loss, tape.gradient(scaled, model.trainable_variables)

  if jit_compile and not lone_replica:
    loss_and_gradients = tf.function(loss_and_gradients, jit_compile=True)

  @tf.autograph.experimental.do_not_convert
  def apply_gradients(gradients):
    model.optimizer.apply_gradients(zip(gradients, model.trainable_variables))

  def replica_step(batch):
    features, labels = batch
    if accumulation == 1:
      loss, gradients = loss_and_gradients(features, labels)
    else:
      loss = tf.constant(0.0)
      gradients = [tf.zeros_like(v) for v in model.trainable_variables]
      for i in tf.range(accumulation):
        micro_features, micro_labels = tf.nest.map_structure(
            lambda t: rows(t, i * micro_batch, micro_batch),
            (features, labels))
        micro_loss, micro_gradients = loss_and_gradients(micro_features,
                                                         micro_labels)
        loss += tf.cast(micro_loss, loss.dtype)
        gradients = [g + tf.convert_to_tensor(m)
                     for g, m in zip(gradients, micro_gradients)]
    if scaler is not None:
      gradients = scaler.get_unscaled_gradients(gradients)
    apply_gradients(gradients)
    # float32 whatever the policy: the runners sum and compare losses.
    return tf.cast(loss, tf.float32)

  if jit_compile and lone_replica:
    return tf.function(replica_step, jit_compile=True)
  return replica_step
