"""Benchmark results: markdown tables with the machine they ran on, MLMD
reads."""

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


# A results file's hand-kept part: from this heading on, a rerun keeps it.
HISTORY_HEADING = '## History and method'


def write(results_dir: str, name: str, title: str, body: str) -> str:
  """Writes `<results_dir>/<name>.md` and returns its path, keeping the
  previous file's HISTORY_HEADING section (earlier runs, methods) after the
  new results."""
  os.makedirs(results_dir, exist_ok=True)
  path = os.path.join(results_dir, f'{name}.md')
  history = ''
  if os.path.exists(path):
    with open(path) as f:
      previous = f.read()
    if f'\n{HISTORY_HEADING}' in previous:
      history = '\n' + previous[previous.index(f'\n{HISTORY_HEADING}') + 1:]
  with open(path, 'w') as f:
    f.write(f'# {title}\n\nMeasured on {machine_line()}.\n\n{body}\n'
            f'{history}')
  return path


def latest_model_run_uri(root: str) -> str:
  """The newest ModelRun artifact's uri in the pipeline root's MLMD."""
  # pylint: disable=g-import-not-at-top
  from ml_metadata import metadata_store
  from ml_metadata.proto import metadata_store_pb2
  # pylint: enable=g-import-not-at-top
  config = metadata_store_pb2.ConnectionConfig()
  config.sqlite.filename_uri = os.path.join(root, 'metadata.db')
  config.sqlite.connection_mode = 1  # READONLY
  runs = metadata_store.MetadataStore(config).get_artifacts_by_type('ModelRun')
  return max(runs, key=lambda a: a.id).uri
