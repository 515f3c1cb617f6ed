"""bench_precision's report: per family, each setting's rates of the three
trainers, 'auto''s choice and the quality guard; then the goals."""

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

from benchmarks import harness
from benchmarks import report
from benchmarks.bench_precision_runs import (
    ACCURACY_TOLERANCE, AUTO_SETTING, EVAL_EXAMPLES, FIT, GOAL_AUTO_VS_BEST,
    GOAL_BF16_MLP, GOAL_VS_HAND_TUNED, GOAL_VS_STOCK, OURS, SAVE_EVERY_S,
    STOCK, TRAIN_EXAMPLES, TRAINERS, key, label)


def _rate(value: Optional[float]) -> str:
  return '-' if value is None else f'{value:,.0f}'


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
  return a / b if a is not None and b else None


def _fmt_ratio(value: Optional[float]) -> str:
  return '-' if value is None else f'{value:.2f}'


def _accuracy(runs: List[Dict[str, Any]]) -> str:
  values = [r['accuracy'] for r in runs if r.get('accuracy') is not None]
  if not values:
    return '-'
  text = f'{harness.median(values):.3f}'
  if len(values) > 1:
    text += f' ({min(values):.3f}-{max(values):.3f})'
  return text


def _calls(runs: List[Dict[str, Any]]) -> str:
  """The steps per call ours' 'auto' chose, or for a run that ended while
  it measured, the length most of its steps ran at."""
  labels = set()
  for run in runs:
    if run.get('steps_per_execution') is not None:
      labels.add(str(run['steps_per_execution']))
    elif run.get('steps_by_call_length'):
      ran = run['steps_by_call_length']
      labels.add(f'none yet (most at {max(ran, key=ran.get)})')
  return ', '.join(sorted(labels)) or '-'


def _auto_choice(run: Dict[str, Any]) -> str:
  xla = run.get('xla') or {}
  return (f"{run['precision']['policy'].replace('mixed_', '')}"
          f"{'+XLA' if xla.get('enabled') else ''}")


def _rates(runs: Dict[str, List[Dict[str, Any]]]) -> Dict[str, Any]:
  return {t: harness.median_or_none(r['examples_per_sec']
                                   for r in runs.get(t, []))
          for t in TRAINERS}


def quality_guard(measured: Dict[str, Any], cells: List[Dict[str, Any]],
                  family: str) -> Tuple[str, List[str]]:
  """The family's eval accuracy per precision (ours and stock, XLA off and
  on, every run at the family's full steps) and the precisions that lose
  more than the noise band against float32."""
  by_precision: Dict[str, List[float]] = {}
  for cell in cells:
    if (cell['family'] != family or not cell['full_steps'] or
        cell['precision'] == AUTO_SETTING[0]):
      continue
    runs = measured.get(cell['key'], {})
    for trainer in (OURS, STOCK):
      by_precision.setdefault(cell['precision'], []).extend(
          r['accuracy'] for r in runs.get(trainer, [])
          if r.get('accuracy') is not None)
  reference = by_precision.get('float32') or []
  if not reference:
    return 'no float32 run to compare with', []
  base = harness.median(reference)
  band = max(ACCURACY_TOLERANCE, max(reference) - min(reference))
  parts, flagged = [], []
  for precision, values in by_precision.items():
    if not values:
      continue
    value = harness.median(values)
    loss = base - value
    flag = precision != 'float32' and loss > band
    parts.append(f'{precision} {value:.3f} ({len(values)} runs, '
                 f'{min(values):.3f}-{max(values):.3f})'
                 + (' **FLAGGED**' if flag else ''))
    if flag:
      flagged.append(f'{family} {precision} {value:.3f}, {loss:.3f} below '
                     f'float32 {base:.3f} (band {band:.3f})')
  return (f'band {band:.3f}: ' + '; '.join(parts)), flagged


@dataclasses.dataclass
class _Tally:
  """What the families' sections found, for the goals."""
  below_stock: List[str] = dataclasses.field(default_factory=list)
  below_hand: List[str] = dataclasses.field(default_factory=list)
  auto_lines: List[str] = dataclasses.field(default_factory=list)
  guard_lines: List[str] = dataclasses.field(default_factory=list)
  flagged: List[str] = dataclasses.field(default_factory=list)
  missing: List[str] = dataclasses.field(default_factory=list)
  skipped: List[str] = dataclasses.field(default_factory=list)
  judged: Dict[str, int] = dataclasses.field(
      default_factory=lambda: {STOCK: 0, FIT: 0})
  bf16_line: Optional[str] = None


def _setting_row(family: str, cell: Dict[str, Any], measured: Dict[str, Any],
                 tally: _Tally) -> Tuple[List[str], Optional[float]]:
  """A fixed setting's row, and ours' rate in it (None: not measured)."""
  setting = label((cell['precision'], cell['xla']))
  name = f'{family} {setting}'
  if cell['skipped']:
    tally.skipped.append(f"{name}: {cell['skipped']}")
    return [setting, f"skipped: {cell['skipped']}"] + ['-'] * 7, None
  runs = measured.get(cell['key'], {})
  rates = _rates(runs)
  vs_stock = _ratio(rates[OURS], rates[STOCK])
  vs_hand = _ratio(rates[OURS], rates[FIT])
  ks = sorted({r['best_k'] for r in runs.get(FIT, [])})
  steps_note = '' if cell['full_steps'] else f" ({cell['train_steps']} steps)"
  row = [setting + steps_note, _rate(rates[OURS]), _rate(rates[STOCK]),
         _rate(rates[FIT]) + (f" (k={','.join(map(str, ks))})" if ks else ''),
         _fmt_ratio(vs_stock), _fmt_ratio(vs_hand),
         _accuracy(runs.get(OURS, [])), _accuracy(runs.get(STOCK, [])),
         _calls(runs.get(OURS, []))]
  if None in rates.values():
    tally.missing.append(name)
  tally.judged[STOCK] += vs_stock is not None
  tally.judged[FIT] += vs_hand is not None
  if vs_stock is not None and vs_stock < GOAL_VS_STOCK:
    tally.below_stock.append(f'{name} {vs_stock:.2f}')
  if vs_hand is not None and vs_hand < GOAL_VS_HAND_TUNED:
    tally.below_hand.append(f'{name} {vs_hand:.2f}')
  return row, rates[OURS]


def _auto_row(family: str, auto_runs: List[Dict[str, Any]],
              best: Optional[Tuple[str, float]], tally: _Tally) -> List[str]:
  """The family's auto run: its row; its line against the best setting."""
  auto_rate = _rates({OURS: auto_runs})[OURS]
  chosen = ' / '.join(sorted({_auto_choice(r) for r in auto_runs}))
  vs_best = _ratio(auto_rate, best and best[1])
  reasons = '; '.join(sorted({
      f"precision: {r['precision']['reason']}; XLA: "
      f"{(r.get('xla') or {}).get('reason')}" for r in auto_runs}))
  tally.auto_lines.append(
      f'{family}: chose {chosen}, {_rate(auto_rate)} ex/s = '
      f"{'-' if vs_best is None else f'{vs_best:.3f}'} of the best "
      'setting '
      f"({best[0] if best else '-'}, {_rate(best and best[1])} ex/s): "
      + ('PASS' if vs_best is not None and vs_best >= GOAL_AUTO_VS_BEST
         else 'FAIL') + f' ({reasons})')
  return [f'auto: chose {chosen}', _rate(auto_rate), '-', '-', '-', '-',
          _accuracy(auto_runs), '-', _calls(auto_runs)]


def _family_section(family: str, cells: List[Dict[str, Any]],
                    measured: Dict[str, Any], tally: _Tally) -> str:
  """The family's table: each setting, then its auto run."""
  family_cells = [c for c in cells if c['family'] == family]
  rows, best = [], None
  for cell in family_cells:
    if cell['precision'] == AUTO_SETTING[0]:
      continue
    row, rate = _setting_row(family, cell, measured, tally)
    rows.append(row)
    if rate is not None and (best is None or rate > best[1]):
      best = (label((cell['precision'], cell['xla'])), rate)
  auto_runs = measured.get(key(family, AUTO_SETTING), {}).get(OURS, [])
  if auto_runs:
    rows.append(_auto_row(family, auto_runs, best, tally))
  elif any(c['precision'] == AUTO_SETTING[0] for c in family_cells):
    tally.missing.append(f'{family} auto')
  guard, family_flagged = quality_guard(measured, cells, family)
  tally.guard_lines.append(f'{family}: {guard}')
  tally.flagged.extend(family_flagged)
  if family == 'mlp':
    tally.bf16_line = _bf16_goal(measured, family)
  return (
      f"### {family} (global batch {family_cells[0]['batch']}, "
      f"{max(c['train_steps'] for c in family_cells)} train steps, eval "
      f"{family_cells[0]['eval_steps']} steps)\n\n" +
      report.table(['setting', 'ours ex/s', 'stock ex/s',
                    'hand-tuned fit ex/s (best k)', 'ours / stock',
                    'ours / hand-tuned', 'eval acc. ours',
                    'eval acc. stock', 'ours steps/call'], rows))


def _verdict(failures: List[str], count: int) -> str:
  if not count:
    return 'not measured'
  if not failures:
    return f'PASS ({count} of {count} cells)'
  return (f'FAIL ({len(failures)} of {count} cells below): '
          + ', '.join(failures))


def _goals(tally: _Tally) -> List[str]:
  goals = [
      f'ours >= {GOAL_VS_STOCK:.1f}x stock in every family and setting: '
      + _verdict(tally.below_stock, tally.judged[STOCK]),
      f'ours >= {GOAL_VS_HAND_TUNED}x the hand-tuned fit: '
      + _verdict(tally.below_hand, tally.judged[FIT]),
      f"'auto' within {GOAL_AUTO_VS_BEST} of the family's best setting:"
      + ('' if tally.auto_lines else ' not measured'),
      *[f'  - {line}' for line in tally.auto_lines],
      tally.bf16_line or (f'mixed_bfloat16 >= {GOAL_BF16_MLP}x float32 on '
                          'the MLP: not measured'),
      'quality guard, eval accuracy per precision (a precision more than '
      'the band below float32 is flagged): '
      + ('nothing flagged' if not tally.flagged else
         'FLAGGED: ' + '; '.join(tally.flagged)),
      *[f'  - {line}' for line in tally.guard_lines],
  ]
  if tally.skipped:
    goals.append('skipped without a GPU (CPU_SKIPPED): '
                 + '; '.join(tally.skipped))
  if tally.missing:
    goals.append('not measured (time budget or a failed run, see the log): '
                 + ', '.join(tally.missing))
  return goals


def _method(info: Dict[str, Any], config: Dict[str, Any]) -> str:
  devices = ('GPU: ' + ', '.join(info['gpus'])) if info['gpus'] else 'no GPU'
  return (
      f"Machine: {info['cpu']}; CPU flags: {info['cpu_flags']}; {devices}; "
      f"TensorFlow {info['tf_version']}, TFX {info['tfx_version']}. "
      f"{config['rounds']} round(s), every measurement in a fresh process, "
      'families, settings and trainers interleaved with the order reversed '
      "every other round, 'auto' once per family and round; medians "
      'over rounds (eval accuracy: median, min-max). Synthetic data: '
      f'{TRAIN_EXAMPLES:,} train / {EVAL_EXAMPLES:,} eval examples per '
      'family. Ours: the HighPerfTrainer executor, managed, one_device, '
      "steps_per_execution and intra_op_threads 'auto', checkpoints every "
      f'{SAVE_EVERY_S} s. Stock: the stock Trainer executor, `model.fit` '
      'over the data accessor. Hand-tuned fit: in-memory batches, no '
      f"metrics, the best steps_per_execution of {config['ks']} (those "
      'giving 3 calls or more). Steady examples/s, first (tracing) call '
      'excluded. Load average before/after: '
      f"{info['load'][0]:.1f} / {info['load'][1]:.1f} (a shared machine); "
      f"bench wall {info['wall_s'] / 60:.1f} min.")


def render(results: Dict[str, Any]) -> str:
  """The report's body of `results` (what `main` saved as results.json)."""
  tally = _Tally()
  sections = [_family_section(family, results['cells'], results['measured'],
                              tally)
              for family in results['config']['families']]
  return (
      _method(results['info'], results['config']) + '\n\n## Goals\n\n' +
      '\n'.join(g if g.startswith('  ') else f'- {g}'
                for g in _goals(tally)) +
      '\n\n## Per family\n\n' + '\n\n'.join(sections) + '\n')


def _bf16_goal(measured: Dict[str, Any], family: str) -> Optional[str]:
  def ours(setting):
    return _rates(measured.get(key(family, setting), {}))[OURS]

  f32, bf16 = ours(('float32', 'off')), ours(('mixed_bfloat16', 'off'))
  ratio = _ratio(bf16, f32)
  if ratio is None:
    return None
  line = (f'mixed_bfloat16 >= {GOAL_BF16_MLP}x float32 on the MLP (ours, XLA '
          f'off): {ratio:.2f}x ({_rate(bf16)} vs {_rate(f32)} ex/s): '
          + ('PASS' if ratio >= GOAL_BF16_MLP else 'FAIL'))
  f32x, bf16x = ours(('float32', 'on')), ours(('mixed_bfloat16', 'on'))
  if f32x and bf16x:
    line += (f'; with XLA on: {bf16x / f32x:.2f}x ({_rate(bf16x)} vs '
             f'{_rate(f32x)} ex/s)')
  return line


def write_report(results: Dict[str, Any], results_dir: str,
                 report_name: str) -> str:
  body = render(results)
  if results.get('stopped'):
    body = (f"**Stopped at the time budget "
            f"({results['config']['time_budget_s']:.0f} s) in "
            f"{results['stopped']}**: what was not measured shows as -.\n\n"
            + body)
  title = ('Mixed precision and XLA: HighPerfTrainer vs stock Trainer vs '
           'hand-tuned fit'
           + (' (one GPU)' if results['config']['device_check'] else ''))
  return report.write(results_dir, report_name, title, body)
