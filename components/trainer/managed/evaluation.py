"""Evaluation of the trained model: compiled loss and metrics, TensorBoard."""

import os
from typing import Callable, Dict, Optional

import tensorflow as tf

# model_run's folder of the eval metrics (TensorBoard's "validation" run).
VALIDATION_LOGS = 'validation'


def evaluate(model: tf.keras.Model, strategy: tf.distribute.Strategy,
             lockstep_workers: bool,
             dataset_fn: Optional[Callable[[tf.distribute.InputContext],
                                           tf.data.Dataset]],
             eval_steps: int,
             summary_dir: Optional[str], step: int) -> Dict[str, float]:
  """The compiled loss and metrics over `eval_steps` global batches of the
  datasets `dataset_fn` makes (one per input pipeline); `lockstep_workers`:
  the strategy's `StrategySpec.lockstep_workers`.

  `model.test_step` in our own tf.function rather than `model.evaluate`:
  TF 2.16's autograph does not skip tf_keras (only `keras`), and converting
  it makes every Keras-traced function take seconds to build. The metrics go
  to TensorBoard under `summary_dir/validation` (the chief's model_run) at
  `step`, where Keras' TensorBoard callback writes a stock run_fn's.
  """
  if dataset_fn is None:
    return {}
  iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
  test_step = tf.autograph.experimental.do_not_convert(model.test_step)

  @tf.function
  def eval_step(iterator):
    strategy.run(test_step, args=(next(iterator),))

  @tf.function
  def eval_loop(iterator, steps):
    # One call for all the steps: a call per step cost more than the step.
    for _ in tf.range(steps):
      strategy.run(test_step, args=(next(iterator),))

  model.reset_metrics()
  with strategy.scope():
    if lockstep_workers:
      # The workers' calls stay single steps, as in training
      # (`StrategySpec.lockstep_workers`).
      for _ in range(eval_steps):
        eval_step(iterator)
    else:
      eval_loop(iterator, tf.constant(eval_steps, tf.int64))
  metrics = {name: float(value)
             for name, value in model.get_metrics_result().items()}
  if summary_dir:
    writer = tf.summary.create_file_writer(
        os.path.join(summary_dir, VALIDATION_LOGS))
    with writer.as_default():
      for name, value in metrics.items():
        tf.summary.scalar(name, value, step=step)
    writer.flush()
  return metrics
