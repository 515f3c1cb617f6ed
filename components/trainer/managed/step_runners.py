"""Ways to run k training steps in one call: what the loop driver plugs in.

Each runner is called as `runner(current_step, k)` and returns the step
reached and the loss of the call (a tensor the driver reads later, so that
reading it does not wait for the next call). A call of k steps is one traced
function with k a tensor, so calls of every length share one trace and pay
the host round trip (Python, function dispatch, the loss read-back) once per
k steps instead of once per step.
"""

from typing import Callable, Tuple

import tensorflow as tf


def on_host_cpu(strategy: tf.distribute.Strategy) -> bool:
  """Every replica of the strategy is on this process's CPU."""
  return all(tf.DeviceSpec.from_string(d).device_type == 'CPU'
             for d in strategy.extended.worker_devices)


def _mean_loss(total, k):
  return tf.cast(total, tf.float32) / tf.cast(k, tf.float32)


class SynchronousSteps:
  """k steps of the replicas in sync (one device, Mirrored, MWMS, ...)."""

  def __init__(self, strategy: tf.distribute.Strategy, dataset_fn: Callable,
               replica_step: Callable, step: tf.Variable,
               host_iterator_input: bool = False):
    """`host_iterator_input`: the strategy's
    `StrategySpec.host_iterator_input`."""
    replicas = strategy.num_replicas_in_sync
    if host_iterator_input and on_host_cpu(strategy):
      # The dataset's own iterator, its next `replicas` batches one per
      # replica in order: the batches the distributed iterator hands out,
      # without its per-batch cost, which on a CPU buys nothing.
      iterator = iter(dataset_fn(tf.distribute.InputContext(
          num_input_pipelines=1, input_pipeline_id=0,
          num_replicas_in_sync=replicas)))

      def next_batch():
        if replicas == 1:
          return next(iterator)
        batches = [next(iterator) for _ in range(replicas)]
        return strategy.experimental_distribute_values_from_function(
            lambda context: batches[context.replica_id_in_sync_group])
    else:
      iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

      def next_batch():
        return next(iterator)

    @tf.function
    def run(k):
      total = tf.constant(0.0)
      for _ in tf.range(k):
        losses = strategy.run(replica_step, args=(next_batch(),))
        total += tf.cast(strategy.reduce(tf.distribute.ReduceOp.SUM, losses,
                                         axis=None), tf.float32)
      # Once per call: nothing reads the counter inside a call, and a
      # checkpoint is only taken between calls.
      step.assign_add(k)
      return _mean_loss(total, k)

    @tf.function
    def run_one():
      losses = strategy.run(replica_step, args=(next_batch(),))
      step.assign_add(1)
      return tf.cast(strategy.reduce(tf.distribute.ReduceOp.SUM, losses,
                                     axis=None), tf.float32)

    self._run, self._run_one = run, run_one

  @staticmethod
  def traced_function(k: int) -> str:
    """Single steps and longer calls are two traces; a longer call's length
    is a tensor argument, so a new length does not trace again."""
    return 'one_step' if k == 1 else 'k_steps'

  def __call__(self, current: int, k: int) -> Tuple[int, tf.Tensor]:
    if k == 1:  # No loop around the step (what multi-worker clusters run).
      return current + 1, self._run_one()
    return current + k, self._run(tf.constant(k, tf.int64))


class PipelineSteps:
  """k pipeline-parallel steps, each the plan's schedule (GPipe or 1F1B,
  over the plan's data-parallel copies) over micro-batches."""

  def __init__(self, runner, dataset: tf.data.Dataset, step: tf.Variable):
    self._iterator = iter(dataset)

    @tf.function
    def run(iterator, k):
      total = tf.constant(0.0)
      for _ in tf.range(k):
        features, labels = next(iterator)
        total += tf.cast(runner.train_step(features, labels), tf.float32)
        step.assign_add(1)
      return _mean_loss(total, k)

    self._run = run

  @staticmethod
  def traced_function(k: int) -> str:
    del k  # One trace: the length is a tensor argument.
    return 'k_steps'

  def __call__(self, current: int, k: int) -> Tuple[int, tf.Tensor]:
    return current + k, self._run(self._iterator, tf.constant(k, tf.int64))


class ParameterServerSteps:
  """k asynchronous steps: k closures scheduled on the workers, one join.

  Workers share no data order: each streams its own shuffle of the data. A
  closure may run twice (retried after a worker loss); its guard keeps the
  number of updates exact, so the step reached is read from the variable.
  """

  def __init__(self, strategy: tf.distribute.Strategy, dataset_fn: Callable,
               replica_step: Callable, step: tf.Variable, train_steps: int):
    self._coordinator = (
        tf.distribute.experimental.coordinator.ClusterCoordinator(strategy))
    self._iterator = iter(self._coordinator.create_per_worker_dataset(
        lambda: strategy.distribute_datasets_from_function(dataset_fn)))
    self._step = step

    @tf.function
    def worker_step(iterator):
      if step < train_steps:
        loss = strategy.run(replica_step, args=(next(iterator),))
        step.assign_add(1)
        return loss
      return tf.constant(0.0)

    self._worker_step = worker_step

  @staticmethod
  def traced_function(k: int) -> str:
    del k  # Every closure runs the one traced worker step.
    return 'worker_step'

  def __call__(self, current: int, k: int) -> Tuple[int, float]:
    del current  # Read back: guarded closures may not all have updated.
    results = [self._coordinator.schedule(self._worker_step,
                                          args=(self._iterator,))
               for _ in range(k)]
    self._coordinator.join()
    return int(self._step.numpy()), results[-1].fetch()
