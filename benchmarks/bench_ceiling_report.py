"""bench_ceiling's report: each trainer run judged against the ceilings
bracketing it, the breakdown and the Trainer's time outside training."""

from typing import Any, Dict, List, Optional, Tuple

from benchmarks import harness
from benchmarks import report
from benchmarks.bench_ceiling_runs import (
    BATCHES, CEILING_K, EVAL_STEPS, GOAL_OUTSIDE_TRAINING_S, GOAL_RATIO,
    GOAL_VS_BEST_K, MAX_CEILING_SPREAD, SAVE_EVERY_SECONDS, default_job,
    steps_at)


def _pool(threads: int) -> str:
  return f'{threads} intra-op' if threads else 'TF default'


def _auto_label(run: Dict[str, Any]) -> str:
  """The length 'auto' chose, or for a run that ended while it measured,
  the length most of its steps ran at."""
  if run['steps_per_execution'] is not None:
    return str(run['steps_per_execution'])
  ran = run['steps_by_call_length']  # Recorded by every managed run.
  return f'none yet (most steps at {max(ran, key=ran.get)})'


def render_breakdown(breakdown: Dict[Any, Dict[str, Any]]) -> str:
  """The breakdown table (each piece's examples/s and share of the ceiling
  in the same process) and the profiler's time per step of the runner."""
  rows, trace_rows = [], []
  for (batch, _), measured in breakdown.items():
    rates, pool = measured['rates'], _pool(measured['intra_op_threads'])
    for name, rate in rates.items():
      rows.append([batch, pool, name, f'{rate:,.0f}',
                   f'{rate / rates["ceiling"]:.2f}'])
    trace_rows.append([batch, pool] + [
        f'{us:.0f}' for us in measured['trace_us_per_step'].values()])
  labels = list(next(iter(breakdown.values()))['trace_us_per_step'])
  return (report.table(['global batch', 'op pool', 'what runs (one_device, '
                        f'{CEILING_K} steps per call)', 'examples/s',
                        'vs ceiling'], rows) +
          '\n\nProfiler trace of two calls of the trainer step runner '
          '(`benchmarks/tf_trace.py`): busy microseconds per step of each '
          'group of threads.\n\n' +
          report.table(['global batch', 'op pool'] + labels, trace_rows))


def render_fixed_cost(runs: List[Dict[str, Any]]) -> str:
  """The Trainer's time outside training, by part (from
  `training_result.json` and `launch.json` `timing`), for the given
  runs."""
  parts = ['executor_before_launch_s', 'worker_imports_s', 'worker_setup_s',
           'setup_s', 'build_model_s', 'restore_s', 'first_call_s',
           'eval_s', 'export_s']
  rows = []
  for run in runs:
    timing = run.get('timing') or {}
    train = timing.get('train_s') or 0.0
    rows.append([f'{run["trainer_wall_s"]:.1f}', f'{train:.1f}',
                 f'{run["trainer_wall_s"] - train:.1f}'] +
                [f'{timing[p]:.2f}' if timing.get(p) is not None else 'n/a'
                 for p in parts])
  return report.table(['Trainer wall s (MLMD)', 'training s',
                       'outside training s'] + parts, rows)


def render_default_job(runs: List[Dict[str, Any]]) -> str:
  """The default job's runs: the goal's verdict, then the parts."""
  job = default_job()
  outside = [r['trainer_wall_s'] - (r['timing'] or {}).get('train_s', 0.0)
             for r in runs]
  walls = [r['trainer_wall_s'] for r in runs]
  median = harness.median(outside)
  verdict = 'met' if median <= GOAL_OUTSIDE_TRAINING_S else 'NOT met'
  return (f'The default job (`make run`\'s Trainer: {job["train_steps"]} '
          f'steps, {job["eval_steps"]} eval steps, default settings), '
          f'{len(runs)} run(s): outside training median {median:.1f} s '
          f'(range {min(outside):.1f}-{max(outside):.1f} s; goal <= '
          f'{GOAL_OUTSIDE_TRAINING_S:.0f} s: {verdict}); the whole Trainer '
          f'step median {harness.median(walls):.1f} s ({min(walls):.1f}-'
          f'{max(walls):.1f} s). Parts from MLMD and `training_result.json` '
          '`timing`:\n\n' +
          render_fixed_cost(runs) + '\n')


def _pool_advantage(m: Dict[str, Any]) -> float:
  """How much faster the TF-default pool's ceiling ran than the trainer's
  pool's measured right after it (median over rounds; 1 where slower)."""
  return max(1.0, harness.median([tf_default / trainer_pool for tf_default,
                           trainer_pool in zip(m['ceiling_tf_default'],
                                               m['pool_pair'])]))


def bracket_ceiling(run: Dict[str, Any], advantage: float) -> Optional[float]:
  """The ceiling a trainer run is judged by: the mean of the two measured
  right before and after it, times the TF-default pool's `advantage`; None
  where those two differ by more than MAX_CEILING_SPREAD."""
  low, high = sorted((run['ceiling_before'], run['ceiling_after']))
  if high / low > MAX_CEILING_SPREAD:
    return None
  return (low + high) / 2 * advantage


def _whole_rate(run: Dict[str, Any], steps: int, batch: int) -> float:
  """Examples/s over the whole training: every call, traces and saves."""
  return steps * batch / run['timing']['train_s']


def _judged(m: Dict[str, Any], names: List[str], steps: int, batch: int
           ) -> Tuple[Dict[str, List[float]], Dict[str, List[float]]]:
  """Per variant, the steady and the whole-training ratios of its runs
  whose brackets judge them (`bracket_ceiling`)."""
  advantage = _pool_advantage(m)
  ratios: Dict[str, List[float]] = {name: [] for name in names}
  whole: Dict[str, List[float]] = {name: [] for name in names}
  for name in names:
    for run in m[name]:
      ceiling = bracket_ceiling(run, advantage)
      if ceiling is not None:
        ratios[name].append(run['examples_per_sec'] / ceiling)
        whole[name].append(_whole_rate(run, steps, batch) / ceiling)
  return ratios, whole


def _cell(key: str, m: Dict[str, Any], train_steps: int, ks: List[int]
         ) -> Tuple[List[str], Optional[str]]:
  """One strategy and batch: its table row and its verdict (one_device
  only, or why nothing could be judged)."""
  strategy, batch = key.split('@')
  names = ['auto'] + [f'k{k}' for k in ks]
  ratios, whole = _judged(m, names, steps_at(int(batch), train_steps),
                          int(batch))
  by_k = {k: harness.median(ratios[f'k{k}']) for k in ks if ratios[f'k{k}']}
  ceilings = m['ceiling']
  row = [strategy, batch,
         f'{harness.median(ceilings):,.0f} ({min(ceilings):,.0f}-'
         f'{max(ceilings):,.0f}, {max(ceilings) / min(ceilings):.2f}x)',
         f'{harness.median(m["ceiling_tf_default"]):,.0f} '
         f'({_pool_advantage(m):.2f})',
         f'{sum(map(len, ratios.values()))} of '
         f'{sum(len(m[n]) for n in names)}',
         f'{harness.median_of(m["auto"], "examples_per_sec"):,.0f}',
         ', '.join(map(_auto_label, m['auto']))]
  if not ratios['auto'] or not by_k:
    return row + ['-'] * 4, (
        f'{strategy} batch {batch}: NOT STEADY, no trainer run of '
        f"{'an explicit k' if ratios['auto'] else 'auto'} had a "
        f'bracket within {MAX_CEILING_SPREAD:.2f}x; nothing to judge.')
  auto = harness.median(ratios['auto'])
  best_k = max(by_k, key=by_k.get)
  whole_k = {k: harness.median(whole[f'k{k}']) for k in by_k}
  best_whole = max(whole_k, key=whole_k.get)
  vs_best_whole = harness.median(whole['auto']) / whole_k[best_whole]
  row += [f'{auto:.2f} ({len(ratios["auto"])})',
          ', '.join(f'k={k}: {v:.2f} ({len(ratios[f"k{k}"])})'
                    for k, v in by_k.items()),
          f'{auto / by_k[best_k]:.2f} (k={best_k})',
          f'{vs_best_whole:.2f} (k={best_whole})']
  if strategy != 'one_device':
    return row, None
  return row, (
      f'batch {batch}: defaults {auto:.2f} of the ceiling (goal >= '
      f'{GOAL_RATIO}: {"met" if auto >= GOAL_RATIO else "NOT met"}); '
      f'of the best explicit k (goal >= {GOAL_VS_BEST_K}): '
      f'{auto / by_k[best_k]:.2f} of k={best_k} steady, '
      f'{vs_best_whole:.2f} of k={best_whole} over the whole training.')


def _method(train_steps: int, rounds: int, load: List[float]) -> str:
  return (
      f'Full taxi data transformed once by OptimizedTransform (tuned for '
      f'batch {BATCHES[0]}), the taxi model, {train_steps} train steps at '
      f'batch {BATCHES[0]} (the same examples at larger batches, at least '
      f'{train_steps // 2} steps), {rounds} round(s) of interleaved '
      'measurements (each in a fresh process), medians. Ceiling: the same '
      'model and optimizer over one epoch of batches stacked in memory, '
      f'{CEILING_K} steps per `tf.function` call, no input pipeline, no '
      "checkpoints, with the op pool the trainer's `intra_op_threads='auto'` "
      "picks, measured right before and right after every trainer run, and "
      "once a round with TensorFlow's default pool, paired with the next; "
      'a trainer run is judged against the mean of its two brackets times '
      "the TF-default pool's paired advantage where it is faster (in "
      'brackets in the table), and not at all where its brackets differ '
      f'by more than {MAX_CEILING_SPREAD:.2f}x (steady brackets: how many '
      'runs were judged; the count of each ratio in brackets). '
      'HighPerfTrainer: its executor through LocalDagRunner (upstream '
      f'cached), checkpoints every {SAVE_EVERY_SECONDS} s; steady examples/s '
      'from `training_result.json` (first call excluded: a longer first '
      "call hides more of the first epoch's reads, which favours a large "
      "explicit k over 'auto''s 4-step first calls), and over the whole "
      'training (steps x batch / `timing.train_s`: every call, the traces '
      'and the checkpoints included). Load average '
      f'before/after: {load[0]:.1f} / {load[1]:.1f}.')


def render(measured: Dict[str, Any], train_steps: int, rounds: int,
           ks: List[int], load: List[float]) -> str:
  """The report's first section: each strategy and batch against its
  ceiling, and the goals' verdicts."""
  cells = [_cell(key, m, train_steps, ks) for key, m in measured.items()]
  verdicts = [verdict for _, verdict in cells if verdict]
  return (
      _method(train_steps, rounds, load) + '\n\n' +
      report.table(['strategy', 'global batch',
                    "ceiling ex/s, trainer's pool (range over the run)",
                    'ceiling ex/s, TF default (paired advantage)',
                    'steady brackets', 'defaults (auto) ex/s',
                    'auto chose k', 'defaults / ceiling',
                    'explicit k / ceiling',
                    'defaults / best k, steady',
                    'defaults / best k, whole training'],
                   [row for row, _ in cells]) +
      '\n\n' + '\n'.join(f'- {v}' for v in verdicts) + '\n')


def render_sections(breakdown: Dict[Any, Dict[str, Any]],
                    default_runs: List[Dict[str, Any]],
                    measured: Dict[str, Any]) -> str:
  """The breakdown (if measured) and the Trainer's time outside training:
  the default job's, then the runs with the defaults'."""
  body = ''
  if breakdown:
    body += ('\n## Where the loop loses to the ceiling\n\n'
             'Each piece alone in one process, one_device, '
             f'{CEILING_K} steps per call (`--mode breakdown`).\n\n' +
             render_breakdown(breakdown) + '\n')
  body += ('\n## The Trainer\'s time outside training\n\n' +
           render_default_job(default_runs))
  auto_runs = [r for m in measured.values() for r in m.get('auto', [])]
  if auto_runs:
    body += ('\nThe runs with the defaults above (every strategy and batch, '
             f'{EVAL_STEPS} eval steps):\n\n' +
             render_fixed_cost(auto_runs) + '\n')
  return body
