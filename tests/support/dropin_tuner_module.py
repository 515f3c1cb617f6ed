"""A stock Tuner module (`tuner_fn`) over the transformed taxi features whose
models are tf-keras models (what failed with keras-tuner 1.4.8)."""

import keras_tuner
import tensorflow_transform as tft
from tfx import v1 as tfx

from pipelines import taxi_module

LEARNING_RATES = [0.003, 0.01]
HIDDEN_UNITS = [8]


def tuner_fn(fn_args) -> tfx.components.TunerFnResult:
  transform_output = tft.TFTransformOutput(fn_args.transform_graph_path)

  def build(hp):
    return taxi_module.build_model({
        'hidden_units': HIDDEN_UNITS,
        'learning_rate': hp.Choice('learning_rate', LEARNING_RATES)})

  tuner = keras_tuner.RandomSearch(
      build, max_trials=1, seed=0,
      objective=keras_tuner.Objective('val_binary_accuracy', 'max'),
      directory=fn_args.working_dir, project_name='taxi')
  datasets = [
      taxi_module._input_fn(files, fn_args.data_accessor, transform_output,  # pylint: disable=protected-access
                            16)
      for files in (fn_args.train_files, fn_args.eval_files)]
  return tfx.components.TunerFnResult(
      tuner=tuner,
      fit_kwargs={'x': datasets[0], 'validation_data': datasets[1],
                  'steps_per_epoch': fn_args.train_steps,
                  'validation_steps': fn_args.eval_steps})
