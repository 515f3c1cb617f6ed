"""The four model families of `benchmarks/bench_precision.py`, as one TFX
user module, and their synthetic data.

`hparams['family']` picks the model (`custom_config['hparams']` for both
trainers):
- `taxi`: the taxi wide-and-deep model of `pipelines/taxi_module.py` (same
  layers and feature shapes as the transformed taxi features: 3 z-scored
  floats into a 100-70-50-25 ReLU tower, 13 categorical ids one-hot
  encoded into the wide part), trained on synthetic examples of those
  shapes instead of a Transform output;
- `mlp`: a matmul-heavy MLP, 1024-1024-512 ReLU on 64 dense features;
- `cnn`: a small CNN (3 conv blocks, 32-64-128 filters) on 32x32x3 images,
  stored as a float list of 3,072 values;
- `transformer`: a 2-layer Transformer encoder (d_model 128, 4 heads of
  `tf.keras.layers.MultiHeadAttention`, FFN 512) on token sequences (an
  int64 list of length 64, vocabulary 1,000).
Every output layer computes in float32 (`dtype='float32'`), as the Keras
mixed-precision guide recommends; the rest follows the global dtype policy
that is in force when `build_model` runs. The module sets no policy and,
unless `hparams['jit_compile']` says so, passes no `jit_compile`: in
managed mode HighPerfTrainer's `distribution.precision` / `xla` then decide.
The label is always `label` (binary, or 4 classes for the CNN) and every
model reports the accuracy metric `ACCURACY`.

Managed mode: `build_model(hparams)`, `LABEL_KEY`. Stock Trainer:
`run_fn(fn_args)`, `model.fit` over `fn_args.data_accessor` under the dtype
policy and `jit_compile` of `custom_config['precision']` / `['xla']`
(set before the model is built, as the Keras guide does), with the steady
training rate timed as `benchmarks/fit_run_fn.py` does and written with the
final validation metrics to `<model_run_dir>/FIT_RESULT_FILE`.
"""

import json
import os
from typing import Any, Dict, Optional

import numpy as np
import tensorflow as tf

LABEL_KEY = 'label'
ACCURACY = 'accuracy'
FIT_RESULT_FILE = 'fit_result.json'
FAMILIES = ('taxi', 'mlp', 'cnn', 'transformer')

# Taxi: the transformed features of pipelines/taxi_module.py.
TAXI_DENSE = ['trip_miles_xf', 'fare_xf', 'trip_seconds_xf']
TAXI_CATEGORICAL = (
    [('payment_type_xf', 1010), ('company_xf', 1010)] +
    [(k + '_xf', 10) for k in ('pickup_latitude', 'pickup_longitude',
                               'dropoff_latitude', 'dropoff_longitude')] +
    [('trip_start_hour_xf', 24), ('trip_start_day_xf', 31),
     ('trip_start_month_xf', 13), ('pickup_census_tract_xf', 1000),
     ('dropoff_census_tract_xf', 1000), ('pickup_community_area_xf', 100),
     ('dropoff_community_area_xf', 100)])
MLP_FEATURES = 64
IMAGE_SHAPE = (32, 32, 3)
CNN_CLASSES = 4
SEQUENCE_LENGTH = 64
VOCAB_SIZE = 1000

DEFAULT_HPARAMS = {'family': 'mlp', 'learning_rate': 1e-3,
                   'jit_compile': None}


def feature_spec(family: str) -> Dict[str, Any]:
  """The examples' parsing spec (label included)."""
  if family == 'taxi':
    spec = {k: tf.io.FixedLenFeature([1], tf.float32) for k in TAXI_DENSE}
    spec.update({k: tf.io.FixedLenFeature([1], tf.int64)
                 for k, _ in TAXI_CATEGORICAL})
  elif family == 'mlp':
    spec = {'x': tf.io.FixedLenFeature([MLP_FEATURES], tf.float32)}
  elif family == 'cnn':
    spec = {'image': tf.io.FixedLenFeature([int(np.prod(IMAGE_SHAPE))],
                                           tf.float32)}
  elif family == 'transformer':
    spec = {'tokens': tf.io.FixedLenFeature([SEQUENCE_LENGTH], tf.int64)}
  else:
    raise ValueError(f'family={family!r} is not one of {FAMILIES}.')
  spec[LABEL_KEY] = tf.io.FixedLenFeature([], tf.int64)
  return spec


# --- synthetic data (learnable labels, so eval accuracy means something)


def synthetic_examples(family: str, count: int, seed: int
                       ) -> Dict[str, np.ndarray]:
  """`count` examples of `family` as arrays keyed like `feature_spec`.

  The rule behind the labels is the same for every seed (seed 0 draws
  it); `seed` draws the examples. About 5% of the binary labels are
  flipped, so no model reaches 100%.
  """
  rule = np.random.default_rng(0)
  rng = np.random.default_rng(seed + 1)
  if family == 'taxi':
    out = {k: rng.normal(size=(count, 1)).astype('f4') for k in TAXI_DENSE}
    logit = sum(w * out[k][:, 0] for w, k in zip((1.5, -1.0, 0.8),
                                                 TAXI_DENSE))
    for key, tokens in TAXI_CATEGORICAL:
      ids = rng.integers(0, tokens, size=(count, 1))
      out[key] = ids.astype('i8')
      logit += rule.normal(scale=0.5, size=tokens)[ids[:, 0]]
    label = logit > 0
  elif family == 'mlp':
    x = rng.normal(size=(count, MLP_FEATURES)).astype('f4')
    # Mostly linear, with a nonlinear part a linear model misses.
    w = rule.normal(size=MLP_FEATURES) / np.sqrt(MLP_FEATURES)
    w1 = rule.normal(size=(MLP_FEATURES, 4)) / np.sqrt(MLP_FEATURES)
    w2 = rule.normal(size=4)
    out = {'x': x}
    label = x @ w + 0.5 * np.tanh(2 * x @ w1) @ w2 > 0
  elif family == 'cnn':
    # Stripes of one of four orientations (the class), random frequency and
    # phase, under noise of the same amplitude.
    label = rng.integers(0, CNN_CLASSES, size=count)
    rows, cols = np.meshgrid(np.arange(32), np.arange(32), indexing='ij')
    direction = np.array([(1, 0), (0, 1), (1, 1), (1, -1)], 'f4')[label]
    frequency = rng.uniform(0.3, 0.9, size=count)
    phase = rng.uniform(0, 2 * np.pi, size=count)
    position = (direction[:, 0, None, None] * rows +
                direction[:, 1, None, None] * cols)
    stripes = np.sin(frequency[:, None, None] * position +
                     phase[:, None, None])
    amplitude = rng.uniform(0.12, 0.28, size=(count, 1, 1, 3))
    images = (stripes[..., None] * amplitude +
              rng.normal(size=(count, 32, 32, 3)))
    out = {'image': images.reshape(count, -1).astype('f4')}
    return {**out, LABEL_KEY: label.astype('i8')}
  elif family == 'transformer':
    # Each sequence draws its tokens mostly from the low or the high half
    # of the vocabulary (the label), in a random order.
    label = rng.integers(0, 2, size=count)
    share_low = np.where(label == 1, 0.35, 0.65)
    low = rng.random(size=(count, SEQUENCE_LENGTH)) < share_low[:, None]
    tokens = np.where(low, rng.integers(1, VOCAB_SIZE // 2, size=low.shape),
                      rng.integers(VOCAB_SIZE // 2, VOCAB_SIZE,
                                   size=low.shape))
    out = {'tokens': tokens.astype('i8')}
  else:
    raise ValueError(f'family={family!r} is not one of {FAMILIES}.')
  flip = rng.random(size=count) < 0.05
  return {**out, LABEL_KEY: np.logical_xor(label, flip).astype('i8')}


def write_examples(directory: str, family: str, count: int, seed: int,
                   num_files: int = 2) -> None:
  """`count` examples as gzipped TFRecords of tf.Examples in `directory`."""
  os.makedirs(directory, exist_ok=True)
  arrays = synthetic_examples(family, count, seed)
  spec = feature_spec(family)
  options = tf.io.TFRecordOptions(compression_type='GZIP')
  per_file = -(-count // num_files)
  for index in range(num_files):
    path = os.path.join(directory, f'data_tfrecord-{index:05d}-of-'
                        f'{num_files:05d}.gz')
    with tf.io.TFRecordWriter(path, options) as writer:
      for i in range(index * per_file, min(count, (index + 1) * per_file)):
        feature = {}
        for key, value in arrays.items():
          values = np.reshape(value[i], [-1])
          if spec[key].dtype == tf.int64:
            feature[key] = tf.train.Feature(
                int64_list=tf.train.Int64List(value=values.tolist()))
          else:
            feature[key] = tf.train.Feature(
                float_list=tf.train.FloatList(value=values.tolist()))
        writer.write(tf.train.Example(features=tf.train.Features(
            feature=feature)).SerializeToString())


def write_schema(path: str, family: str) -> None:
  # pylint: disable-next=g-import-not-at-top
  from tensorflow_transform.tf_metadata import schema_utils
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'w') as f:
    f.write(str(schema_utils.schema_from_feature_spec(feature_spec(family))))


# --- models


def _output(units: int, activation: str):
  return tf.keras.layers.Dense(units, activation=activation, dtype='float32',
                               name='output')


def _taxi() -> tf.keras.Model:
  deep_inputs = {k: tf.keras.layers.Input(name=k, shape=(1,),
                                          dtype=tf.float32)
                 for k in TAXI_DENSE}
  wide_inputs = {k: tf.keras.layers.Input(name=k, shape=(1,), dtype=tf.int64)
                 for k, _ in TAXI_CATEGORICAL}
  deep = tf.keras.layers.concatenate(list(deep_inputs.values()))
  for units in (100, 70, 50, 25):
    deep = tf.keras.layers.Dense(units, activation='relu')(deep)
  wide = tf.keras.layers.concatenate([
      tf.keras.layers.CategoryEncoding(num_tokens=n)(wide_inputs[k])
      for k, n in TAXI_CATEGORICAL])
  output = _output(1, 'sigmoid')(tf.keras.layers.concatenate([deep, wide]))
  return tf.keras.Model({**deep_inputs, **wide_inputs}, output)


def _mlp() -> tf.keras.Model:
  x = tf.keras.layers.Input(name='x', shape=(MLP_FEATURES,))
  hidden = x
  for units in (1024, 1024, 512):
    hidden = tf.keras.layers.Dense(units, activation='relu')(hidden)
  return tf.keras.Model({'x': x}, _output(1, 'sigmoid')(hidden))


def _cnn() -> tf.keras.Model:
  image = tf.keras.layers.Input(name='image',
                                shape=(int(np.prod(IMAGE_SHAPE)),))
  hidden = tf.keras.layers.Reshape(IMAGE_SHAPE)(image)
  for filters in (32, 64, 128):
    hidden = tf.keras.layers.Conv2D(filters, 3, padding='same',
                                    activation='relu')(hidden)
    hidden = tf.keras.layers.MaxPooling2D()(hidden)
  hidden = tf.keras.layers.GlobalAveragePooling2D()(hidden)
  hidden = tf.keras.layers.Dense(128, activation='relu')(hidden)
  return tf.keras.Model({'image': image}, _output(CNN_CLASSES, 'softmax')(
      hidden))


class _Positions(tf.keras.layers.Layer):
  """Adds a learned position embedding."""

  def build(self, input_shape):
    self.positions = self.add_weight(
        name='positions', shape=(input_shape[1], input_shape[2]),
        initializer=tf.keras.initializers.RandomNormal(stddev=0.02))

  def call(self, inputs):
    return inputs + tf.cast(self.positions, inputs.dtype)


def _transformer(layers: int = 2, d_model: int = 128, heads: int = 4,
                 ffn: int = 512) -> tf.keras.Model:
  tokens = tf.keras.layers.Input(name='tokens', shape=(SEQUENCE_LENGTH,),
                                 dtype=tf.int64)
  hidden = _Positions()(tf.keras.layers.Embedding(VOCAB_SIZE, d_model)(
      tokens))
  for _ in range(layers):
    attention = tf.keras.layers.MultiHeadAttention(
        num_heads=heads, key_dim=d_model // heads)(hidden, hidden)
    hidden = tf.keras.layers.LayerNormalization()(hidden + attention)
    feed = tf.keras.layers.Dense(ffn, activation='relu')(hidden)
    feed = tf.keras.layers.Dense(d_model)(feed)
    hidden = tf.keras.layers.LayerNormalization()(hidden + feed)
  pooled = tf.keras.layers.GlobalAveragePooling1D()(hidden)
  return tf.keras.Model({'tokens': tokens}, _output(1, 'sigmoid')(pooled))


BUILDERS = {'taxi': _taxi, 'mlp': _mlp, 'cnn': _cnn,
            'transformer': _transformer}


def uncompiled_model(family: str) -> tf.keras.Model:
  if family not in BUILDERS:
    raise ValueError(f'family={family!r} is not one of {FAMILIES}.')
  return BUILDERS[family]()


def loss_and_metric(family: str):
  if family == 'cnn':
    return ('sparse_categorical_crossentropy',
            tf.keras.metrics.SparseCategoricalAccuracy(name=ACCURACY))
  return 'binary_crossentropy', tf.keras.metrics.BinaryAccuracy(name=ACCURACY)


def build_model(hparams: Optional[Dict[str, Any]] = None) -> tf.keras.Model:
  """The compiled model of `hparams['family']` (managed-mode entry point)."""
  hparams = {**DEFAULT_HPARAMS, **(hparams or {})}
  family = hparams['family']
  model = uncompiled_model(family)
  loss, metric = loss_and_metric(family)
  model.compile(optimizer=tf.keras.optimizers.Adam(hparams['learning_rate']),
                loss=loss, metrics=[metric],
                jit_compile=hparams['jit_compile'])
  return model


# --- the stock Trainer's run_fn


def run_fn(fn_args):
  """The stock Trainer's entry point: `model.fit` over the data accessor in
  the dtype policy and XLA setting of `custom_config`, then export."""
  # pylint: disable=g-import-not-at-top
  from google.protobuf import text_format
  from tensorflow_metadata.proto.v0 import schema_pb2
  from tfx_bsl.public.tfxio import TensorFlowDatasetOptions
  # The stock Trainer runs in the benchmark's process, where the repository
  # is importable (managed mode loads this file where it may not be).
  from benchmarks.call_timer import CallTimer
  # pylint: enable=g-import-not-at-top
  config = fn_args.custom_config or {}
  hparams = dict(config.get('hparams') or {})
  batch_size = config['batch_size']
  schema = schema_pb2.Schema()
  with tf.io.gfile.GFile(fn_args.schema_path) as f:
    text_format.Parse(f.read(), schema)

  def dataset(files):
    return fn_args.data_accessor.tf_dataset_factory(
        files, TensorFlowDatasetOptions(batch_size=batch_size,
                                        label_key=LABEL_KEY),
        schema).repeat()

  # The Keras guide's way: the policy before the model is built.
  policy = config.get('precision', 'float32')
  tf.keras.mixed_precision.set_global_policy(policy)
  model = build_model({**hparams,
                       'jit_compile': config.get('xla', 'off') == 'on'})
  timer = CallTimer()
  history = model.fit(
      dataset(fn_args.train_files), steps_per_epoch=fn_args.train_steps,
      validation_data=dataset(fn_args.eval_files),
      validation_steps=fn_args.eval_steps,
      callbacks=[tf.keras.callbacks.TensorBoard(
          log_dir=fn_args.model_run_dir, update_freq='epoch'), timer])
  model.save(fn_args.serving_model_dir, save_format='tf')
  tf.keras.mixed_precision.set_global_policy('float32')
  with tf.io.gfile.GFile(os.path.join(fn_args.model_run_dir,
                                      FIT_RESULT_FILE), 'w') as f:
    f.write(json.dumps({
        'steady_steps_per_sec': timer.steady_steps_per_sec(),
        'calls': len(timer.points), 'first_call_s': timer.points[0][0],
        'eval': {name[len('val_'):]: float(values[-1])
                 for name, values in history.history.items()
                 if name.startswith('val_')},
        'loss_scale': (float(model.optimizer.loss_scale)
                       if hasattr(model.optimizer, 'loss_scale') else None),
        'policy': policy}))
