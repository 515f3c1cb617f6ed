"""The taxi pipeline, its runners (`python -m pipelines.local_runner`), console.

TFX 1.16 needs tf.keras to be Keras 2 (tf-keras): every entry point here runs
as `python -m pipelines.<module>`, which imports this package first, so setting
the variable here comes before anything imports TensorFlow and the commands
work in a plain shell. A value already set wins.
"""

import os

os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')
