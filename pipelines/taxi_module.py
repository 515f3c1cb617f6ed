"""Chicago taxi module: preprocessing, model and training entry points.

One module file serves every trainer in the suite:
- `preprocessing_fn` for Transform / OptimizedTransform;
- `run_fn(fn_args)` for the stock TFX Trainer (and HighPerfTrainer, unchanged);
- `build_model(hparams)` plus `LABEL_KEY` / `RAW_LABEL_KEY` for
  HighPerfTrainer's managed mode, where the executor owns the training loop.
"""

from typing import Any, Dict, List, Optional

import tensorflow as tf
import tensorflow_transform as tft

DENSE_FLOAT_FEATURE_KEYS = ['trip_miles', 'fare', 'trip_seconds']
VOCAB_FEATURE_KEYS = ['payment_type', 'company']
BUCKET_FEATURE_KEYS = [
    'pickup_latitude', 'pickup_longitude', 'dropoff_latitude',
    'dropoff_longitude'
]
CATEGORICAL_FEATURE_KEYS = [
    'trip_start_hour', 'trip_start_day', 'trip_start_month',
    'pickup_census_tract', 'dropoff_census_tract', 'pickup_community_area',
    'dropoff_community_area'
]
# Upper bounds of the raw categorical ids (census tracts and community areas
# are hashed into the last bucket count).
CATEGORICAL_NUM_TOKENS = [24, 31, 13, 1000, 1000, 100, 100]
VOCAB_SIZE = 1000
OOV_SIZE = 10
FEATURE_BUCKET_COUNT = 10

RAW_LABEL_KEY = 'tips'
FARE_KEY = 'fare'
LABEL_KEY = 'tips_xf'

DEFAULT_HPARAMS = {
    'hidden_units': [100, 70, 50, 25],
    'learning_rate': 0.001,
}


def transformed_name(key: str) -> str:
  return key + '_xf'


def _fill_in_missing(x):
  """Densifies a rank-2 SparseTensor, filling missing values with '' or 0."""
  if not isinstance(x, tf.sparse.SparseTensor):
    return x
  default_value = '' if x.dtype == tf.string else 0
  return tf.squeeze(
      tf.sparse.to_dense(
          tf.SparseTensor(x.indices, x.values, [x.dense_shape[0], 1]),
          default_value),
      axis=1)


def _bucket_ids(x, num_buckets: int):
  """Maps ids into [0, num_buckets); hashes them where the schema says bytes.

  SchemaGen infers bytes for a column that is empty in a small sample, so the
  transform must accept either type.
  """
  if x.dtype == tf.string:
    return tf.strings.to_hash_bucket_fast(x, num_buckets)
  return tf.math.floormod(tf.cast(x, tf.int64), num_buckets)


def preprocessing_fn(inputs):
  """tf.Transform callback: raw taxi features to model features."""
  outputs = {}
  for key in DENSE_FLOAT_FEATURE_KEYS:
    outputs[transformed_name(key)] = tft.scale_to_z_score(
        _fill_in_missing(inputs[key]))
  for key in VOCAB_FEATURE_KEYS:
    outputs[transformed_name(key)] = tft.compute_and_apply_vocabulary(
        _fill_in_missing(inputs[key]), top_k=VOCAB_SIZE,
        num_oov_buckets=OOV_SIZE)
  for key in BUCKET_FEATURE_KEYS:
    outputs[transformed_name(key)] = tft.bucketize(
        _fill_in_missing(inputs[key]), FEATURE_BUCKET_COUNT)
  for key, num_tokens in zip(CATEGORICAL_FEATURE_KEYS, CATEGORICAL_NUM_TOKENS):
    outputs[transformed_name(key)] = _bucket_ids(
        _fill_in_missing(inputs[key]), num_tokens)
  # Label: did the passenger tip more than 20% of the fare?
  fare = _fill_in_missing(inputs[FARE_KEY])
  tips = _fill_in_missing(inputs[RAW_LABEL_KEY])
  outputs[LABEL_KEY] = tf.where(
      tf.math.is_nan(fare), tf.cast(tf.zeros_like(fare), tf.int64),
      tf.cast(tf.greater(tips, tf.multiply(fare, tf.constant(0.2))),
              tf.int64))
  return outputs


def build_model(hparams: Optional[Dict[str, Any]] = None) -> tf.keras.Model:
  """Wide-and-deep classifier over the transformed taxi features."""
  hparams = {**DEFAULT_HPARAMS, **(hparams or {})}
  deep_inputs = {
      transformed_name(k): tf.keras.layers.Input(
          name=transformed_name(k), shape=(1,), dtype=tf.float32)
      for k in DENSE_FLOAT_FEATURE_KEYS
  }
  wide_specs = (
      [(k, VOCAB_SIZE + OOV_SIZE) for k in VOCAB_FEATURE_KEYS] +
      [(k, FEATURE_BUCKET_COUNT) for k in BUCKET_FEATURE_KEYS] +
      list(zip(CATEGORICAL_FEATURE_KEYS, CATEGORICAL_NUM_TOKENS)))
  wide_inputs = {
      transformed_name(k): tf.keras.layers.Input(
          name=transformed_name(k), shape=(1,), dtype=tf.int64)
      for k, _ in wide_specs
  }
  deep = tf.keras.layers.concatenate(list(deep_inputs.values()))
  for units in hparams['hidden_units']:
    deep = tf.keras.layers.Dense(units, activation='relu')(deep)
  wide = tf.keras.layers.concatenate([
      tf.keras.layers.CategoryEncoding(num_tokens=n)(
          wide_inputs[transformed_name(k)]) for k, n in wide_specs
  ])
  output = tf.keras.layers.Dense(1, activation='sigmoid')(
      tf.keras.layers.concatenate([deep, wide]))
  model = tf.keras.Model({**deep_inputs, **wide_inputs}, output)
  model.compile(
      loss='binary_crossentropy',
      optimizer=tf.keras.optimizers.Adam(
          learning_rate=hparams['learning_rate']),
      metrics=[tf.keras.metrics.BinaryAccuracy()])
  return model


def _input_fn(file_pattern: List[str], data_accessor, tf_transform_output,
              batch_size: int) -> tf.data.Dataset:
  # Imported here so that the managed-mode entry points above stay TFX-free.
  from tfx_bsl.public.tfxio import TensorFlowDatasetOptions  # pylint: disable=g-import-not-at-top
  return data_accessor.tf_dataset_factory(
      file_pattern,
      TensorFlowDatasetOptions(batch_size=batch_size, label_key=LABEL_KEY),
      tf_transform_output.transformed_metadata.schema).repeat()


def run_fn(fn_args):
  """Stock TFX Trainer entry point: trains with model.fit and exports."""
  from components.trainer.managed import export  # pylint: disable=g-import-not-at-top
  tf_transform_output = tft.TFTransformOutput(fn_args.transform_output)
  batch_size = (fn_args.custom_config or {}).get('batch_size', 40)
  train_dataset = _input_fn(fn_args.train_files, fn_args.data_accessor,
                            tf_transform_output, batch_size)
  eval_dataset = _input_fn(fn_args.eval_files, fn_args.data_accessor,
                           tf_transform_output, batch_size)
  # HighPerfTrainer hands run_fn the strategy it chose; the stock Trainer
  # does not, so fall back to the default strategy.
  strategy = getattr(fn_args, 'strategy', None) or tf.distribute.get_strategy()
  with strategy.scope():
    model = build_model((fn_args.custom_config or {}).get('hparams'))
  model.fit(
      train_dataset,
      steps_per_epoch=fn_args.train_steps,
      validation_data=eval_dataset,
      validation_steps=fn_args.eval_steps,
      callbacks=[tf.keras.callbacks.TensorBoard(
          log_dir=fn_args.model_run_dir, update_freq='epoch')])
  export.export_saved_model(model, tf_transform_output, RAW_LABEL_KEY,
                            fn_args.serving_model_dir)
