"""steps_per_execution='auto': the decision logic on synthetic timings."""

import pytest

from components.trainer import call_size


class _Machine:
  """Seconds of a call of k steps: `overhead + k * step` from `step_at`
  (a function of the training step, so the regime can change)."""

  def __init__(self, overhead, step_at, first_call_extra=5.0):
    self.overhead, self.step_at = overhead, step_at
    self.first_call_extra = first_call_extra  # A trace, on each new length.
    self._seen = set()

  def seconds(self, k, step):
    extra = 0.0 if k in self._seen else self.first_call_extra
    self._seen.add(k)
    return extra + self.overhead + k * self.step_at(step)


def _train(sizer, machine, train_steps, save_every=None):
  """What the driver does: calls capped at save boundaries and the end."""
  step = 0
  while step < train_steps:
    asked = sizer.size()
    boundary = ((step // save_every + 1) * save_every if save_every
                else train_steps)
    k = min(asked, train_steps - step, boundary - step)
    seconds = machine.seconds(k, step)
    step += k
    sizer.observe(k, seconds, step, measured=k == asked)
  return sizer


def test_overhead_against_step_time_decides():
  # 2 ms per call, 20 us per step: 1024 steps bring the overhead to 10%,
  # 4096 to 2.4%, both within 0.5 s; 4096 is the longest candidate.
  sizer = _train(call_size.CallSizer('auto'),
                 _Machine(2e-3, lambda step: 2e-5), 100_000)
  [choice] = sizer.describe()['steps_per_execution_auto']
  assert sizer.chosen == 4096 == choice['chosen']
  assert choice['host_overhead_s'] == pytest.approx(2e-3)
  assert choice['step_s'] == pytest.approx(2e-5)
  assert 'longest call' in choice['reason']


def test_the_shortest_call_that_makes_the_overhead_small_enough():
  # 1 ms per call, 1 ms per step: 1% needs 100 steps per call -> 256.
  sizer = _train(call_size.CallSizer('auto'),
                 _Machine(1e-3, lambda step: 1e-3), 5_000)
  assert sizer.chosen == 256
  [choice] = sizer.choices
  assert '0.39% of a step' in choice.reason


def test_the_call_bound_caps_long_steps():
  # 10 ms steps: 64 steps would take 0.64 s, over the 0.5 s bound.
  sizer = _train(call_size.CallSizer('auto'),
                 _Machine(5e-3, lambda step: 1e-2), 2_000)
  assert sizer.chosen == 16


def test_without_a_measurable_overhead_the_longest_call_is_chosen():
  # Noise can hide the overhead (here the fit finds none): the choice
  # must not fall back to short calls.
  sizer = _train(call_size.CallSizer('auto'),
                 _Machine(0.0, lambda step: 1e-4), 50_000)
  assert sizer.chosen == 4096
  assert 'not measurable' in sizer.choices[0].reason


def test_the_first_call_of_each_length_is_left_out():
  # A 5 s trace on every new length would otherwise look like overhead.
  fast = _train(call_size.CallSizer('auto'),
                _Machine(1e-3, lambda step: 1e-3, first_call_extra=5.0),
                5_000)
  assert fast.chosen == 256
  assert fast.choices[0].host_overhead_s == pytest.approx(1e-3)


def test_the_fastest_probe_call_counts():
  machine = _Machine(1e-3, lambda step: 1e-3)
  calls = []
  seconds = machine.seconds

  def noisy(k, step):
    calls.append(k)
    # The second measured call of every length is slowed by 50 ms.
    return seconds(k, step) + (0.05 if calls.count(k) == 3 else 0.0)

  machine.seconds = noisy
  sizer = _train(call_size.CallSizer('auto'), machine, 5_000)
  assert sizer.choices[0].host_overhead_s == pytest.approx(1e-3)
  assert sizer.chosen == 256


def test_a_regime_change_measures_again():
  # The first epoch reads and caches (2 ms per step), later epochs are
  # 10x faster: the first choice is made on the slow steps, the second on
  # the fast ones.
  sizer = _train(call_size.CallSizer('auto'),
                 _Machine(2e-3, lambda step: 2e-3 if step < 1000 else 2e-4),
                 60_000)
  first, second = sizer.choices
  assert first.chosen == 64 and first.step < 1000
  assert second.chosen == 1024 and second.step > 1000
  assert sizer.chosen == 1024
  assert [c['chosen'] for c in sizer.describe()[
      'steps_per_execution_auto']] == [64, 1024]


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


def test_a_fixed_setting_is_kept():
  sizer = _train(call_size.CallSizer(7), _Machine(1e-3, lambda s: 1e-3), 100)
  assert sizer.size() == 7
  assert sizer.describe() == {'steps_per_execution': 7}


def test_fit_of_the_call_model():
  assert call_size.fit({4: 4e-3 + 2e-3, 256: 256e-3 + 2e-3}) == (
      pytest.approx(2e-3), pytest.approx(1e-3))
  assert call_size.fit({4: 1e-2}) is None
  assert call_size.fit({4: 1e-2, 64: 1e-3}) is None  # D < 0: noise.
