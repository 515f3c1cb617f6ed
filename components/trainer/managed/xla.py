"""Whether each micro-step's forward and backward pass is compiled by XLA.

The module's `compile(jit_compile=...)` wins, as in Keras `fit`; otherwise
`distribution.xla`. Its `auto` times the step both ways at the start, on
the training's first batches (each timed call on new ones, so a model XLA
compiles again per batch shows it), with every variable written to memory
first and read back after, so the measurement trains nothing: the training
then starts from where it was, in the faster setting. A model XLA
cannot compile (string or sparse ops, variables on another device) falls
back to the plain step with XLA's reason. The choice is saved with the
checkpoints, so a resume keeps it instead of measuring again (a different
choice would change the bits of the trajectory).

`measure` is the timing logic over a `run_call(jit)`; `measure_restoring`
runs it on `probe_runner`s, with the variables kept in memory meanwhile;
`with_choice` runs a step runner as the choice says, where
`CompileErrorsNamed` turns XLA's refusal of a step it was told to compile
into a config error that names the fix (no relaunch can cure it).
"""

import dataclasses
import os
import statistics
import time
from typing import Any, Callable, Dict, Optional, Set, Tuple

import tensorflow as tf

from components.trainer.common import failures
from components.trainer.common import progress
from components.trainer.common.failures import TrainingConfigError
from components.trainer.managed import step_runners

OFF, ON, AUTO = 'off', 'on', 'auto'
# Steps in one timed call, and timed calls per setting (interleaved, after
# one untimed call each that traces and compiles): the medians decide.
PROBE_STEPS = 4
PROBE_CALLS = 3
# XLA's reason for a fallback is kept up to this length.
REASON_CHARS = 300
# Where the probe keeps the variables while it measures (in memory).
SNAPSHOT_ROOT = 'ram://hpm_xla_probe'


@dataclasses.dataclass(frozen=True)
class XlaChoice:
  """Whether XLA compiles the step, who decided and why; on model_run."""
  enabled: bool
  source: str  # 'module', 'config', 'auto' or 'checkpoint'.
  reason: str
  # 'on' / 'off': median seconds per step of the start's measurement.
  seconds_per_step: Optional[Dict[str, float]] = None

  def to_dict(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_dict(cls, value: Dict[str, Any]) -> 'XlaChoice':
    return cls(**value)


def requested(model: tf.keras.Model, option: str) -> Tuple[str, str]:
  """(setting, source): the module's `jit_compile` where it passed one to
  `compile` (tf-keras keeps None for 'not given'), else the option."""
  jit_compile = getattr(model, '_jit_compile', None)
  if jit_compile is not None:
    return (ON if jit_compile else OFF), 'module'
  return option, 'config'


def fixed(setting: str, source: str) -> XlaChoice:
  what = ('compile(jit_compile=...) in the module' if source == 'module'
          else f'distribution.xla={setting!r}')
  return XlaChoice(setting == ON, source, what)


def _why(error: Exception) -> str:
  """XLA's own line of a compile error (TF wraps it in a graph execution
  error's traceback, or a remote worker's RPC error), else the error's
  first line."""
  lines = [line.strip() for line in
           str(getattr(error, 'message', '') or error).splitlines()]
  line = next((line for line in lines if 'XLA' in line or
               'unsupported operations' in line or
               line.startswith('Trying to access resource')),
              failures.short_text(error))
  return line[:REASON_CHARS]


def measure(run_call: Callable[[bool], None],
            agree: Callable[[bool], bool],
            clock: Callable[[], float] = time.perf_counter) -> XlaChoice:
  """Times `run_call(jit)` (PROBE_STEPS steps, returning once they ran)
  with and without XLA and keeps the faster; `agree(flag)` is every
  worker's vote, so lockstep workers choose alike."""
  try:
    run_call(True)
  except (tf.errors.OpError, ValueError, TypeError,
          NotImplementedError) as error:
    agree(False)
    return XlaChoice(False, AUTO,
                     f'XLA cannot compile the step: {_why(error)}')
  run_call(False)
  times = {ON: [], OFF: []}
  for _ in range(PROBE_CALLS):
    for setting in (OFF, ON):
      began = clock()
      run_call(setting == ON)
      times[setting].append((clock() - began) / PROBE_STEPS)
  per_step = {k: round(statistics.median(v), 7) for k, v in times.items()}
  faster = per_step[ON] < per_step[OFF]
  unanimous = agree(faster)
  enabled = faster and unanimous
  reason = (f"{per_step[ON] * 1e3:.3f} ms a step with XLA, "
            f"{per_step[OFF] * 1e3:.3f} ms without: "
            f"{'XLA' if enabled else 'no XLA'}")
  if faster and not unanimous:
    reason += ' (XLA was not faster on every worker)'
  return XlaChoice(enabled, AUTO, reason, per_step)


def probe_runner(strategy: tf.distribute.Strategy, dataset_fn: Callable,
                 replica_step: Callable[[bool], Callable], jit_compile: bool,
                 host_iterator_input: bool) -> step_runners.SynchronousSteps:
  """A step runner of `replica_step(jit_compile)` over the training's first
  batches (`dataset_fn`'s), each probe call on new ones (a model XLA
  compiles again for a new batch shows it), with a counter of its own."""
  batches = (1 + PROBE_CALLS) * PROBE_STEPS * strategy.num_replicas_in_sync
  with strategy.scope():
    counter = tf.Variable(
        0, dtype=tf.int64, trainable=False,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
  return step_runners.SynchronousSteps(
      strategy, lambda context: dataset_fn(context).take(batches).repeat(),
      replica_step(jit_compile), counter, host_iterator_input)


def measure_restoring(checkpoint: tf.train.Checkpoint,
                      probe: Callable[[bool], Callable],
                      agree: Callable[[bool], bool]) -> XlaChoice:
  """`measure` on the step runners `probe(jit)` (one per setting), with
  every variable of `checkpoint` written to memory before and read back
  after, so the probe steps train nothing."""
  snapshot = checkpoint.write(
      f'{SNAPSHOT_ROOT}/{os.getpid()}_{id(checkpoint)}/state')
  runners = {}

  def run_call(jit_compile: bool) -> None:
    if jit_compile not in runners:
      runners[jit_compile] = probe(jit_compile)
    _, loss = runners[jit_compile](0, PROBE_STEPS)
    float(loss)  # Waits for the steps.

  try:
    return measure(run_call, agree)
  finally:
    checkpoint.read(snapshot).assert_existing_objects_matched()
    tf.io.gfile.rmtree(os.path.dirname(snapshot))


def with_choice(runner, choice: XlaChoice):
  """`runner` as `choice` runs it: logged where it is not the default, its
  compile errors named where XLA is on."""
  if choice.enabled or choice.source != 'config':
    progress.LOGGER.info('XLA %s (%s: %s).', 'on' if choice.enabled else 'off',
                         choice.source, choice.reason)
  return CompileErrorsNamed(runner, choice) if choice.enabled else runner


# What TF's XLA bridge (tf2xla, `xla_ops.cc`) says of a step it could not
# compile; a runtime error of a compiled step says none of them.
_COMPILE_ORIGINS = ('Detected unsupported operations when trying to compile',
                    'tf2xla conversion failed',
                    'XLA compilation requires',
                    'must be a compile-time constant')


def _is_compile_error(error: Exception, first_call: bool) -> bool:
  """A compile error: raised by the call that compiles the step (the first
  of its length), of the types TF's XLA bridge raises, naming the bridge."""
  return (first_call and isinstance(error, (tf.errors.InvalidArgumentError,
                                            tf.errors.UnimplementedError))
          and any(origin in str(error) for origin in _COMPILE_ORIGINS))


class CompileErrorsNamed:
  """A step runner whose XLA compile errors say which setting to change."""

  def __init__(self, runner, choice: XlaChoice):
    self._runner = runner
    self._choice = choice
    self.traced_function = runner.traced_function
    # The step functions that have compiled: each compiles on its first
    # call (`traced_function(k)` names the one that runs k steps).
    self._compiled: Set[str] = set()

  def __call__(self, current: int, k: int):
    try:
      result = self._runner(current, k)
    except (tf.errors.InvalidArgumentError,
            tf.errors.UnimplementedError) as error:
      first_call = self.traced_function(k) not in self._compiled
      if not _is_compile_error(error, first_call):
        raise
      fix = ('remove jit_compile=True from the module\'s compile()'
             if self._choice.source == 'module' else
             "set distribution.xla='auto' (falls back by itself) or 'off'")
      raise TrainingConfigError(
          f'XLA cannot compile the training step ({_why(error)}): {fix}.'
      ) from error
    self._compiled.add(self.traced_function(k))
    return result
