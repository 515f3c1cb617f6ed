"""Writes the tuned input pipeline's report: markdown plus a PNG chart.

The report answers: whether training is input-bound at all (the reader's
rate against the model's), which stage limits throughput (per-stage rates),
what was tried (every candidate with its rate), and what was chosen and why
(early stop, reuse, placement and cache decisions). A batch that is not the
trainer's is flagged at the top. No TFX import.
"""

import io
import math
import os
from typing import Dict, List, Tuple

import tensorflow as tf

from components.transform.results import TuningResult

REPORT_FILE = 'report.md'
CHART_FILE = 'candidates.png'


def _mib(num_bytes: float) -> str:
  return f'{num_bytes / 2**20:,.1f} MiB'


def render_markdown(result: TuningResult, extra: Dict[str, str]) -> str:
  """The report text; `extra` adds context rows (e.g. Transform timings)."""
  lines = [*_summary_lines(result, extra), *_stage_lines(result),
           *_candidate_lines(result),
           '', '## Chosen config', '', '```json', result.config.to_json(),
           '```']
  if result.notes:
    lines += ['', '## Notes', ''] + [f'- {n}' for n in result.notes]
  return '\n'.join(lines) + '\n'


def _summary_lines(result: TuningResult, extra: Dict[str, str]) -> List[str]:
  """What was chosen, whether training is input-bound, and why."""
  chosen = result.chosen
  lines = [
      '# Tuned input pipeline',
      '',
      f'**Chosen:** {chosen.placement} / {chosen.name} at '
      f'**{chosen.examples_per_sec:,.0f} examples/s** (first epoch, batch '
      f'{result.batch_size}).',
  ]
  if result.batch_mismatch:
    lines += ['', f'> **Batch mismatch:** {result.batch_mismatch}; the rates '
              'below may not hold for the trainer.', '']
  lines.append(f'- decision: **{result.decision}**')
  if result.consumer is not None:
    verdict = {True: 'input-bound', False: 'not input-bound'}[
        result.input_bound]
    lines.append(f'- consumer (the model\'s training step): '
                 f'{result.consumer.examples_per_sec:,.0f} examples/s at '
                 f'batch {result.consumer.batch_size} '
                 f'({result.consumer.source}); training is **{verdict}**: '
                 f'{result.input_bound_reason}')
  else:
    lines.append('- consumer (the model\'s training step): not measured')
  for ref in result.references:
    lines.append(f'- vs {ref.name}: {ref.examples_per_sec:,.0f} examples/s '
                 f'(**{chosen.examples_per_sec / ref.examples_per_sec:.2f}x**)')
  if result.later_epochs_examples_per_sec:
    lines.append(f'- later epochs from the {result.config.cache} cache: '
                 f'{result.later_epochs_examples_per_sec:,.0f} examples/s')
  lines += [
      f'- throughput limited by: **{result.bottleneck}**',
      f'- transform placement: {result.placement_reason}',
      f'- cache: {result.cache_reason}',
      f'- examples in the tuned split: {result.num_examples:,}; '
      f'cached size ~{_mib(result.cache_bytes)}; RAM budget '
      f'{_mib(result.ram_budget_bytes)}',
      f'- tuning took {result.seconds:.1f} s for {len(result.candidates)} '
      f'candidates; load average {result.load_average:.1f} on '
      f'{result.cores} cores while measuring',
  ]
  return lines + [f'- {key}: {value}' for key, value in extra.items()]


def _stage_lines(result: TuningResult) -> List[str]:
  """Which stage limits the throughput."""
  lines = ['', '## Stages', '',
           'Cumulative rate of the pipeline up to each stage, and the rate '
           'of the stage alone (from the per-example cost it adds).', '',
           '| path | stage | cumulative examples/s | stage examples/s | '
           'read MB/s |', '|---|---|---:|---:|---:|']
  for s in result.stages:
    mbps = f'{s.bytes_per_sec / 1e6:,.1f}' if s.bytes_per_sec else ''
    alone = (f'{s.stage_examples_per_sec:,.0f}'
             if math.isfinite(s.stage_examples_per_sec) else
             '~0 cost (within noise)')
    lines.append(f'| {s.path} | {s.stage} | '
                 f'{s.cumulative_examples_per_sec:,.0f} | {alone} | {mbps} |')
  return lines


def _candidate_lines(result: TuningResult) -> List[str]:
  """Every pipeline measured, the chosen one marked."""
  lines = ['', '## Candidates', '',
           '| # | placement | knobs | examples/s | note |',
           '|---:|---|---|---:|---|']
  for i, c in enumerate(result.candidates + result.references, 1):
    mark = ' **(chosen)**' if c is result.chosen else ''
    lines.append(f'| {i} | {c.placement} | {c.name}{mark} | '
                 f'{c.examples_per_sec:,.0f} | {c.note} |')
  return lines


def warm_up() -> None:
  """Imports the charting library (a second or more), e.g. in a thread."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  # Imported for its side effect: loading pyplot is the slow part.
  from matplotlib import pyplot  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import


def render_chart(result: TuningResult) -> bytes:
  """PNG: bars of every candidate's examples/s, the chosen one green."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  rows = result.candidates + result.references
  labels = [f'{c.placement}: {c.name}' for c in rows]
  colors = ['tab:green' if c is result.chosen else
            'tab:gray' if c.placement == 'reference' else
            'tab:red' if not c.allowed else 'tab:blue' for c in rows]
  fig, ax = plt.subplots(figsize=(10, 0.4 * len(rows) + 1.5))
  ax.barh(range(len(rows)), [c.examples_per_sec for c in rows], color=colors)
  ax.set_yticks(range(len(rows)), labels, fontsize=8)
  ax.invert_yaxis()
  ax.set_xlabel('examples/s (first epoch)')
  ax.set_title('Input pipeline candidates (green: chosen, grey: reference, '
               'red: not allowed)', fontsize=9)
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format='png', dpi=100)
  plt.close(fig)
  return png.getvalue()


def write_report(result: TuningResult, out_dir: str,
                 extra: Dict[str, str]) -> Tuple[str, str]:
  """Writes report.md and candidates.png into out_dir (any tf.io.gfile
  filesystem); returns their paths."""
  tf.io.gfile.makedirs(out_dir)
  report_path = os.path.join(out_dir, REPORT_FILE)
  chart_path = os.path.join(out_dir, CHART_FILE)
  with tf.io.gfile.GFile(report_path, 'w') as f:
    f.write(render_markdown(result, extra))
  with tf.io.gfile.GFile(chart_path, 'wb') as f:
    f.write(render_chart(result))
  return report_path, chart_path
