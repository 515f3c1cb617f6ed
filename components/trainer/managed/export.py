"""The exported model: a Keras SavedModel with transform-aware signatures.

The managed training loop (and `pipelines/taxi_module.py`'s `run_fn`) export
through `export_saved_model`: what `model.save(dir, save_format='tf',
signatures=...)` writes, as TFX's Keras templates export. Keras loaders
(`tf.keras.models.load_model`, warm starts, `hub.KerasLayer`) read it, its
`tf.saved_model.load` root has the variables, and its signatures serve raw
tf.Examples (`serving_default`) and feed the stock Evaluator
(`transform_features`).
"""

import shutil
import tempfile
from typing import Dict, Optional

import tensorflow as tf
import tensorflow_transform as tft


def serving_signatures(model: tf.keras.Model,
                       tf_transform_output: tft.TFTransformOutput,
                       raw_label_key: Optional[str]) -> Dict[str, object]:
  """Returns `serving_default` and `transform_features` signatures."""
  # The layer is tracked on the model so that tf.saved_model.save keeps its
  # assets (vocabularies) and variables. Both signatures apply the same one:
  # a second copy (as TFX's templates make) loaded the transform graph again.
  model.tft_layer = tf_transform_output.transform_features_layer()
  raw_feature_spec = tf_transform_output.raw_feature_spec()
  serving_feature_spec = dict(raw_feature_spec)
  if raw_label_key:
    serving_feature_spec.pop(raw_label_key, None)

  # The transform graph is applied without autograph: converting TF
  # Transform's Python (it has no control flow on tensors) took most of the
  # export's time. The model's own call is converted as under stock TFX.
  @tf.autograph.experimental.do_not_convert
  def apply_transform(raw_features):
    return model.tft_layer(raw_features)

  @tf.function(input_signature=[
      tf.TensorSpec(shape=[None], dtype=tf.string, name='examples')
  ])
  def serve_tf_examples_fn(serialized_tf_examples):
    raw_features = tf.io.parse_example(serialized_tf_examples,
                                       serving_feature_spec)
    transformed = apply_transform(raw_features)
    model_inputs = {name: transformed[name] for name in model.input_names
                    if name in transformed}
    return {'outputs': model(model_inputs)}

  @tf.function(input_signature=[
      tf.TensorSpec(shape=[None], dtype=tf.string, name='examples')
  ])
  def transform_features_fn(serialized_tf_examples):
    raw_features = tf.io.parse_example(serialized_tf_examples,
                                       raw_feature_spec)
    return apply_transform(raw_features)

  return {
      'serving_default': serve_tf_examples_fn,
      'transform_features': transform_features_fn,
  }


def export_saved_model(model: tf.keras.Model,
                       tf_transform_output: tft.TFTransformOutput,
                       raw_label_key: Optional[str],
                       export_dir: str,
                       signatures: Optional[Dict[str, object]] = None) -> None:
  """Saves `model` with transform-aware signatures to `export_dir`."""
  if signatures is None:
    signatures = serving_signatures(model, tf_transform_output, raw_label_key)
  save_keras_model(model, export_dir, signatures)


def save_keras_model(model: tf.keras.Model, export_dir: str,
                     signatures: Optional[Dict[str, object]] = None) -> None:
  """The Keras SavedModel, with the Keras metadata and layer traces that
  Keras loaders need and the given serving signatures."""
  model.save(export_dir, save_format='tf', signatures=signatures)


def export_trained_model(model: tf.keras.Model, module, tf_transform_output,
                         raw_label_key: Optional[str], export_dir: str,
                         is_chief: bool) -> None:
  """The managed loop's export: the module's signatures, else ours.

  Only the chief's export is kept; MultiWorkerMirrored workers must take
  part in the save collectives, so they export to a local scratch folder.
  """
  if not is_chief:
    export_dir = tempfile.mkdtemp(prefix='hpm-nonchief-export-')
  try:
    if hasattr(module, 'serving_signatures'):
      save_keras_model(model, export_dir,
                       module.serving_signatures(model, tf_transform_output))
    elif tf_transform_output is not None:
      export_saved_model(model, tf_transform_output, raw_label_key,
                         export_dir)
    else:
      save_keras_model(model, export_dir)
  finally:
    if not is_chief:
      shutil.rmtree(export_dir, ignore_errors=True)
