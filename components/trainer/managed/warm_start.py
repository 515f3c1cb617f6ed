"""Warm start: a fresh managed training begins from a previous run's model.

The Trainer's `base_model` input is a SavedModel whose root is the Keras
model that was saved (by our export, `model.save` or `tf.saved_model.save`
of a tf-keras model), so its variables form the same object graph as the
model `build_model` returns, and each weight is found by its path there.
Only the model's weights are taken, as TF Estimator's warm start does: the
optimizer starts fresh, with this run's hyperparameters (the base model's
optimizer state would bring back its learning rate). Every weight must be
found with its shape, else the warm start fails naming the missing ones: a
partial warm start would train another model than the one asked for. No TFX
import.
"""

import os
from typing import Any, Dict, List, Tuple

import tensorflow as tf

# The SavedModel's variables, as a checkpoint prefix.
VARIABLES_PREFIX = os.path.join('variables', 'variables')
_VALUE_SUFFIX = '/.ATTRIBUTES/VARIABLE_VALUE'


class WarmStartError(ValueError):
  """The base model cannot start this model (another architecture, no
  variables)."""


def _weight_paths(model: tf.keras.Model) -> Dict[int, List[str]]:
  """Each model weight (by id) and every object-graph path that reaches it
  from the model, leaving out the optimizer."""
  view = tf.train.TrackableView(model)
  paths: Dict[int, List[str]] = {}
  weights = {id(v): v for v in model.weights}
  seen = set()

  def walk(obj, path):
    for name, child in view.children(obj).items():
      if not path and name == 'optimizer':
        continue
      child_path = path + (name,)
      if id(child) in weights:
        paths.setdefault(id(child), []).append('/'.join(child_path))
      elif id(child) not in seen:
        seen.add(id(child))
        walk(child, child_path)

  walk(model, ())
  return paths


def _base_keys(model: tf.keras.Model, shapes: Dict[str, List[int]]
               ) -> Tuple[Dict[int, str], List[str]]:
  """The base model's key of each weight of `model` (by id), and the weights
  it lacks or has in another shape (name, shape, the base model's)."""
  paths = _weight_paths(model)
  keys, missing = {}, []
  for weight in model.weights:
    found = [p + _VALUE_SUFFIX for p in paths.get(id(weight), [])
             if p + _VALUE_SUFFIX in shapes]
    if found and list(shapes[found[0]]) == weight.shape.as_list():
      keys[id(weight)] = found[0]
    else:
      missing.append(f'{weight.name} {weight.shape.as_list()} (base model: '
                     f'{list(shapes[found[0]]) if found else "absent"})')
  return keys, missing


def warm_start(model: tf.keras.Model, base_model_dir: str) -> Dict[str, Any]:
  """Sets `model`'s weights to those of the SavedModel in `base_model_dir`;
  returns what was restored, for the training result.

  Raises:
    WarmStartError: the base model has no variables, or lacks a weight of
      `model` (or has it in another shape).
  """
  prefix = os.path.join(base_model_dir, VARIABLES_PREFIX)
  if not tf.io.gfile.exists(prefix + '.index'):
    raise WarmStartError(
        f'base_model {base_model_dir!r} has no variables ({prefix}.index is '
        'missing): warm start needs a SavedModel of a Keras model, such as '
        "a previous Trainer run's `model` output.")
  reader = tf.train.load_checkpoint(prefix)
  keys, missing = _base_keys(model, reader.get_variable_to_shape_map())
  if missing:
    raise WarmStartError(
        f'base_model {base_model_dir!r} cannot warm-start this model: '
        f'{len(missing)} of its {len(model.weights)} weights are missing or '
        f'shaped differently there: {"; ".join(missing[:5])}'
        f"{f' (and {len(missing) - 5} more)' if len(missing) > 5 else ''}. "
        'Warm start needs the architecture the base model was trained with.')
  for weight in model.weights:
    weight.assign(reader.get_tensor(keys[id(weight)]))
  return {'base_model': base_model_dir, 'weights': len(model.weights)}
