"""How fast the model consumes examples: the training step's steady rate.

The tuner compares it with the reader's rate to tell whether training is
input-bound at all (`tuner.tune`). TensorFlow and tf-keras, no TFX.

The step is the one HighPerfTrainer's managed loop runs (forward, the
compiled loss, gradients, one optimizer update), on one device, on a real
batch of the trainer's size held in memory, several steps per call (a
`tf.range` loop inside one `tf.function`) so that Python's per-call overhead
is not counted. That is an upper bound on what the trainer consumes: an
upper bound makes "input-bound" the more likely verdict, so an error costs a
search, never a slow reader.
"""

import statistics
import time
from typing import Any, Callable, Dict, Optional

import tensorflow as tf

from components import patches

# Timed windows (the median is the rate), as for the reader measurements.
_WINDOWS = 3
# Steps of the call that estimates the step time before the timed windows.
_PROBE_STEPS = 5


def _batch_rows(element: Any) -> int:
  return int(tf.nest.flatten(element)[0].shape[0])


def _input_signature(model) -> Optional[Dict[str, tf.TensorSpec]]:
  """Dense TensorSpecs of a functional model's named inputs, else None."""
  inputs = getattr(model, 'inputs', None)
  names = getattr(model, 'input_names', None)
  if not inputs or not names or len(inputs) != len(names):
    return None
  specs = {}
  for name, tensor in zip(names, inputs):
    if getattr(tensor, 'sparse', False) or getattr(tensor, 'ragged', False):
      return None
    type_spec = getattr(tensor, 'type_spec', None)
    if not isinstance(type_spec, tf.TensorSpec):
      return None
    specs[name] = tf.TensorSpec(tensor.shape, tensor.dtype, name)
  return specs


def _conform(tensor: Any, spec: tf.TensorSpec) -> Any:
  """`tensor` cast to `spec`'s dtype, and [batch] made [batch, 1] for it.

  Keras functional models expand a rank-1 batch the same way, so the step
  computes the same.
  """
  if not isinstance(tensor, tf.Tensor):
    return tensor
  if (tensor.shape.rank is not None and spec.shape.rank is not None and
      tensor.shape.rank == spec.shape.rank - 1 and spec.shape[-1] == 1):
    tensor = tf.expand_dims(tensor, -1)
  return tf.cast(tensor, spec.dtype)


class ModelStep:
  """The module model's training step: built and traced once, then timed.

  `prepare()` builds the model and traces the step; with a functional model
  of dense inputs it traces on zeros of the model's input signature, so it
  needs no data and can run while the Beam pipeline still runs (the
  executor does that in a thread). `rate(sample)` times the step on a real
  batch (cast to that signature); a batch that does not fit it (or a model
  without one) is traced on the batch itself.
  """

  def __init__(self, build_model: Callable[..., Any], label_key: str,
               hparams: Optional[Dict[str, Any]] = None):
    self._build_model = build_model
    self._label_key = label_key
    self._hparams = dict(hparams or {})
    self._model = None
    self._signature: Optional[Dict[str, tf.TensorSpec]] = None
    self._steps = None
    self.prepare_seconds = 0.0
    # Whether the real batch did not fit the prepared trace (traced again).
    self.retraced = False

  def prepare(self) -> None:
    """Builds the model; traces the step if the model has a signature."""
    with patches.installed(patches.AUTOGRAPH_SKIPS_TF_KERAS):
      self._prepare()

  def _prepare(self) -> None:
    started = time.perf_counter()
    model = self._build_model(dict(self._hparams))
    if getattr(model, 'optimizer', None) is None:
      raise ValueError('build_model must return a compiled model (there is '
                       'no optimizer to run a training step with).')
    if hasattr(model.optimizer, 'build'):
      # Slot variables exist before tracing (none may be created in the
      # tf.range loop).
      model.optimizer.build(model.trainable_variables)
    self._model = model
    self._signature = _input_signature(model)
    outputs = getattr(model, 'outputs', None) or []
    if self._signature is not None and len(outputs) == 1:
      label_spec = tf.TensorSpec(outputs[0].shape, outputs[0].dtype)
      self._steps = self._traced(
          [tf.TensorSpec([], tf.int32), self._signature, label_spec])
      # The first call optimizes the graph: not part of any timing.
      self._steps(tf.constant(1), *self._zeros(label_spec))
    self.prepare_seconds = time.perf_counter() - started

  def _zeros(self, label_spec: tf.TensorSpec):
    shape = lambda spec: [1] + [d or 1 for d in spec.shape[1:]]  # pylint: disable=g-long-lambda
    return ({k: tf.zeros(shape(s), s.dtype)
             for k, s in self._signature.items()},
            tf.zeros(shape(label_spec), label_spec.dtype))

  def _traced(self, input_signature=None):
    model = self._model
    optimizer = model.optimizer

    # Autograph would convert all of tf_keras; Keras converts the layers'
    # `call`s itself where needed (as in HighPerfTrainer's loop).
    @tf.autograph.experimental.do_not_convert
    def one_step(features, labels):
      with tf.GradientTape() as tape:
        predictions = model(features, training=True)
        loss = model.compute_loss(x=features, y=labels, y_pred=predictions)
      gradients = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    def steps(n, features, labels):
      for _ in tf.range(n):
        one_step(features, labels)
      return n

    return tf.function(steps, input_signature=input_signature)

  def _fit(self, sample: Dict[str, Any]):
    """(steps function, features, labels) for a real batch."""
    if self._label_key not in sample:
      raise ValueError(f'label_key={self._label_key!r} is not a feature of '
                       f'the sample ({sorted(sample)}).')
    labels = sample[self._label_key]
    features = {k: v for k, v in sample.items() if k != self._label_key}
    if self._steps is not None and set(self._signature) <= set(features):
      spec = self._steps.input_signature[2]
      fitted = ({k: _conform(features[k], s)
                 for k, s in self._signature.items()},
                _conform(labels, spec))
      if all(isinstance(t, tf.Tensor) and s.is_compatible_with(t)
             for t, s in [(fitted[1], spec)] + [
                 (fitted[0][k], s) for k, s in self._signature.items()]):
        return self._steps, fitted[0], fitted[1]
    names = getattr(self._model, 'input_names', None)
    if names and set(names) <= set(features):
      features = {k: features[k] for k in names}
    steps = self._traced()
    steps(tf.constant(1), features, labels)  # Traced here, not timed.
    self.retraced = True
    return steps, features, labels

  def rate(self, sample: Dict[str, Any], seconds: float) -> float:
    """Examples/s of the step on `sample`: the median of timed windows."""
    if self._model is None:
      self.prepare()
    with patches.installed(patches.AUTOGRAPH_SKIPS_TF_KERAS):
      steps, features, labels = self._fit(sample)  # May trace again.
    rows = _batch_rows(labels)
    start = time.perf_counter()
    steps(tf.constant(_PROBE_STEPS), features, labels)
    step_s = max((time.perf_counter() - start) / _PROBE_STEPS, 1e-6)
    window = seconds / _WINDOWS
    per_window = max(1, round(window / step_s))
    rates = []
    for _ in range(_WINDOWS):
      start = time.perf_counter()
      steps(tf.constant(per_window), features, labels)
      elapsed = time.perf_counter() - start
      rates.append(per_window * rows / elapsed)
      # The probe's estimate can be off (a cold first call): each window
      # sizes the next one.
      per_window = max(1, round(per_window * window / max(elapsed, 1e-6)))
    return statistics.median(rates)


def model_step_rate(build_model: Callable[..., Any], label_key: str,
                    sample: Dict[str, Any], seconds: float,
                    hparams: Optional[Dict[str, Any]] = None) -> float:
  """Examples/s of the model's training step on `sample` (see ModelStep)."""
  return ModelStep(build_model, label_key, hparams).rate(sample, seconds)
