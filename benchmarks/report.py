"""Markdown tables for benchmark results, with the machine they ran on."""

import datetime
import os
import platform
from typing import List, Sequence


def machine_line() -> str:
  return (f'{platform.node()} · {os.cpu_count()} CPU cores · '
          f'Python {platform.python_version()} · '
          f'{datetime.datetime.now().isoformat(timespec="seconds")}')


def table(headers: Sequence[str], rows: List[Sequence[object]]) -> str:
  def cell(value):
    return f'{value:.3g}' if isinstance(value, float) else str(value)
  lines = ['| ' + ' | '.join(headers) + ' |',
           '|' + '|'.join('---' for _ in headers) + '|']
  lines += ['| ' + ' | '.join(cell(v) for v in row) + ' |' for row in rows]
  return '\n'.join(lines)


def write(results_dir: str, name: str, title: str, body: str) -> str:
  """Writes `<results_dir>/<name>.md` and returns its path."""
  os.makedirs(results_dir, exist_ok=True)
  path = os.path.join(results_dir, f'{name}.md')
  with open(path, 'w') as f:
    f.write(f'# {title}\n\nMeasured on {machine_line()}.\n\n{body}\n')
  return path
