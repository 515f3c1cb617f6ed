"""Benchmark results: markdown tables with the TFX lane and the machine they
ran on, MLMD reads."""

import datetime
import importlib.metadata
import os
import platform
from typing import List, Sequence

# The lane whose results keep the plain file names; the other lane's go to
# `<name>-tfx<lane>.md` beside them, so both lanes' numbers stand side by side.
PLAIN_NAMES_LANE = '1.16'


def lane() -> str:
  """The TFX lane of this process, e.g. '1.21'."""
  return '.'.join(importlib.metadata.version('tfx').split('.')[:2])


def lane_line() -> str:
  versions = ', '.join(
      f'{label} {importlib.metadata.version(package)}'
      for label, package in (('TFX', 'tfx'), ('TensorFlow', 'tensorflow'),
                             ('Beam', 'apache-beam'), ('KFP', 'kfp')))
  return f'the TFX {lane()} lane ({versions})'


def machine_line() -> str:
  return (f'{platform.node()} · {os.cpu_count()} CPU cores · '
          f'Python {platform.python_version()} · '
          f'{datetime.datetime.now().isoformat(timespec="seconds")}')


def results_name(name: str) -> str:
  """The file name (without .md) of benchmark `name` on this lane."""
  return name if lane() == PLAIN_NAMES_LANE else f'{name}-tfx{lane()}'


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
  """Writes `<results_dir>/<results_name(name)>.md` and returns its path,
  keeping the previous file's HISTORY_HEADING section (earlier runs,
  methods) after the new results."""
  os.makedirs(results_dir, exist_ok=True)
  path = os.path.join(results_dir, f'{results_name(name)}.md')
  history = ''
  if os.path.exists(path):
    with open(path) as f:
      previous = f.read()
    if f'\n{HISTORY_HEADING}' in previous:
      history = '\n' + previous[previous.index(f'\n{HISTORY_HEADING}') + 1:]
  with open(path, 'w') as f:
    f.write(f'# {title}\n\nMeasured on {lane_line()}, {machine_line()}.\n\n'
            f'{body}\n{history}')
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
