"""Plan assembly (cost and memory model) and the report, on a known profile.

No TensorFlow: the profile is written by hand, so every number is checkable.
"""

import dataclasses
import json

import numpy as np
import pytest

from components.partitioner import partition
from components.partitioner import plan as plan_lib
from components.partitioner import report
from components.pipeline_parallel import simulator
from components.records import partition_plan

MICROBATCH = 4


def _profile() -> plan_lib.ModelProfile:
  """x -> a -> b -> c -> add(a, c) -> out: a skip over b and c."""
  def layer(name, cls, fwd, bwd, params, act, inputs):
    return plan_lib.LayerProfile(
        name=name, class_name=cls, forward_seconds=fwd,
        backward_seconds=bwd, parameter_bytes=params, trainable_bytes=params,
        activation_bytes=act, inputs=tuple(inputs), outputs=(f'{name}:0',))
  layers = (
      layer('a', 'Dense', 1.0, 2.0, 100, 64, ['x']),
      layer('b', 'Dense', 3.0, 6.0, 400, 64, ['a:0']),
      layer('c', 'Dense', 1.0, 2.0, 100, 64, ['b:0']),
      layer('add', 'Add', 0.5, 0.5, 0, 64, ['a:0', 'c:0']),
      layer('out', 'Dense', 1.0, 1.0, 20, 4, ['add:0']),
  )
  tensor_bytes = {'x': 32, 'a:0': 64, 'b:0': 64, 'c:0': 64, 'add:0': 64,
                  'out:0': 4}
  live = (('x',), ('a:0',), ('a:0', 'b:0'), ('a:0', 'c:0'), ('add:0',),
          ('out:0',))
  return plan_lib.ModelProfile(
      microbatch_size=MICROBATCH, optimizer_slot_ratio=2.0, layers=layers,
      tensor_bytes=tensor_bytes, live_tensors=live)


def test_profile_json_round_trip():
  profile = _profile()
  assert plan_lib.ModelProfile.from_json(profile.to_json()) == profile


def test_costs_include_recomputation_per_remat_mode():
  profile = _profile()
  never = plan_lib.layer_costs(profile, 2, 4, 'never', 'gpipe')
  always = plan_lib.layer_costs(profile, 2, 4, 'always', 'gpipe')
  except_last = plan_lib.layer_costs(profile, 2, 4, 'except_last', 'gpipe')
  assert never.tolist() == [[3.0, 9.0, 3.0, 1.0, 2.0]] * 2
  assert always.tolist() == [[4.0, 12.0, 4.0, 1.5, 3.0]] * 2
  assert except_last[0, 1] == pytest.approx(9.0 + 3.0 * 3 / 4)
  # 1F1B's last stage runs each backward right after its forward: nothing
  # to recompute there; the first stage recomputes every micro-batch.
  one_f_one_b = plan_lib.layer_costs(profile, 2, 4, 'except_last', '1f1b')
  assert one_f_one_b[0].tolist() == always[0].tolist()
  assert one_f_one_b[1].tolist() == never[1].tolist()


@pytest.mark.parametrize('remat,offload,stored,received', [
    ('never', False, 8, 8),
    ('always', False, 1, 8),
    ('except_last', True, 1, 1),
])
def test_gpipe_memory_terms(remat, offload, stored, received):
  profile = _profile()
  layer_memory, cut_memory = plan_lib.memory_terms(profile, 3, 8, remat,
                                                   offload, 'gpipe')
  assert layer_memory.shape == (3, 5) and cut_memory.shape == (3, 6)
  for s in range(3):  # GPipe holds all M micro-batches on every stage.
    # Layer b: weights + gradient accumulator + two optimizer slots.
    assert layer_memory[s, 1] == 400 * 4 + stored * 64
    # Cut 3 carries the skip tensor a:0 and c:0.
    assert cut_memory[s, 3] == received * (64 + 64)
    assert cut_memory[s, 0] == received * 32


def test_1f1b_memory_terms_hold_k_minus_s_in_flight():
  profile = _profile()
  never, never_cuts = plan_lib.memory_terms(profile, 3, 8, 'never', False,
                                            '1f1b')
  always, always_cuts = plan_lib.memory_terms(profile, 3, 8, 'always', False,
                                              '1f1b')
  for s, flight in enumerate((3, 2, 1)):
    assert never[s, 1] == 400 * 4 + flight * 64
    assert never_cuts[s, 3] == flight * (64 + 64)
    assert always[s, 1] == 400 * 4 + 64  # One micro-batch recomputed.
    assert always_cuts[s, 3] == flight * (64 + 64)


@pytest.mark.parametrize('num_stages,num_microbatches',
                         [(2, 2), (2, 8), (3, 4), (3, 12), (4, 16), (5, 5)])
def test_1f1b_activation_memory_is_at_most_k_over_m_of_gpipe(
    num_stages, num_microbatches):
  """Schedule math: stored activations + received tensors, remat 'never'."""
  profile = _profile()
  state = plan_lib.state_bytes(profile)

  def activation_memory(schedule):
    layer_memory, cut_memory = plan_lib.memory_terms(
        profile, num_stages, num_microbatches, 'never', False, schedule)
    return layer_memory - state[None, :], cut_memory

  gpipe_layers, gpipe_cuts = activation_memory('gpipe')
  layers, cuts = activation_memory('1f1b')
  bound = num_stages / num_microbatches
  assert np.all(layers <= bound * gpipe_layers + 1e-9)
  assert np.all(cuts <= bound * gpipe_cuts + 1e-9)
  # And for the whole stage with any boundaries: per-stage peaks.
  for boundaries in ([0, 1, 3, 5], [0, 2, 4, 5], [0, 1, 2, 3, 4, 5]):
    if len(boundaries) - 1 != num_stages:
      continue
    costs = np.zeros(5)
    ours = partition.evaluate(boundaries, costs, layers, cuts)
    theirs = partition.evaluate(boundaries, costs, gpipe_layers, gpipe_cuts)
    for mine, other in zip(ours.stage_memory, theirs.stage_memory):
      assert mine <= bound * other + 1e-9


def test_a_budget_too_small_for_gpipe_fits_1f1b():
  profile = _profile()

  def smallest_budget(schedule):
    with pytest.raises(partition.InfeasibleBudgetError) as error:
      plan_lib.make_plan(profile, 2, 16, 'never', False,
                         memory_budget_bytes=1, schedule=schedule)
    return error.value.min_budget

  gpipe_budget = smallest_budget('gpipe')
  assert smallest_budget('1f1b') < gpipe_budget
  with pytest.raises(partition.InfeasibleBudgetError):
    plan_lib.make_plan(profile, 2, 16, 'never', False,
                       memory_budget_bytes=int(gpipe_budget) - 1)
  plan = plan_lib.make_plan(profile, 2, 16, 'never', False,
                            memory_budget_bytes=int(gpipe_budget) - 1,
                            schedule='1f1b')
  assert plan['schedule'] == '1f1b'
  assert plan['predicted']['peak_memory_bytes'] <= gpipe_budget - 1
  by_schedule = plan['memory_by_schedule']
  assert by_schedule['1f1b']['peak_memory_bytes'] == (
      plan['predicted']['peak_memory_bytes'])
  assert by_schedule['gpipe']['peak_memory_bytes'] > gpipe_budget - 1
  assert by_schedule['1f1b']['in_flight_microbatches'] == [2, 1]
  assert by_schedule['gpipe']['in_flight_microbatches'] == [16, 16]
  assert [s['memory_bytes'] for s in plan['stages']] == (
      by_schedule['1f1b']['stage_memory_bytes'])


def test_make_plan_is_optimal_and_complete():
  profile = _profile()
  plan = plan_lib.make_plan(profile, num_stages=2, num_microbatches=4,
                            remat='never', offload_activations=False)
  json.dumps(plan)  # Must be plain JSON.
  costs = plan_lib.layer_costs(profile, 2, 4, 'never', 'gpipe')
  optimum = partition.optimal_partition(costs, 2).bottleneck
  assert plan['predicted']['slowest_stage_seconds'] == pytest.approx(optimum)
  assert plan['boundaries'][0] == 0 and plan['boundaries'][-1] == 5
  assert plan['layer_signature'] == ['Dense', 'Dense', 'Dense', 'Add',
                                     'Dense']
  assert plan['batch_size'] == MICROBATCH * 4
  assert plan['predicted']['bubble_fraction'] == pytest.approx(1 / 5)
  assert plan['schedule'] == 'gpipe'
  # Step time is the simulated GPipe makespan of the planned stages.
  stages = plan['stages']
  schedule = simulator.simulate_schedule(
      [s['forward_seconds'] for s in stages],
      [s['backward_seconds'] for s in stages], 4)
  assert plan['predicted']['step_seconds'] == pytest.approx(schedule.makespan)
  assert sum(len(s['layers']) for s in stages) == 5
  cut = plan['cuts'][0]
  assert cut['before_layer'] == plan['boundaries'][1]
  expected = profile.live_tensors[cut['before_layer']]
  assert [t['name'] for t in cut['tensors']] == list(expected)
  assert cut['bytes_per_microbatch'] == profile.cut_bytes(cut['before_layer'])
  for name in ('uniform', 'block_partition'):
    assert plan['baselines'][name]['slowdown_vs_plan'] >= 1.0 - 1e-12


def test_remat_lowers_the_smallest_feasible_budget():
  profile = _profile()

  def smallest_budget(remat, offload):
    with pytest.raises(partition.InfeasibleBudgetError) as error:
      plan_lib.make_plan(profile, 2, 16, remat, offload,
                         memory_budget_bytes=1)
    return error.value.min_budget

  never = smallest_budget('never', False)
  always = smallest_budget('always', False)
  offloaded = smallest_budget('always', True)
  assert never > always > offloaded
  # At exactly that budget a plan exists and respects it.
  plan = plan_lib.make_plan(profile, 2, 16, 'always', False,
                            memory_budget_bytes=int(always))
  json.dumps(plan)  # Plain JSON with a budget too.
  assert plan['predicted']['peak_memory_bytes'] <= always
  assert all(s['memory_bytes'] <= always for s in plan['stages'])


def test_layer_signature_mismatch_is_explained():
  plan = plan_lib.make_plan(_profile(), 2, 4, 'never', False)
  record = partition_plan.PlanRecord.from_dict(plan)
  record.check_layer_signature(plan['layer_signature'])
  with pytest.raises(ValueError, match='made for a model with 5 layer calls'):
    record.check_layer_signature(['Dense'] * 4)


def test_report_writes_markdown_and_pngs(tmp_path):
  profile = _profile()
  plan, _ = plan_lib.choose_plan([profile], 3, 6 * MICROBATCH, [6],
                                 ['gpipe'], 'except_last', False)
  report.write_report(plan, profile, str(tmp_path))
  for name in (report.STAGE_COSTS_PNG, report.SCHEDULE_PNG):
    data = (tmp_path / name).read_bytes()
    assert data.startswith(b'\x89PNG\r\n\x1a\n') and len(data) > 5000
  text = (tmp_path / report.REPORT_MD).read_text()
  assert '## Stages' in text and '## Tensors crossing each boundary' in text
  stage_rows = [line for line in text.splitlines()
                if line.startswith('| ') and line[2].isdigit() and
                '..' in line]
  assert len(stage_rows) == 3
  assert f'![schedule]({report.SCHEDULE_PNG})' in text
  assert '## Predicted peak memory per stage, by schedule' in text
  assert 'M=6, gpipe: both were set in the config.' in text
  peak_row = next(line for line in text.splitlines()
                  if line.startswith('| peak |'))
  assert peak_row == '| peak | ' + ' | '.join(
      report._mib(plan['memory_by_schedule'][name]['peak_memory_bytes'])  # pylint: disable=protected-access
      for name in ('gpipe', '1f1b')) + ' |'
  assert 'a:0, c:0' in text or 'a:0, b:0' in text  # The skip crosses a cut.


def _scaled_profile(microbatch_size, overhead, per_example):
  """_profile() with every time = overhead + per_example x size."""
  base = _profile()
  seconds = overhead + per_example * microbatch_size
  return plan_lib.ModelProfile(
      microbatch_size=microbatch_size,
      optimizer_slot_ratio=base.optimizer_slot_ratio,
      layers=tuple(
          plan_lib.LayerProfile(**{
              **dataclasses.asdict(layer), 'forward_seconds': seconds,
              'backward_seconds': 2 * seconds,
              'activation_bytes': layer.activation_bytes *
                                  microbatch_size // MICROBATCH})
          for layer in base.layers),
      tensor_bytes={k: v * microbatch_size // MICROBATCH
                    for k, v in base.tensor_bytes.items()},
      live_tensors=base.live_tensors)


def test_profile_at_interpolates_times_and_scales_bytes():
  small, large = _scaled_profile(1, 0.5, 0.25), _scaled_profile(16, 0.5, 0.25)
  between = plan_lib.profile_at([small, large], 8)
  expected = _scaled_profile(8, 0.5, 0.25)
  assert between.microbatch_size == 8
  for got, want in zip(between.layers, expected.layers):
    assert got.forward_seconds == pytest.approx(want.forward_seconds)
    assert got.backward_seconds == pytest.approx(want.backward_seconds)
    assert got.activation_bytes == want.activation_bytes
    assert got.parameter_bytes == want.parameter_bytes
  assert between.tensor_bytes == expected.tensor_bytes
  assert plan_lib.profile_at([small, large], 16) is large
  # One measured size: proportional.
  assert plan_lib.profile_at([small], 4).layers[0].forward_seconds == (
      pytest.approx(4 * 0.75))


def test_auto_picks_the_fastest_pair_and_says_why():
  # A fixed cost per micro-batch and layer makes many micro-batches slow;
  # few leave a large bubble: the optimum is in between.
  measured = [_scaled_profile(1, 1.0, 0.125), _scaled_profile(64, 1.0, 0.125)]
  plan, profile = plan_lib.choose_plan(
      measured, 2, 64, [1, 2, 4, 8, 16, 32, 64], ['gpipe', '1f1b'], 'never',
      False)
  rows = plan['choice']['candidates']
  assert len(rows) == 14 and all(r['fits_budget'] for r in rows)
  steps = {(r['num_microbatches'], r['schedule']): r['step_seconds']
           for r in rows}
  assert min(steps.values()) == pytest.approx(
      plan['predicted']['step_seconds'])
  assert 1 < plan['num_microbatches'] < 64
  assert profile.microbatch_size == plan['microbatch_size'] == (
      64 // plan['num_microbatches'])
  # Balanced stages, remat never: both schedules predict the same step, so
  # the lower peak memory decides.
  assert steps[(8, 'gpipe')] == pytest.approx(steps[(8, '1f1b')])
  assert plan['schedule'] == '1f1b'
  reason = plan['choice']['reason']
  assert reason.startswith(f"M={plan['num_microbatches']}, 1f1b: the "
                           'shortest predicted step')
  assert 'of the 14 candidates that fit the memory budget' in reason
  assert 'lowest peak memory' in reason


def test_auto_within_a_budget_only_1f1b_fits():
  measured = [_scaled_profile(1, 1.0, 0.125), _scaled_profile(64, 1.0, 0.125)]
  gpipe_needs = min(
      plan_lib.make_plan(plan_lib.profile_at(measured, 64 // m), 2, m,
                         'never', False)['predicted']['peak_memory_bytes']
      for m in (16, 32, 64))
  plan, _ = plan_lib.choose_plan(measured, 2, 64, [16, 32, 64],
                                 ['gpipe', '1f1b'], 'never', False,
                                 memory_budget_bytes=gpipe_needs - 1)
  assert plan['schedule'] == '1f1b'
  rows = {(r['num_microbatches'], r['schedule']): r
          for r in plan['choice']['candidates']}
  assert not any(rows[(m, 'gpipe')]['fits_budget'] for m in (16, 32, 64))
  assert rows[(16, 'gpipe')]['smallest_budget_bytes'] >= gpipe_needs
  assert 'of the 3 candidates that fit' in plan['choice']['reason']
  with pytest.raises(partition.InfeasibleBudgetError,
                     match='smallest budget that works is'):
    plan_lib.choose_plan(measured, 2, 64, [16], ['gpipe', '1f1b'], 'never',
                         False, memory_budget_bytes=1)


def test_old_plans_read_as_one_gpipe_pipeline():
  plan = plan_lib.make_plan(_profile(), 2, 4, 'never', False)
  assert plan['schedule'] == 'gpipe' and plan['data_parallel_replicas'] == 1
  old = {k: v for k, v in plan.items()
         if k not in ('schedule', 'data_parallel_replicas')}
  read = partition_plan.PlanRecord.from_dict
  assert read(old).schedule == 'gpipe'
  assert read(old).data_parallel_replicas == 1
  assert read({**old, 'data_parallel_replicas': 3}).num_devices == 6
  with pytest.raises(ValueError, match=r"schedule 'zb-h1'; this runtime "
                     r"runs \('gpipe', '1f1b'\)"):
    read({**old, 'schedule': 'zb-h1'})
  with pytest.raises(ValueError, match='data_parallel_replicas 0; it must be'):
    read({**old, 'data_parallel_replicas': 0})


def test_plan_format_version_is_checked(tmp_path):
  plan = plan_lib.make_plan(_profile(), 2, 4, 'never', False)
  assert plan['format_version'] == partition_plan.PLAN_FORMAT_VERSION
  (tmp_path / partition_plan.PLAN_FILE).write_text(
      partition_plan.to_json(plan))
  assert partition_plan.read(str(tmp_path)) == (
      partition_plan.PlanRecord.from_dict(plan))
  for version in (None, 0, partition_plan.PLAN_FORMAT_VERSION + 1):
    with pytest.raises(ValueError, match=rf'format_version {version!r}; this '
                       r'runtime reads version '
                       rf'{partition_plan.PLAN_FORMAT_VERSION}'):
      partition_plan.PlanRecord.from_dict({**plan, 'format_version': version})
  with pytest.raises(ValueError, match=r"lacks \['boundaries'\]"):
    partition_plan.to_json({k: v for k, v in plan.items()
                            if k != 'boundaries'})
  with pytest.raises(ValueError, match=r'boundaries \[0, 5\] for 2 stages'):
    partition_plan.PlanRecord.from_dict({**plan, 'boundaries': [0, 5]})
  with pytest.raises(FileNotFoundError, match='no plan.json'):
    partition_plan.read(str(tmp_path / 'missing'))


def test_data_parallel_copies_multiply_the_batch():
  plan, profile = plan_lib.choose_plan(
      [_profile()], 2, 64, [4], ['1f1b'], 'never', False,
      data_parallel_replicas=2)
  # 64 examples: 2 copies x 4 micro-batches of 8.
  assert plan['data_parallel_replicas'] == 2 and plan['batch_size'] == 64
  assert plan['microbatch_size'] == profile.microbatch_size == 8
