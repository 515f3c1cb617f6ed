"""Partition plan report: markdown plus PNG charts.

Charts use matplotlib's object API with the Agg canvas (no pyplot, no
display): stage costs against the perfectly balanced cost, and the plan's
micro-batch schedule (GPipe or 1F1B) with its bubble.
"""

import os
from typing import Any, Dict, List, Mapping, Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from components.partitioner import plan as plan_lib
from components.pipeline_parallel import simulator

STAGE_COSTS_PNG = 'stage_costs.png'
SCHEDULE_PNG = 'schedule.png'
MEASURED_SCHEDULE_PNG = 'schedule_measured.png'
REPORT_MD = 'report.md'
SCHEDULE_NAMES = {'gpipe': 'GPipe', '1f1b': '1F1B'}
_COLORS = {'forward': 'tab:blue', 'backward': 'tab:orange',
           'idle': 'lightgrey'}


def _save(figure: Figure, path: str) -> None:
  FigureCanvasAgg(figure)
  figure.tight_layout()
  figure.savefig(path, dpi=100)


def stage_costs_chart(plan: Mapping[str, Any], path: str) -> None:
  """Per-stage forward and backward time, with the balanced ideal."""
  stages = plan['stages']
  labels = [f"S{s['index']}\n{s['first_layer']}-{s['end_layer'] - 1}"
            for s in stages]
  forward = [s['forward_seconds'] * 1e3 for s in stages]
  backward = [s['backward_seconds'] * 1e3 for s in stages]
  figure = Figure(figsize=(max(5, 0.6 * len(stages) + 3), 3.5))
  axes = figure.subplots()
  axes.bar(labels, forward, label='forward', color=_COLORS['forward'])
  axes.bar(labels, backward, bottom=forward, label='backward (+recompute)',
           color=_COLORS['backward'])
  ideal = sum(f + b for f, b in zip(forward, backward)) / len(stages)
  axes.axhline(ideal, color='black', linestyle='--', label='balanced')
  axes.set_ylabel('ms per micro-batch')
  axes.set_xlabel('stage (layers)')
  axes.set_title(f"Stage costs, {plan['num_stages']} stages")
  axes.legend(fontsize='small')
  _save(figure, path)


def _draw_schedule(axes, tasks, num_stages: int, makespan: float,
                   title: str, label_microbatches: bool) -> None:
  scale = 1e3
  axes.barh([-s for s in range(num_stages)], makespan * scale, left=0,
            color=_COLORS['idle'])
  # Backwards on top: in a measured step a forward's span can reach past
  # later tasks (ops such as the loss metric's update run late).
  for task in sorted(tasks, key=lambda t: t.phase == 'backward'):
    axes.barh(-task.stage, (task.end - task.start) * scale,
              left=task.start * scale, color=_COLORS[task.phase],
              edgecolor='white')
    if label_microbatches:
      axes.text((task.start + task.end) / 2 * scale, -task.stage,
                str(task.microbatch), ha='center', va='center',
                fontsize=7, color='white')
  axes.set_yticks([-s for s in range(num_stages)])
  axes.set_yticklabels([f'stage {s}' for s in range(num_stages)])
  axes.set_xlabel('ms')
  axes.set_title(title, fontsize='medium')


def schedule_charts(panels, num_stages: int, num_microbatches: int,
                    path: str) -> None:
  """Gantt charts stacked: `panels` is [(title, tasks, makespan)], tasks
  with stage, microbatch, phase, start and end (seconds); gaps are idle."""
  figure = Figure(figsize=(10, len(panels) * (0.5 * num_stages + 1.2) + 0.6))
  axes_list = figure.subplots(len(panels), 1, squeeze=False)[:, 0]
  for axes, (title, tasks, makespan) in zip(axes_list, panels):
    _draw_schedule(axes, tasks, num_stages, makespan, title,
                   num_microbatches <= 16)
  axes_list[-1].legend(
      handles=[Patch(color=color, label=label) for label, color in (
          ('forward', _COLORS['forward']), ('backward', _COLORS['backward']),
          ('idle (bubble)', _COLORS['idle']))],
      loc='upper center', bbox_to_anchor=(0.5, -0.35), ncol=3,
      fontsize='small')
  _save(figure, path)


def _simulated(plan: Mapping[str, Any]):
  """The plan's schedule, simulated from its per-stage times."""
  stages = plan['stages']
  return simulator.simulate_schedule(
      [s['forward_seconds'] for s in stages],
      [s['backward_seconds'] for s in stages], plan['num_microbatches'],
      plan['schedule'])


def schedule_chart(plan: Mapping[str, Any], path: str) -> None:
  """Gantt chart of the plan's simulated schedule; gaps are the bubble."""
  stages = plan['stages']
  schedule = _simulated(plan)
  title = (f"{SCHEDULE_NAMES[plan['schedule']]} schedule, "
           f"M={plan['num_microbatches']}: idle "
           f'{schedule.idle_fraction:.1%} (balanced-stage bubble '
           f"(K-1)/(M+K-1) = {plan['predicted']['bubble_fraction']:.1%})")
  schedule_charts([(title, schedule.tasks, schedule.makespan)], len(stages),
                  plan['num_microbatches'], path)


def measured_schedule_chart(plan: Mapping[str, Any], path: str) -> None:
  """The simulated schedule above the one measured in a real step."""
  stages = plan['stages']
  simulated = _simulated(plan)
  measured = [simulator.ScheduledTask(**t) for t in plan['measured']['tasks']]
  name = SCHEDULE_NAMES[plan['schedule']]
  schedule_charts(
      [(f'{name}, simulated from the profile: idle '
        f'{simulated.idle_fraction:.1%}', simulated.tasks,
        simulated.makespan),
       (f"{name}, measured (one traced step): idle "
        f"{plan['measured']['idle_fraction']:.1%}", measured,
        max(t.end for t in measured))],
      len(stages), plan['num_microbatches'], path)


def _mib(num_bytes) -> str:
  return f'{num_bytes / 2**20:.2f}'


def markdown(plan: Mapping[str, Any], profile: plan_lib.ModelProfile) -> str:
  """The human-readable plan: summary, stages, cuts, baselines, layers."""
  lines = [*_summary_lines(plan), *_measured_lines(plan),
           *_stage_lines(plan), *_choice_lines(plan['choice']),
           *_memory_lines(plan), *_cut_lines(plan['cuts']),
           *_baseline_lines(plan['baselines']), *_layer_lines(profile)]
  return '\n'.join(lines) + '\n'


def _summary_lines(plan: Mapping[str, Any]) -> List[str]:
  predicted = plan['predicted']
  budget = plan['memory_budget_bytes']
  return [
      '# Pipeline partition plan', '',
      f"- stages K = {plan['num_stages']}, micro-batches M = "
      f"{plan['num_microbatches']} of {plan['microbatch_size']} examples "
      f"(mini-batch {plan['batch_size']}), schedule "
      f"{SCHEDULE_NAMES[plan['schedule']]}",
      f"- data-parallel copies of the pipeline R = "
      f"{plan['data_parallel_replicas']} on R x K = "
      f"{plan['data_parallel_replicas'] * plan['num_stages']} devices, each "
      f"on {plan['batch_size'] // plan['data_parallel_replicas']} examples",
      f"- re-materialization: {plan['remat']}; activations offloaded to "
      f"host: {plan['offload_activations']}",
      f'- memory budget per device: '
      f"{'none' if budget is None else _mib(budget) + ' MiB'}; planned peak "
      f"{_mib(predicted['peak_memory_bytes'])} MiB",
      f"- predicted step time {predicted['step_seconds'] * 1e3:.3f} ms; "
      f"slowest stage {predicted['slowest_stage_seconds'] * 1e3:.3f} ms per "
      'micro-batch',
      f"- bubble (K-1)/(M+K-1) = {predicted['bubble_fraction']:.3f}; "
      'simulated idle fraction with the planned stage costs = '
      f"{predicted['simulated_idle_fraction']:.3f}", '',
      f'![stage costs]({STAGE_COSTS_PNG})', '',
      f'![schedule]({SCHEDULE_PNG})', '']


def _stage_lines(plan: Mapping[str, Any]) -> List[str]:
  lines = ['## Stages', '',
           '| stage | layers | forward ms | backward ms | parameters MiB | '
           'memory MiB |', '|---|---|---|---|---|---|']
  for s in plan['stages']:
    lines.append(
        f"| {s['index']} | {s['first_layer']}..{s['end_layer'] - 1} | "
        f"{s['forward_seconds'] * 1e3:.3f} | "
        f"{s['backward_seconds'] * 1e3:.3f} | "
        f"{_mib(s['parameter_bytes'])} | {_mib(s['memory_bytes'])} |")
  return lines


def _choice_lines(choice: Mapping[str, Any]) -> List[str]:
  lines = ['', '## Choice of M and schedule', '', choice['reason'], '',
           'Profile measured at micro-batch sizes '
           f"{choice['measured_microbatch_sizes']}; other sizes interpolate "
           'the times (affine in the size) and scale the activation bytes.',
           '', '| M | schedule | predicted step ms | bubble | peak MiB | '
           'fits budget |', '|---|---|---|---|---|---|']
  for row in choice['candidates']:
    if row['fits_budget']:
      lines.append(
          f"| {row['num_microbatches']} | {row['schedule']} | "
          f"{row['step_seconds'] * 1e3:.3f} | {row['bubble_fraction']:.3f} | "
          f"{_mib(row['peak_memory_bytes'])} | yes |")
    else:
      lines.append(
          f"| {row['num_microbatches']} | {row['schedule']} | - | - | - | no "
          f"(needs {_mib(row['smallest_budget_bytes'])} MiB) |")
  return lines


def _memory_lines(plan: Mapping[str, Any]) -> List[str]:
  by_schedule = plan['memory_by_schedule']
  lines = ['', '## Predicted peak memory per stage, by schedule', '',
           'Training state + activations + received tensors, with these '
           'boundaries, M and remat; in flight: micro-batches between their '
           'forward and backward on the stage.', '',
           '| stage | ' + ' | '.join(
               f'{SCHEDULE_NAMES[name]} MiB (in flight)'
               for name in by_schedule) + ' |',
           '|---|' + '---|' * len(by_schedule)]
  for s in plan['stages']:
    lines.append(f"| {s['index']} | " + ' | '.join(
        f"{_mib(entry['stage_memory_bytes'][s['index']])} "
        f"({entry['in_flight_microbatches'][s['index']]})"
        for entry in by_schedule.values()) + ' |')
  lines.append('| peak | ' + ' | '.join(
      _mib(entry['peak_memory_bytes']) for entry in by_schedule.values()) +
               ' |')
  return lines


def _cut_lines(cuts: Sequence[Mapping[str, Any]]) -> List[str]:
  lines = ['', '## Tensors crossing each boundary (per micro-batch)', '',
           '| before layer | tensors | bytes |', '|---|---|---|']
  for cut in cuts:
    names = ', '.join(t['name'] for t in cut['tensors'])
    lines.append(f"| {cut['before_layer']} | {names} | "
                 f"{cut['bytes_per_microbatch']} |")
  return lines


def _baseline_lines(baselines: Mapping[str, Mapping[str, Any]]) -> List[str]:
  lines = ['', '## Against simple splits', '',
           '| split | boundaries | slowest stage / plan | fits budget |',
           '|---|---|---|---|']
  for name, other in baselines.items():
    lines.append(f"| {name} | {other['boundaries']} | "
                 f"{other['slowdown_vs_plan']:.3f} | {other['fits_budget']} |")
  return lines


def _layer_lines(profile: plan_lib.ModelProfile) -> List[str]:
  lines = ['', '## Layer profile', '',
           '| # | layer | class | forward us | backward us | parameter bytes '
           '| activation bytes |', '|---|---|---|---|---|---|---|']
  for i, layer in enumerate(profile.layers):
    lines.append(
        f'| {i} | {layer.name} | {layer.class_name} | '
        f'{layer.forward_seconds * 1e6:.1f} | '
        f'{layer.backward_seconds * 1e6:.1f} | {layer.parameter_bytes} | '
        f'{layer.activation_bytes} |')
  return lines


def _measured_lines(plan: Mapping[str, Any]):
  if 'measured' not in plan:
    return []
  return [
      f"Measured in one traced step on {len(plan['measured']['devices'])} "
      f"devices: idle fraction {plan['measured']['idle_fraction']:.3f} "
      '(time each stage had an op running, over K x the step), against '
      f"{plan['predicted']['simulated_idle_fraction']:.3f} simulated and "
      f"{plan['predicted']['bubble_fraction']:.3f} = (K-1)/(M+K-1).", '',
      f'![measured schedule]({MEASURED_SCHEDULE_PNG})', '']


def write_report(plan: Dict[str, Any], profile: plan_lib.ModelProfile,
                 output_dir: str) -> None:
  """Writes report.md and its PNG charts into `output_dir`."""
  stage_costs_chart(plan, os.path.join(output_dir, STAGE_COSTS_PNG))
  schedule_chart(plan, os.path.join(output_dir, SCHEDULE_PNG))
  if 'measured' in plan:
    measured_schedule_chart(plan,
                            os.path.join(output_dir, MEASURED_SCHEDULE_PNG))
  with open(os.path.join(output_dir, REPORT_MD), 'w') as f:
    f.write(markdown(plan, profile))
