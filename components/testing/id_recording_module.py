"""A managed-mode user module whose model records the example ids it trains on.

Every training forward pass appends one JSON line
`{"pid", "step", "replica", "ids"}` to `hparams['id_log']`, from inside the
compiled step (a `tf.py_function`), so a test sees exactly which examples each
optimizer step of each process consumed. `hparams['step_sleep_seconds']`
slows steps down so that a test can signal a process mid-training;
while the file `hparams['hold_file']` exists, a step that has logged waits
(a test holds training until it has changed the cluster).
`overflow_at_steps` lists optimizer iterations whose forward pass is scaled
by 1e5, past float16's range (on replica `overflow_replica` only, where
given): a loss-scaling test's overflows, at known steps.
`seeded_initializers=False` and `dropout > 0` give the model the randomness
that `distribution.seed` has to pin down. `dtype_policy` and `jit_compile`
are the module's own precision and XLA choices (None: it makes none).
"""

import json
import os
import time

import tensorflow as tf

LABEL_KEY = 'label'
RAW_LABEL_KEY = 'label'
NUM_FEATURES = 4
FEATURE_SPEC = {
    'id': tf.io.FixedLenFeature([], tf.int64),
    'x': tf.io.FixedLenFeature([NUM_FEATURES], tf.float32),
    'label': tf.io.FixedLenFeature([], tf.float32),
}
DEFAULT_HPARAMS = {'learning_rate': 0.05, 'hidden_units': 8, 'id_log': None,
                   'step_sleep_seconds': 0.0, 'hold_file': None,
                   'seeded_initializers': True, 'dropout': 0.0,
                   'dtype_policy': None, 'jit_compile': None,
                   'overflow_at_steps': (), 'overflow_replica': None}
# The factor of an overflowing step: float16's largest value is 65,504.
OVERFLOW_FACTOR = 1e5


class RecordIds(tf.keras.layers.Layer):
  """Passes `x` through; in training, logs the step and the batch's ids."""

  def __init__(self, log_path, step_fn, sleep_seconds, hold_file, **kwargs):
    super().__init__(**kwargs)
    self._log_path = log_path
    self._step_fn = step_fn
    self._sleep_seconds = sleep_seconds
    self._hold_file = hold_file

  def _write(self, step, replica, ids):
    line = json.dumps({'pid': os.getpid(), 'step': int(step),
                       'replica': int(replica),
                       'ids': [int(i) for i in ids.numpy()]}) + '\n'
    fd = os.open(self._log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
      os.write(fd, line.encode())  # One write: lines never interleave.
    finally:
      os.close(fd)
    if self._sleep_seconds:
      time.sleep(self._sleep_seconds)
    while self._hold_file and os.path.exists(self._hold_file):
      time.sleep(0.1)
    return step

  def call(self, inputs, training=None):
    x, ids = inputs
    if not training or not self._log_path:
      return x
    context = tf.distribute.get_replica_context()
    replica = context.replica_id_in_sync_group if context else 0
    done = tf.py_function(self._write, [self._step_fn(), replica, ids],
                          Tout=tf.int64)
    with tf.control_dependencies([done]):
      return tf.identity(x)


class OverflowAt(tf.keras.layers.Layer):
  """Scales `x` by OVERFLOW_FACTOR at the given steps (and replica) in
  training; passes it through otherwise."""

  def __init__(self, steps, replica, step_fn, **kwargs):
    super().__init__(**kwargs)
    self._steps = [int(s) for s in steps]
    self._replica = replica
    self._step_fn = step_fn

  def call(self, x, training=None):
    if not training:
      return x
    overflow = tf.reduce_any(tf.equal(
        tf.cast(self._step_fn(), tf.int64), self._steps))
    if self._replica is not None:
      context = tf.distribute.get_replica_context()
      replica = context.replica_id_in_sync_group if context else 0
      overflow = tf.logical_and(overflow, tf.equal(replica, self._replica))
    return x * tf.where(overflow, OVERFLOW_FACTOR, 1.0)


def build_model(hparams=None):
  hparams = {**DEFAULT_HPARAMS, **(hparams or {})}
  if hparams['dtype_policy']:
    tf.keras.mixed_precision.set_global_policy(hparams['dtype_policy'])
  optimizer = tf.keras.optimizers.Adam(hparams['learning_rate'])
  x = tf.keras.layers.Input(shape=(NUM_FEATURES,), name='x')
  ids = tf.keras.layers.Input(shape=(), dtype=tf.int64, name='id')
  hidden = RecordIds(hparams['id_log'], lambda: optimizer.iterations,
                     hparams['step_sleep_seconds'],
                     hparams['hold_file'])([x, ids])
  if hparams['overflow_at_steps']:
    hidden = OverflowAt(hparams['overflow_at_steps'],
                        hparams['overflow_replica'],
                        lambda: optimizer.iterations,
                        # In float32: the next layer's float16 cast overflows.
                        dtype='float32')(hidden)
  seeded = hparams['seeded_initializers']
  hidden = tf.keras.layers.Dense(
      hparams['hidden_units'], activation='relu',
      kernel_initializer=tf.keras.initializers.GlorotUniform(
          seed=1 if seeded else None))(hidden)
  if hparams['dropout']:
    hidden = tf.keras.layers.Dropout(hparams['dropout'])(hidden)
  output = tf.keras.layers.Dense(
      1, activation='sigmoid',
      kernel_initializer=tf.keras.initializers.GlorotUniform(
          seed=2 if seeded else None))(hidden)
  model = tf.keras.Model({'x': x, 'id': ids}, output)
  model.compile(optimizer=optimizer, loss='binary_crossentropy',
                metrics=[tf.keras.metrics.BinaryAccuracy()],
                jit_compile=hparams['jit_compile'])
  return model
