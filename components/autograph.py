"""Makes autograph leave tf_keras alone, as it does for `keras`."""

from absl import logging


def skip_autograph_for_tf_keras() -> None:
  """Adds a do-not-convert rule for tf_keras to autograph's rules.

  TF 2.16's conversion rules skip the `keras` package but not `tf_keras`, so
  with TF_USE_LEGACY_KERAS every function tracing Keras code (model calls,
  metrics, SavedModel export) converts all of tf_keras: about ten seconds
  per function on a small model instead of under one. Keras converts user
  layers' `call` itself, so user code keeps autograph. The rules live in a
  private module; if it moves, this does nothing and only speed suffers.
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
