"""The best a stock-Trainer user can do by hand: `model.fit` with
`steps_per_execution`, timed.

The taxi module's stock `run_fn` (same data accessor input, same model,
same TensorBoard callback), with two additions for the throughput benchmark:
the model is compiled with `custom_config['steps_per_execution']` (1 is the
stock run_fn), and a callback records when each call of steps ended, so the
benchmark reads the steady training rate the same way for every variant.
"""

import json
import os

import tensorflow as tf
import tensorflow_transform as tft

from benchmarks import call_timer
from components.trainer.managed import export
from pipelines import taxi_module

TIMING_FILE = 'fit_timing.json'


def run_fn(fn_args):
  config = fn_args.custom_config or {}
  tf_transform_output = tft.TFTransformOutput(fn_args.transform_output)
  batch_size = config['batch_size']
  train_dataset = taxi_module._input_fn(  # pylint: disable=protected-access
      fn_args.train_files, fn_args.data_accessor, tf_transform_output,
      batch_size)
  eval_dataset = taxi_module._input_fn(  # pylint: disable=protected-access
      fn_args.eval_files, fn_args.data_accessor, tf_transform_output,
      batch_size)
  model = taxi_module.build_model(config.get('hparams'))
  model.compile(loss=model.loss, optimizer=model.optimizer,
                metrics=[tf.keras.metrics.BinaryAccuracy()],
                steps_per_execution=config['steps_per_execution'])
  timer = call_timer.CallTimer()
  model.fit(
      train_dataset, steps_per_epoch=fn_args.train_steps,
      validation_data=eval_dataset, validation_steps=fn_args.eval_steps,
      callbacks=[tf.keras.callbacks.TensorBoard(
          log_dir=fn_args.model_run_dir, update_freq='epoch'), timer])
  export.export_saved_model(model, tf_transform_output,
                            taxi_module.RAW_LABEL_KEY,
                            fn_args.serving_model_dir)
  with tf.io.gfile.GFile(os.path.join(fn_args.model_run_dir, TIMING_FILE),
                         'w') as f:
    f.write(json.dumps({
        'steady_steps_per_sec': timer.steady_steps_per_sec(),
        'calls': len(timer.points),
        'first_call_seconds': timer.first_call_s}))
