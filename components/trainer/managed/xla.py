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

`measure` is the timing logic over a `run_call(jit)` the loop supplies;
`CompileErrorsNamed` turns XLA's refusal of a step it was told to compile
into a config error that names the fix (no relaunch can cure it).
"""

import dataclasses
import statistics
import time
from typing import Any, Callable, Dict, Optional, Tuple

import tensorflow as tf

from components.trainer.common import failures
from components.trainer.common.failures import TrainingConfigError

OFF, ON, AUTO = 'off', 'on', 'auto'
# Steps in one timed call, and timed calls per setting (interleaved, after
# one untimed call each that traces and compiles): the medians decide.
PROBE_STEPS = 4
PROBE_CALLS = 3
# XLA's reason for a fallback is kept up to this length.
REASON_CHARS = 300


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


def _is_compile_error(error: Exception) -> bool:
  text = str(error)
  return 'unsupported operations' in text or 'xla' in text.lower()


class CompileErrorsNamed:
  """A step runner whose XLA compile errors say which setting to change."""

  def __init__(self, runner, choice: XlaChoice):
    self._runner = runner
    self._choice = choice
    self.traced_function = runner.traced_function

  def __call__(self, current: int, k: int):
    try:
      return self._runner(current, k)
    except tf.errors.InvalidArgumentError as error:
      if not _is_compile_error(error):
        raise
      fix = ('remove jit_compile=True from the module\'s compile()'
             if self._choice.source == 'module' else
             "set distribution.xla='auto' (falls back by itself) or 'off'")
      raise TrainingConfigError(
          f'XLA cannot compile the training step ({_why(error)}): {fix}.'
      ) from error
