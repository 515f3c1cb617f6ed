"""steps_per_execution='auto': the decision logic on synthetic timings."""

import pytest

from components.trainer.managed import call_size
from components.trainer.managed import step_runners


class _Machine:
  """Seconds of a call of k steps: `overhead + k * step` from `step_at`
  (a function of the training step, so the regime can change)."""

  def __init__(self, overhead, step_at, first_call_extra=5.0):
    self.overhead, self.step_at = overhead, step_at
    # A trace: the runners' function for single steps, and the one for any
    # longer call (its length a tensor).
    self.first_call_extra = first_call_extra
    self._traced = set()
    self.lengths = []  # Of every call, in order.

  def seconds(self, k, step):
    self.lengths.append(k)
    extra = 0.0 if min(k, 2) in self._traced else self.first_call_extra
    self._traced.add(min(k, 2))
    return extra + self.overhead + k * self.step_at(step)


def _train(sizer, machine, train_steps, save_every=None):
  """What the driver does: calls capped at save boundaries and the end, the
  first call of each of a synchronous runner's traces not measured."""
  step, traced = 0, set()
  while step < train_steps:
    asked = sizer.size()
    boundary = ((step // save_every + 1) * save_every if save_every
                else train_steps)
    k = min(asked, train_steps - step, boundary - step)
    function = step_runners.SynchronousSteps.traced_function(k)
    first_of_function = function not in traced
    traced.add(function)
    seconds = machine.seconds(k, step)
    step += k
    sizer.observe(k, seconds, step,
                  measured=k == asked and not first_of_function)
  return sizer


def test_where_longer_calls_are_faster_auto_climbs_to_the_bound():
  # 2 ms per call, 20 us per step: the short calls' 0.52 ms per step bounds
  # a call of 2 s at 3846 steps -> 1024 against 256; 1024 wins and 4096
  # fits at its 22 us per step -> 4096 against 1024.
  sizer = _train(call_size.CallSizer('auto'),
                 _Machine(2e-3, lambda step: 2e-5), 100_000)
  [choice] = sizer.describe()['steps_per_execution_auto']
  assert sizer.chosen == 4096 == choice['chosen']
  assert sorted(map(int, choice['seconds_per_call'])) == [4, 256, 1024, 4096]
  assert choice['host_overhead_s'] == pytest.approx(2e-3)
  assert choice['step_s'] == pytest.approx(2e-5)
  assert choice['reason'].count('the longer unless') == 2
  assert choice['reason'].endswith(
      '1024 more than 5% faster in 0 of 3 neighbouring calls: 4096, the '
      'longer unless the shorter is in all')


def test_slow_short_calls_do_not_hold_the_choice_down():
  # The first steps read the first epoch (10 ms a step), so the short
  # calls bound a call at 195 steps -> 64 against 16; the climb goes on
  # at the long calls' own time per step to 1024 (4096 would take 4 s).
  sizer = _train(call_size.CallSizer('auto'),
                 _Machine(1e-3, lambda step: 1e-2 if step < 50 else 1e-3),
                 50_000)
  [choice] = sizer.choices
  assert sorted(choice.seconds_per_call) == [4, 16, 64, 256, 1024]
  assert sizer.chosen == 1024


class _SlowerLongCalls(_Machine):
  """Beyond `knee` steps a call runs each further step `factor` slower:
  whatever makes a length slow, the measurement decides, not the model."""

  def __init__(self, knee, factor, **kwargs):
    super().__init__(1e-3, lambda step: 1e-3, **kwargs)
    self.knee, self.factor = knee, factor

  def seconds(self, k, step):
    extra = max(0, k - self.knee) * 1e-3 * (self.factor - 1)
    return super().seconds(k, step) + extra


def test_the_climb_stops_where_the_next_length_cannot_pay():
  # 3 ms per call, 0.4 ms per step: the 4-step calls (4.6 ms) bound a call
  # at 1024 steps, which wins over 256. 4096 would fit at 0.403 ms per
  # step, but the 4-step calls' whole time as the overhead saves at most
  # 4.6 ms * (1/1024 - 1/4096) = 3.4 us a step, 0.84%: not measured.
  sizer = _train(call_size.CallSizer('auto'),
                 _Machine(3e-3, lambda step: 4e-4), 20_000)
  [choice] = sizer.choices
  assert sorted(choice.seconds_per_call) == [4, 256, 1024]
  assert sizer.chosen == 1024
  assert '4096 not measured: it would save at most 0.84% of a step' in (
      choice.reason)
  assert choice.step == 16 + 3 * (1024 + 256)


def test_a_longer_call_that_is_slower_per_step_is_not_chosen():
  sizer = _train(call_size.CallSizer('auto'), _SlowerLongCalls(256, 1.3),
                 50_000)
  [choice] = sizer.choices
  assert sorted(choice.seconds_per_call) == [4, 256, 1024]
  assert sizer.chosen == 256
  # The model's fit through 4 and 1024 is recorded, not used.
  assert choice.host_overhead_s is not None


def test_the_long_lengths_alternate_so_both_see_the_same_machine():
  # The machine is 3x slower from step 1500 to 4000 (another job): 1024
  # measured first and 256 after would have put 256's calls in the slow
  # part only. Interleaved, each length has calls on both sides.
  machine = _Machine(1e-3, lambda step: 3e-3 if 1500 <= step < 4000
                     else 1e-3)
  sizer = _train(call_size.CallSizer('auto'), machine, 20_000)
  assert machine.lengths[:10] == [4] * 4 + [1024, 256] * 3
  assert sizer.chosen == 1024


def test_noise_alone_does_not_pick_the_shorter_length():
  # The call model favours the longer call: a shorter one must be faster
  # per step by more than the margin, in every pair of neighbouring calls.
  def calls(longer_factors):
    return {256: [256e-3] * 3,
            1024: [1024e-3 * factor for factor in longer_factors]}

  assert call_size.choose(calls([1.03] * 3))[0] == 1024
  assert call_size.choose(calls([1.1] * 3))[0] == 256
  # A slow stretch on two of the longer calls moved the median: not enough.
  k, why = call_size.choose(calls([1.3, 1.3, 1.0]))
  assert k == 1024
  assert '256 more than 5% faster in 2 of 3 neighbouring calls' in why


def test_the_call_bound_caps_long_steps():
  # 10 ms steps: the short calls bound a call at 2 s / 11.25 ms -> 64
  # steps, then 16 is measured beside it.
  sizer = _train(call_size.CallSizer('auto'),
                 _Machine(5e-3, lambda step: 1e-2), 2_000)
  [choice] = sizer.choices
  assert sorted(choice.seconds_per_call) == [4, 16, 64]
  assert sizer.chosen == 64


def test_steps_longer_than_the_bound_allows_at_the_short_length():
  # 1 s steps: 4 steps per call take 4 s, over the 2 s bound; calls of 1.
  sizer = _train(call_size.CallSizer('auto'),
                 _Machine(1e-3, lambda step: 1.0), 40)
  [choice] = sizer.choices
  assert sizer.chosen == 1 and sizer.size() == 1
  assert 'longest call within' in choice.reason


def test_the_first_call_of_each_traced_function_is_left_out():
  # A 5 s trace on the first multi-step call would otherwise decide; a new
  # length does not trace, so its first call counts.
  machine = _Machine(1e-3, lambda step: 1e-3, first_call_extra=5.0)
  sizer = _train(call_size.CallSizer('auto'), machine, 50_000)
  [choice] = sizer.choices
  assert choice.seconds_per_call[4] == pytest.approx(1e-3 + 4e-3)
  assert choice.seconds_per_call[1024] == pytest.approx(1e-3 + 1024e-3)
  assert sizer.chosen == 1024
  # 1 + 3 calls of 4 steps, then 3 each of 1024 and 256: no call of a new
  # length spent unmeasured.
  probed = machine.lengths[:10]
  assert {k: probed.count(k) for k in set(probed)} == {4: 4, 1024: 3, 256: 3}
  assert choice.step == 16 + 3 * (1024 + 256)


def test_the_median_probe_call_counts():
  machine = _Machine(1e-3, lambda step: 1e-3)
  calls = []
  seconds = machine.seconds

  def noisy(k, step):
    calls.append(k)
    # One measured call of every length is slowed by 1 s, another sped up
    # (the first call of 4 steps traces, is not measured).
    change = {3: 1.0, 2 if k > 4 else 4: -1e-3}.get(calls.count(k), 0.0)
    return seconds(k, step) + change

  machine.seconds = noisy
  sizer = _train(call_size.CallSizer('auto'), machine, 50_000)
  [choice] = sizer.choices
  assert choice.seconds_per_call[256] == pytest.approx(1e-3 + 256e-3)
  assert sizer.chosen == 1024


def test_a_regime_change_measures_again():
  # Another job leaves the machine at step 3000 and steps get 10x faster:
  # the first choice is made on the slow steps (where 1024 steps would
  # exceed the call bound), the second on the fast ones.
  sizer = _train(call_size.CallSizer('auto'),
                 _Machine(2e-3, lambda step: 2e-3 if step < 3000 else 2e-4),
                 60_000)
  first, second = sizer.choices
  assert first.chosen == 256 and first.step < 3000
  assert sorted(first.seconds_per_call) == [4, 64, 256]
  assert second.chosen == 4096 and second.step > 3000
  assert sizer.chosen == 4096
  assert [c['chosen'] for c in sizer.describe()[
      'steps_per_execution_auto']] == [256, 4096]


def test_a_speed_that_keeps_changing_is_measured_a_bounded_number_of_times():
  sizer = _train(call_size.CallSizer('auto'),
                 _Machine(2e-3, lambda step: 2e-3 if step // 3000 % 2
                          else 1e-4), 200_000)
  assert len(sizer.choices) == call_size.AUTO_MAX_PROBES


def test_calls_never_cross_the_checkpoint_interval():
  # Saving every 100 steps: 100 is a length of its own, and chosen where
  # the overhead calls for long calls.
  sizer = _train(call_size.CallSizer('auto', max_call=100),
                 _Machine(2e-3, lambda step: 2e-5), 20_000, save_every=100)
  assert call_size.candidates(100) == (1, 4, 16, 64, 100)
  assert sizer.chosen == 100


def test_a_run_that_ends_while_measuring_reports_what_it_ran():
  # 0.45 ms per step in 4-step calls bounds a call at 4096 steps; 2,500
  # steps end in the first call of 4096 (cut to 2,484), before 4096 and
  # 1024 are compared: no length is reported as chosen, only the pending
  # comparison.
  sizer = _train(call_size.CallSizer('auto'),
                 _Machine(1e-3, lambda step: 2e-4), 2_500)
  described = sizer.describe()
  assert sizer.chosen is None and described['steps_per_execution'] is None
  assert described['steps_per_execution_auto'] == []
  pending = described['steps_per_execution_auto_pending']
  assert pending['comparing'] == [1024, 4096]
  assert pending['seconds_per_call'] == {'4': pytest.approx(1.8e-3)}
  assert pending['calls_needed'] == call_size.PROBE_CALLS


def test_the_next_length_above_the_short_calls_is_compared_with_them():
  # Saving every 5 steps: 5 is the only length above the 4-step calls.
  sizer = _train(call_size.CallSizer('auto', max_call=5),
                 _Machine(1e-3, lambda step: 1e-4), 200, save_every=5)
  [choice] = sizer.choices
  assert sorted(choice.seconds_per_call) == [4, 5]
  assert sizer.chosen == 5


def test_a_fixed_setting_is_kept():
  sizer = _train(call_size.CallSizer(7), _Machine(1e-3, lambda s: 1e-3), 100)
  assert sizer.size() == 7
  assert sizer.describe() == {'steps_per_execution': 7}


def test_fit_of_the_call_model():
  assert call_size.fit({4: 4e-3 + 2e-3, 256: 256e-3 + 2e-3}) == (
      pytest.approx(2e-3), pytest.approx(1e-3))
  assert call_size.fit({4: 1e-2}) is None
  assert call_size.fit({4: 1e-2, 64: 1e-3}) is None  # D < 0: noise.
