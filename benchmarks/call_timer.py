"""How the benchmarks time `model.fit`: when each call of steps ended."""

import time

import tensorflow as tf


class CallTimer(tf.keras.callbacks.Callback):
  """(seconds since start, steps done) at the end of every call of steps."""

  def __init__(self):
    super().__init__()
    self.points = []
    self._start = None

  def on_train_begin(self, logs=None):
    self._start = time.monotonic()

  def on_train_batch_end(self, batch, logs=None):
    # With steps_per_execution=N Keras calls this once per N steps, with
    # the index of the last step of the call.
    self.points.append((time.monotonic() - self._start, batch + 1))

  @property
  def first_call_s(self) -> float:
    return self.points[0][0]

  def steady_steps_per_sec(self) -> float:
    """Steps per second after the first call (which traces); the first
    call's rate where there was only one."""
    (first_s, first_steps), (last_s, last_steps) = (self.points[0],
                                                    self.points[-1])
    if last_steps == first_steps:
      return first_steps / max(first_s, 1e-9)
    return (last_steps - first_steps) / max(last_s - first_s, 1e-9)
