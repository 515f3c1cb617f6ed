"""How the workers of one training agree: the strategy's kind, and votes
(any worker / every worker says yes) for decisions each worker would
otherwise take from its own clock (a time-based save, a preemption notice).
"""

from typing import Callable, Tuple

import tensorflow as tf


def strategy_kind(strategy: tf.distribute.Strategy) -> str:
  """parameter_server, multi_worker_mirrored or single_worker."""
  if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
    return 'parameter_server'
  if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return 'multi_worker_mirrored'
  return 'single_worker'


def votes(strategy: tf.distribute.Strategy, kind: str
          ) -> Tuple[Callable[[bool], bool], Callable[[bool], bool]]:
  """(any worker says yes, all workers say yes) for this cluster.

  Workers of a MultiWorkerMirrored cluster run the same calls and saves
  (saving runs collectives), so decisions taken from their own clocks are
  all-reduced; a single worker decides alone.
  """
  if kind != 'multi_worker_mirrored':
    return (lambda flag: flag), (lambda flag: flag)

  @tf.function
  def count(flag):
    flags = strategy.run(lambda f: f, args=(flag,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, flags, axis=None)

  def yes(flag: bool) -> int:
    return int(count(tf.constant(int(flag))))

  replicas = strategy.num_replicas_in_sync
  return (lambda flag: yes(flag) > 0), (lambda flag: yes(flag) == replicas)
