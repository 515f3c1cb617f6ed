"""Steps per call (`steps_per_execution`): a fixed number, or 'auto'.

A call of k steps costs about `H + k * D` (H the per-call host overhead, D a
step), so longer calls are cheaper per step by H / k; but H is a few
milliseconds, the difference of noisy call times on a machine whose speed
drifts. So 'auto' compares lengths by what they sustain, their calls
interleaved: it times the loop's own calls (start to start, less any
checkpoint saved between them, the first call of each traced function left
out), bounds a step's time with short probes, then lets each longer
candidate that fits AUTO_MAX_CALL_SECONDS and can still pay (AUTO_MIN_GAIN)
challenge the winner; the longer wins unless the shorter is faster by more
than AUTO_SHORTER_MARGIN in every pair of neighbouring calls. A move of the
time per step beyond AUTO_REGIME_CHANGE measures again. Every measurement
and reason is kept (`describe`) for `model_run`.

Pure logic, no TensorFlow. Lockstep workers never size calls by their own
clocks: their strategy's `auto_steps_per_call` fixes the length.
"""

import dataclasses
import statistics
from typing import Any, Dict, List, Optional, Tuple, Union

from components.trainer.config import AUTO
from components.trainer.common import progress

AUTO_CANDIDATES = (1, 4, 16, 64, 256, 1024, 4096)
# The short probe: long enough to run the multi-step loop, short enough
# that the per-call overhead shows.
PROBE_SMALL = 4
# Measured calls per probed length (after the one left out); the median
# counts, so that neither one slow call (another job) nor one fast call
# decides.
PROBE_CALLS = 3
# 'auto' keeps a call this short, so that a preemption notice (30 s of
# grace on GCE and Kubernetes by default), a time-based save or a progress
# line waits at most about this long.
AUTO_MAX_CALL_SECONDS = 2.0
# A shorter length is chosen over a longer one only if it is this much
# faster per step.
AUTO_SHORTER_MARGIN = 0.05
# The climb stops where the next length could save at most this fraction
# of a step's time (with the short calls' time as the overhead).
AUTO_MIN_GAIN = 0.01
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
  seconds_per_call: Dict[int, float]  # Median measured call by length.
  host_overhead_s: Optional[float]  # The fit's H and D, where it has one.
  step_s: Optional[float]
  chosen: int
  reason: str

  def to_dict(self) -> Dict[str, Any]:
    rounded = lambda v: None if v is None else round(v, 7)
    return {'step': self.step,
            'seconds_per_call': {str(k): round(v, 7) for k, v in
                                 sorted(self.seconds_per_call.items())},
            'host_overhead_s': rounded(self.host_overhead_s),
            'step_s': rounded(self.step_s), 'chosen': self.chosen,
            'reason': self.reason}


def fit(seconds_per_call: Dict[int, float]
       ) -> Optional[Tuple[float, float]]:
  """(H, D) of `t = H + k * D` through the shortest and longest lengths;
  None with one length, or where the calls do not follow the model (D <= 0
  or H < 0)."""
  lengths = sorted(seconds_per_call)
  if len(lengths) < 2:
    return None
  shortest, longest = lengths[0], lengths[-1]
  step = ((seconds_per_call[longest] - seconds_per_call[shortest]) /
          (longest - shortest))
  overhead = seconds_per_call[shortest] - shortest * step
  if step <= 0 or overhead < 0:
    return None
  return overhead, step


def candidates(max_call: Optional[int] = None) -> Tuple[int, ...]:
  """AUTO_CANDIDATES up to `max_call` (the checkpoint interval: no call
  crosses it), and `max_call` itself."""
  if not max_call:
    return AUTO_CANDIDATES
  return tuple(k for k in AUTO_CANDIDATES if k < max_call) + (max_call,)


def longest_within(step_s: float,
                   lengths: Tuple[int, ...] = AUTO_CANDIDATES) -> int:
  """The longest of `lengths` whose call, at `step_s` a step, stays within
  AUTO_MAX_CALL_SECONDS (at least the shortest)."""
  fitting = [k for k in lengths if k * step_s <= AUTO_MAX_CALL_SECONDS]
  return max(fitting) if fitting else lengths[0]


def long_probes(longest: int, small: int,
                lengths: Tuple[int, ...] = AUTO_CANDIDATES) -> List[int]:
  """The lengths to measure after the short calls: `longest` (the longest
  within the call bound at the short calls' time per step, an upper bound
  on a step's time) and the candidate below it (`small` itself where none
  is between); none where `longest` is not longer than `small`."""
  if longest <= small:
    return []
  return [longest, max(k for k in lengths if small <= k < longest)]


def choose(calls: Dict[int, List[float]]) -> Tuple[int, str]:
  """(k, reason) from the interleaved calls (seconds, in order) of two
  lengths: the longer, unless the shorter is faster per step by more than
  AUTO_SHORTER_MARGIN in every pair of neighbouring calls. By the call model
  the longer is faster, and on a VM whose speed moves for stretches a slow
  stretch lands more often on the longer calls (they last longer), so a
  median or two alone must not pick the shorter."""
  shorter, longer = sorted(calls)
  pairs = list(zip(calls[longer], calls[shorter]))
  wins = sum(
      short_call / shorter < (1 - AUTO_SHORTER_MARGIN) * long_call / longer
      for long_call, short_call in pairs)
  k = shorter if wins == len(pairs) else longer
  medians = ', '.join(f'{n}: {statistics.median(calls[n]) / n * 1e3:.4f}'
                      for n in (shorter, longer))
  return k, (f'ms per step by steps per call (median of {len(pairs)} '
             f'calls) {medians}; {shorter} more than '
             f'{100 * AUTO_SHORTER_MARGIN:g}% faster in {wins} of '
             f'{len(pairs)} neighbouring calls: {k}, the longer unless the '
             f'shorter is in all')


class CallSizer:
  """Steps per call for the loop driver (see the module doc).

  The driver asks `size()` before each call and reports every call with
  `observe(steps, seconds, step)`; calls it could not run at the asked
  length (a save boundary, the end of training) and the first call of each
  of the runner's traced functions (the trace's time) are reported with
  `measured=False`, and a call's seconds leave out a checkpoint saved after
  it.
  """

  def __init__(self, setting: Union[int, str],
               max_call: Optional[int] = None):
    self.auto = setting == AUTO
    self.lengths = candidates(max_call)
    # None until 'auto' first decides: a run that ends while measuring
    # reports what it ran (`steps_by_call_length`), not a length it never
    # chose.
    self.chosen: Optional[int] = None if self.auto else int(setting)
    self.choices: List[Choice] = []
    self._probe: Optional[List[int]] = None  # Lengths still to measure.
    self._samples: Dict[int, List[float]] = {}  # Calls of the lengths compared.
    self._watch: List[float] = []
    self._expected: Optional[float] = None  # Seconds per step when chosen.
    if self.auto:
      self._start_probe()

  def _start_probe(self) -> None:
    self._probe = [min(PROBE_SMALL, self.lengths[-1])]
    self._samples = {}
    self._measured: Dict[int, float] = {}  # Median call by length.
    self._reasons: List[str] = []
    self._watch = []

  def size(self) -> int:
    """While measuring: the length with the fewest measured calls (the
    longest on a tie), so that the long lengths' calls alternate."""
    if not self._probe:
      return self.chosen
    return min(self._probe, key=lambda k: len(self._samples.get(k, ())))

  def observe(self, steps: int, seconds: float, step: int,
              measured: bool = True) -> None:
    """A call of `steps` steps took `seconds` (start to next start) and
    ended at `step`."""
    if not self.auto or steps <= 0:
      return
    if not measured or steps != self.size():
      return
    if self._probe:
      self._probe_call(steps, seconds, step)
    else:
      self._watch_call(steps, seconds, step)

  def _probe_call(self, steps: int, seconds: float, step: int) -> None:
    self._samples.setdefault(steps, []).append(seconds)
    if any(len(self._samples.get(k, ())) < PROBE_CALLS for k in self._probe):
      return
    calls, self._samples = self._samples, {}
    compared = {k: statistics.median(calls[k]) for k in self._probe}
    self._measured.update(compared)
    if len(self._measured) == 1:  # The short calls: now the long lengths.
      small_step = compared[steps] / steps
      fitting = longest_within(small_step, self.lengths)
      self._probe = long_probes(fitting, steps, self.lengths)
      if fitting < steps:  # Even the short calls exceed the bound.
        self._decide(step, fitting, (
            f'{small_step * 1e3:.1f} ms per step at {steps} steps per call: '
            f'{fitting}, the longest call within {AUTO_MAX_CALL_SECONDS} s'))
      elif not self._probe:
        self._decide(step, steps, f'{steps}, the longest call within '
                     f'{AUTO_MAX_CALL_SECONDS} s')
      return
    k, why = choose(calls)
    self._reasons.append(why)
    # The short calls' bound is loose (their overhead, and early on the
    # first epoch's reads): where the longer won and the next length fits
    # at its time per step, that one is compared with it the same way if
    # it can pay.
    longer = [n for n in self.lengths if n > k]
    if (k == max(compared) and longer and
        longer[0] * compared[k] / k <= AUTO_MAX_CALL_SECONDS):
      # A short call's whole time bounds the per-call overhead.
      short = min(self._measured)
      gain = (self._measured[short] * (1 / k - 1 / longer[0]) /
              (compared[k] / k))
      if gain > AUTO_MIN_GAIN:
        self._probe = [longer[0], k]
        return
      self._reasons.append(
          f'{longer[0]} not measured: it would save at most {gain:.2%} of '
          f'a step (the {short}-step calls, '
          f'{self._measured[short] * 1e3:.2f} ms, bound the per-call '
          f'overhead)')
    self._decide(step, k, '; '.join(self._reasons))

  def _decide(self, step: int, k: int, why: str) -> None:
    measured = self._measured
    fitted = fit(measured) or (None, None)
    self.chosen = k
    self.choices.append(Choice(step, dict(measured), *fitted, k, why))
    progress.LOGGER.info('steps_per_execution=auto chose %d at step %d: %s.',
                         k, step, why)
    self._probe = None
    per_step = {n: seconds / n for n, seconds in measured.items()}
    # A length shorter than the measured ones: the shortest's, as a start.
    self._expected = per_step.get(k, per_step[min(per_step)])

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
    """What training_result.json records: for 'auto' each choice and,
    where training ended while measuring, the comparison it was in
    (lengths, median calls so far)."""
    described: Dict[str, Any] = {'steps_per_execution': self.chosen}
    if not self.auto:
      return described
    described['steps_per_execution_auto'] = [c.to_dict()
                                             for c in self.choices]
    if self._probe:
      medians = dict(self._measured)
      medians.update({k: statistics.median(v)
                      for k, v in self._samples.items() if v})
      described['steps_per_execution_auto_pending'] = {
          'comparing': sorted(self._probe),
          'seconds_per_call': {str(k): round(v, 7)
                               for k, v in sorted(medians.items())},
          'calls': {str(k): len(v) for k, v in sorted(self._samples.items())},
          'calls_needed': PROBE_CALLS}
    return described
