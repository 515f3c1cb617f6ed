"""The threads of TensorFlow's intra-op pool in a training process.

TensorFlow's default gives the pool every core. On a CPU-only worker the
input pipeline (tf.data's own threads) then competes with a pool that spins
between ops, and ops of small models gain little from being split
(`benchmarks/results/ceiling.md`). 'auto' therefore leaves one core to the
input pipeline where there is no GPU and the model is small; a model of
COMPUTE_BOUND_WEIGHTS weights or more (each example costs at least as many
multiply-adds) is bound by its ops, which get every core
(`benchmarks/results/precision.md`); with GPUs the ops run there and
TensorFlow's default stays.

The pool is fixed when TensorFlow's runtime starts: `configure` runs at
process start, before any op. No TFX import.
"""

import os
from typing import Any, Dict, Optional, Union

AUTO = 'auto'
# From this many weights a model's step is bound by its ops on a CPU, not by
# its input: the taxi model (17k) trained faster with one op thread of two,
# a 110k-weight CNN, a 0.5M Transformer and a 1.6M MLP with both.
COMPUTE_BOUND_WEIGHTS = 50_000


def compute_bound(model_weights: Optional[int]) -> bool:
  """The model's ops, not its input, bound a CPU step (None: unknown)."""
  return model_weights is not None and model_weights >= COMPUTE_BOUND_WEIGHTS


def check(value: Union[int, str]) -> None:
  """Raises ValueError unless `value` is 'auto' or an int >= 0."""
  if value == AUTO or (isinstance(value, int) and
                       not isinstance(value, bool) and value >= 0):
    return
  raise ValueError(f'intra_op_threads={value!r} must be {AUTO!r} or an '
                   "integer >= 0 (0: TensorFlow's default, every core).")


def usable_cores() -> int:
  """The cores this process may run on (its affinity, e.g. a container's
  cpuset), not the machine's."""
  return len(os.sched_getaffinity(0))


def choose(value: Union[int, str], cores: int, has_gpu: bool,
           model_weights: Optional[int] = None):
  """(threads, reason): 0 threads keeps TensorFlow's default."""
  if value != AUTO:
    return value, ('set in the config' if value else
                   "TensorFlow's default (0 in the config)")
  if has_gpu:
    return 0, "GPUs run the ops: TensorFlow's default"
  if compute_bound(model_weights):
    return 0, (f'no GPU, a model of {model_weights:,} weights: its ops bound '
               f"the step, TensorFlow's default (all {cores} cores)")
  threads = max(1, cores - 1)
  return threads, (f'no GPU: {threads} of {cores} usable core(s) for ops, '
                   'the rest for the input pipeline')


def configure(value: Union[int, str], shared_process: bool = False,
              model_weights: Optional[int] = None) -> Dict[str, Any]:
  """Sets the pool before TensorFlow runs; returns what was chosen and why.

  In a `shared_process` (launcher `in_process`: the executor's, where the
  pipeline's other components run too) 'auto' leaves the pool alone: the
  pool is the whole process's, and a Transform or Evaluator after the
  Trainer would run on it (a Transform's float analyzers then sum in
  another order than the stock one's). Where the runtime already started,
  'auto' leaves the pool as it is and says so; an explicit count is an
  error naming what to change.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cores = usable_cores()
  if shared_process and value == AUTO:
    return {'threads': 0, 'usable_cores': cores,
            'reason': "launcher 'in_process': the process is the pipeline's, "
                      "TensorFlow's pool is left as it is"}
  threads, reason = choose(value, cores, bool(
      tf.config.list_physical_devices('GPU')), model_weights)
  current = tf.config.threading.get_intra_op_parallelism_threads()
  if threads and threads != current:
    try:
      tf.config.threading.set_intra_op_parallelism_threads(threads)
    except RuntimeError as e:
      if value != AUTO:
        raise RuntimeError(
            f'intra_op_threads={value} needs a TensorFlow runtime that has '
            f'not started yet: {e} Use launcher=\'local\' (a fresh training '
            'process) or intra_op_threads=\'auto\'.') from e
      threads, reason = 0, ('TensorFlow already ran in this process: its '
                            'pool is left as it is')
  return {'threads': threads, 'usable_cores': cores, 'reason': reason}
