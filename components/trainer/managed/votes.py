"""How the workers of one training agree: votes (any worker / every worker
says yes) for decisions each worker would otherwise take from its own clock
(a time-based save, a preemption notice).
"""

from typing import Callable, Tuple

import tensorflow as tf


def votes(strategy: tf.distribute.Strategy, lockstep_workers: bool
          ) -> Tuple[Callable[[bool], bool], Callable[[bool], bool]]:
  """(any worker says yes, all workers say yes) for this cluster.

  Lockstep workers (`StrategySpec.lockstep_workers`) run the same calls and
  saves (saving runs collectives), so decisions taken from their own clocks
  are all-reduced; any other process decides alone.
  """
  if not lockstep_workers:
    return (lambda flag: flag), (lambda flag: flag)

  @tf.function
  def count(flag):
    flags = strategy.run(lambda f: f, args=(flag,))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, flags, axis=None)

  def yes(flag: bool) -> int:
    return int(count(tf.constant(int(flag))))

  replicas = strategy.num_replicas_in_sync
  return (lambda flag: yes(flag) > 0), (lambda flag: yes(flag) == replicas)
