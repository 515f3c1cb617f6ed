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

from absl import logging
import tensorflow as tf

# Timed windows (the median is the rate), as for the reader measurements.
_WINDOWS = 3
# Steps of the call that estimates the step time before the timed windows.
_PROBE_STEPS = 5


def skip_autograph_for_tf_keras() -> None:
  """Makes autograph leave tf_keras alone, as it does for `keras`.

  TF 2.16's conversion rules skip `keras` but not `tf_keras`, so with
  TF_USE_LEGACY_KERAS a function tracing a model converts all of tf_keras
  (about ten seconds here). The same rule as HighPerfTrainer's loop; the
  rules live in a private module, so if it moves this does nothing and only
  the tracing is slower.
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


def _batch_rows(element: Any) -> int:
  return int(tf.nest.flatten(element)[0].shape[0])


def model_step_rate(build_model: Callable[..., Any],
                    label_key: str,
                    sample: Dict[str, Any],
                    seconds: float,
                    hparams: Optional[Dict[str, Any]] = None) -> float:
  """Examples/s of the model's training step on `sample`, after warm-up.

  Args:
    build_model: The module's `build_model(hparams)`: a compiled Keras model.
    label_key: Feature of `sample` that is the label.
    sample: One parsed batch of transformed features (label included), of
      the trainer's batch size.
    seconds: Timed seconds (after tracing and a warm-up call).
    hparams: Passed to `build_model`.

  Returns:
    The median rate of `_WINDOWS` timed windows.
  """
  skip_autograph_for_tf_keras()
  model = build_model(dict(hparams or {}))
  if label_key not in sample:
    raise ValueError(f'label_key={label_key!r} is not a feature of the sample '
                     f'({sorted(sample)}).')
  labels = sample[label_key]
  features = {k: v for k, v in sample.items() if k != label_key}
  input_names = getattr(model, 'input_names', None)
  if input_names and set(input_names) <= set(features):
    features = {k: features[k] for k in input_names}
  optimizer = model.optimizer
  if optimizer is None:
    raise ValueError('build_model must return a compiled model (no '
                     'optimizer to measure a training step with).')
  if hasattr(optimizer, 'build'):
    # Slot variables exist before the loop traces (none may be created in a
    # tf.range loop).
    optimizer.build(model.trainable_variables)

  @tf.autograph.experimental.do_not_convert
  def one_step():
    with tf.GradientTape() as tape:
      predictions = model(features, training=True)
      loss = model.compute_loss(x=features, y=labels, y_pred=predictions)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))

  @tf.function
  def steps(n):
    for _ in tf.range(n):
      one_step()
    return n

  rows = _batch_rows(labels)
  steps(tf.constant(1))  # Tracing and variable creation are not timed.
  start = time.perf_counter()
  steps(tf.constant(_PROBE_STEPS))
  step_s = max((time.perf_counter() - start) / _PROBE_STEPS, 1e-6)
  per_window = max(1, round(seconds / _WINDOWS / step_s))
  rates = []
  for _ in range(_WINDOWS):
    start = time.perf_counter()
    steps(tf.constant(per_window))
    rates.append(per_window * rows / (time.perf_counter() - start))
  return statistics.median(rates)
