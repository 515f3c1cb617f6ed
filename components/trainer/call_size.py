"""Steps per call (`steps_per_execution`): a fixed number, or 'auto'.

A call of k steps costs about `H + k * D`: H the per-call host overhead
(Python, the loop driver, function dispatch, the loss read-back), D the time
of one step. The time per step, `D + H / k`, only falls as k grows, so a
longer call is never slower; what bounds k is how long a call may take (a
preemption notice, a time-based save or a progress line waits for the call).

'auto' measures H and D from the loop's own calls, each call timed from its
start to the next call's start (so the driver's work between calls counts,
and an asynchronous device is timed by what it sustains): a few calls of
PROBE_SMALL steps and a few of the longest candidate that fits the call
bound, the first call of each new length left out (it may trace). It
chooses the shortest candidate whose overhead is at most
AUTO_OVERHEAD_FRACTION of the step time, within AUTO_MAX_CALL_SECONDS.
The time per step of the chosen calls is then watched: when it moves by
more than AUTO_REGIME_CHANGE (the first epoch filling the input cache,
another job taking the CPU), 'auto' measures again. Every measurement and
the reason of each choice are kept (`describe`) for `model_run`.

Pure logic, no TensorFlow: tested with synthetic timings. Workers of a
multi-worker cluster must run the same calls, so they do not use 'auto'
(the loop fixes their call length).
"""

import dataclasses
import statistics
from typing import Any, Dict, List, Optional, Tuple, Union

from components.trainer import progress
from components.trainer.config import AUTO

AUTO_CANDIDATES = (1, 4, 16, 64, 256, 1024, 4096)
# The short probe: long enough to run the multi-step loop, short enough
# that the per-call overhead shows.
PROBE_SMALL = 4
# Measured calls per probed length (after the one left out); the fastest
# counts: noise on a shared machine only adds time.
PROBE_CALLS = 3
# 'auto' keeps a call this short, so that a preemption notice, a time-based
# save or a progress line waits at most about this long.
AUTO_MAX_CALL_SECONDS = 0.5
# The overhead left per step at the chosen length, as a fraction of a
# step's time.
AUTO_OVERHEAD_FRACTION = 0.01
# Time per step at the chosen length moving by this factor (either way)
# over WATCH_CALLS calls: measure again.
AUTO_REGIME_CHANGE = 1.5
WATCH_CALLS = 5
# Measurements in all (the first and the re-checks), so that a machine
# whose speed keeps changing does not keep training in probes.
AUTO_MAX_PROBES = 4


@dataclasses.dataclass
class Choice:
  """One measurement and what it decided."""
  step: int
  seconds_per_call: Dict[int, float]  # Fastest measured call by length.
  host_overhead_s: float
  step_s: float
  chosen: int
  reason: str

  def to_dict(self) -> Dict[str, Any]:
    return {'step': self.step,
            'seconds_per_call': {str(k): round(v, 7) for k, v in
                                 sorted(self.seconds_per_call.items())},
            'host_overhead_s': round(self.host_overhead_s, 7),
            'step_s': round(self.step_s, 7), 'chosen': self.chosen,
            'reason': self.reason}


def fit(seconds_per_call: Dict[int, float]
       ) -> Optional[Tuple[float, float]]:
  """(H, D) of `t = H + k * D` through the shortest and longest lengths;
  None with one length, or where noise gives D <= 0 or an H below
  AUTO_OVERHEAD_FRACTION of the shortest call (no host overhead is that
  small: it is lost in the noise)."""
  lengths = sorted(seconds_per_call)
  if len(lengths) < 2:
    return None
  shortest, longest = lengths[0], lengths[-1]
  step = ((seconds_per_call[longest] - seconds_per_call[shortest]) /
          (longest - shortest))
  overhead = seconds_per_call[shortest] - shortest * step
  if step <= 0 or overhead < (AUTO_OVERHEAD_FRACTION *
                              seconds_per_call[shortest]):
    return None
  return overhead, step


def candidates(max_call: Optional[int] = None) -> Tuple[int, ...]:
  """AUTO_CANDIDATES up to `max_call` (the checkpoint interval: no call
  crosses it), and `max_call` itself."""
  if not max_call:
    return AUTO_CANDIDATES
  return tuple(k for k in AUTO_CANDIDATES if k < max_call) + (max_call,)


def longest_within(step_s: float, overhead_s: float,
                   lengths: Tuple[int, ...] = AUTO_CANDIDATES) -> int:
  """The longest of `lengths` whose call stays within
  AUTO_MAX_CALL_SECONDS (at least the shortest)."""
  fitting = [k for k in lengths
             if overhead_s + k * step_s <= AUTO_MAX_CALL_SECONDS]
  return max(fitting) if fitting else lengths[0]


def choose(seconds_per_call: Dict[int, float],
           lengths: Tuple[int, ...] = AUTO_CANDIDATES
          ) -> Tuple[int, float, float, str]:
  """(k, H, D, reason) from the fastest call of each measured length.

  Without a usable fit the overhead counts as 0 and a step as the longest
  calls' time per step (an upper bound), and the choice is the longest call
  within the bound: a longer call is never slower, so doubt goes that way.
  """
  fitted = fit(seconds_per_call)
  if fitted is None:
    longest = max(seconds_per_call)
    step = seconds_per_call[longest] / longest
    k = longest_within(step, 0.0, lengths)
    return k, 0.0, step, (
        f'{step * 1e3:.4f} ms per step at {longest} steps per call, the '
        f'overhead not measurable apart (calls of '
        f'{sorted(seconds_per_call)} steps): {k} steps per call, the '
        f'longest call within {AUTO_MAX_CALL_SECONDS} s')
  overhead, step = fitted
  cap = longest_within(step, overhead, lengths)
  # Not shorter than the calls measured: one step per call runs another
  # function, whose overhead was not measured.
  enough = [k for k in lengths
            if min(seconds_per_call) <= k <= cap and
            overhead <= AUTO_OVERHEAD_FRACTION * k * step]
  if enough:
    k = min(enough)
    why = (f'host overhead {overhead * 1e3:.3f} ms per call vs '
           f'{step * 1e3:.4f} ms per step: at {k} steps per call the '
           f'overhead is {100 * overhead / (k * step):.2f}% of a step '
           f'(target <= {100 * AUTO_OVERHEAD_FRACTION:g}%)')
  else:
    k = cap
    why = (f'host overhead {overhead * 1e3:.3f} ms per call vs '
           f'{step * 1e3:.4f} ms per step: {k} steps per call, the longest '
           f'call within {AUTO_MAX_CALL_SECONDS} s (overhead '
           f'{100 * overhead / (k * step):.2f}% of a step)')
  return k, overhead, step, why


class CallSizer:
  """Steps per call for the loop driver (see the module doc).

  The driver asks `size()` before each call and reports every call with
  `observe(steps, seconds, step)`; calls it could not run at the asked
  length (a save boundary, the end of training) and calls that saved are
  reported with `measured=False`.
  """

  def __init__(self, setting: Union[int, str],
               max_call: Optional[int] = None):
    self.auto = setting == AUTO
    self.lengths = candidates(max_call)
    self.chosen = self.lengths[-1] if self.auto else int(setting)
    self.choices: List[Choice] = []
    self._probe: Optional[List[int]] = None  # Lengths still to measure.
    self._samples: Dict[int, List[float]] = {}
    self._seen: set = set()  # Lengths run at least once (traced).
    self._watch: List[float] = []
    self._expected: Optional[float] = None  # Seconds per step when chosen.
    if self.auto:
      self._start_probe()

  @property
  def searching(self) -> bool:
    return self._probe is not None

  def _start_probe(self) -> None:
    self._probe = [min(PROBE_SMALL, self.lengths[-1])]
    self._samples = {}
    self._watch = []

  def size(self) -> int:
    return self._probe[0] if self._probe else self.chosen

  def observe(self, steps: int, seconds: float, step: int,
              measured: bool = True) -> None:
    """A call of `steps` steps took `seconds` (start to next start) and
    ended at `step`."""
    if not self.auto or steps <= 0:
      return
    first_of_length = steps not in self._seen
    self._seen.add(steps)
    if not measured or first_of_length or steps != self.size():
      return
    if self._probe:
      self._probe_call(steps, seconds, step)
    else:
      self._watch_call(steps, seconds, step)

  def _probe_call(self, steps: int, seconds: float, step: int) -> None:
    samples = self._samples.setdefault(steps, [])
    samples.append(seconds)
    if len(samples) < PROBE_CALLS:
      return
    self._probe.pop(0)
    if len(self._samples) == 1:
      # The longest length worth measuring: what fits the call bound at
      # the short calls' time per step (an upper bound on a step's time).
      large = longest_within(min(samples) / steps, 0.0, self.lengths)
      if large > steps:
        self._probe.append(large)
    if self._probe:
      return
    fastest = {k: min(v) for k, v in self._samples.items()}
    k, overhead, step_s, why = choose(fastest, self.lengths)
    self.chosen = k
    self.choices.append(Choice(step, fastest, overhead, step_s, k, why))
    progress.LOGGER.info('steps_per_execution=auto chose %d at step %d: %s.',
                         k, step, why)
    self._probe = None
    self._expected = (overhead + k * step_s) / k

  def _watch_call(self, steps: int, seconds: float, step: int) -> None:
    self._watch.append(seconds / steps)
    if len(self._watch) < WATCH_CALLS:
      return
    now = statistics.median(self._watch)
    self._watch = []
    ratio = now / self._expected
    if (max(ratio, 1 / ratio) > AUTO_REGIME_CHANGE and
        len(self.choices) < AUTO_MAX_PROBES):
      self._start_probe()
    else:
      # Follow slow drift, so that only a clear change re-measures.
      self._expected = now

  def describe(self) -> Dict[str, Any]:
    """What training_result.json records."""
    described = {'steps_per_execution': self.chosen}
    if self.auto:
      described['steps_per_execution_auto'] = [c.to_dict()
                                               for c in self.choices]
    return described
