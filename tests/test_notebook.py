"""The notebooks run top to bottom in a real Jupyter kernel and show what
they promise.

Each notebook is executed with nbclient in a fresh kernel started in the
repository root (outputs stay in memory; the committed notebooks have none).
Checks: no error output; the key executions COMPLETE, read back from the MLMD
store of the notebook's pipeline root (which its first cell prints); the
charts are inline as image/png outputs, the artifacts' own PNGs byte for
byte where a notebook shows them; and what each notebook is about (the
trainer's decision and resume event, the input-bound verdict, the pipelined
loss). Each takes a few minutes: slow, and extended (`make test-all`);
the static checks of the committed notebooks are fast.
"""

import base64
import glob
import json
import os
import re
import shutil
import tempfile

from ml_metadata.proto import metadata_store_pb2
import nbformat
from nbclient import NotebookClient
import pytest

from components.records import training_result
from tests.support import mlmd

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = os.path.join(REPO, 'notebooks')
NOTEBOOK = os.path.join(NOTEBOOKS, 'walkthrough.ipynb')
COMPONENT_NOTEBOOKS = ('trainer.ipynb', 'input_pipeline.ipynb',
                       'pipeline_parallel.ipynb')
_ROOT_LINE = re.compile(r'^pipeline root: (\S+)$', re.M)


def _text(outputs) -> str:
  parts = []
  for output in outputs:
    if output.output_type == 'stream':
      parts.append(output.text)
    elif output.output_type in ('execute_result', 'display_data'):
      parts.append(output.data.get('text/plain', ''))
      parts.append(output.data.get('text/markdown', ''))
  return ''.join(parts)


def _execute(name: str):
  """The executed notebook and its code cells; fails on any cell error."""
  notebook = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
  # The kernel starts in the repository root; it inherits this process's
  # environment (TF_USE_LEGACY_KERAS=1 from conftest).
  NotebookClient(notebook, timeout=900, kernel_name='python3',
                 resources={'metadata': {'path': REPO}}).execute()
  code = [cell for cell in notebook.cells if cell.cell_type == 'code']
  errors = [o for cell in code for o in cell.outputs
            if o.output_type == 'error']
  assert not errors, errors
  return notebook, code


def _all_text(code) -> str:
  return ''.join(_text(cell.outputs) for cell in code)


def _images(code):
  """The PNG bytes of every inline image (display data and results)."""
  return [base64.b64decode(o.data['image/png']) for cell in code
          for o in cell.outputs
          if o.output_type in ('display_data', 'execute_result') and
          'image/png' in o.data]


def _pipeline_root(code) -> str:
  match = _ROOT_LINE.search(_all_text(code))
  assert match, 'a setup cell prints "pipeline root: <path>"'
  return match.group(1)


def _states(root: str):
  """component id -> MLMD state of its last execution (InteractiveContext)."""
  store = mlmd.read_only_store(os.path.join(root, 'metadata.sqlite'))
  return {e.properties['component_id'].string_value:
              metadata_store_pb2.Execution.State.Name(e.last_known_state)
          for e in sorted(store.get_executions(), key=lambda e: e.id)}


def _assert_complete(root: str, components) -> None:
  states = _states(root)
  for component in components:
    assert states.get(component) == 'COMPLETE', states


def _read_bytes(pattern: str) -> bytes:
  [path] = glob.glob(pattern)
  with open(path, 'rb') as f:
    return f.read()


def _run_component_notebook(name: str, components):
  """Executes a component notebook; checks its executions COMPLETE.

  Returns its pipeline root, all its text output and its inline images.
  """
  _, code = _execute(name)
  root = _pipeline_root(code)
  _assert_complete(root, ['CsvExampleGen', 'StatisticsGen', 'SchemaGen',
                          'Transform', *components])
  return root, _all_text(code), _images(code)


def _remove_work_dir(root: str) -> None:
  """The notebook's temporary folder (the parent of its pipeline root)."""
  work = os.path.dirname(root)
  if (os.path.dirname(work) == tempfile.gettempdir() and
      os.path.basename(work).startswith('tfx_hpm_')):
    shutil.rmtree(work, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.extended
def test_walkthrough_runs_the_pipeline_and_shows_the_trainer_decision():
  _, code = _execute('walkthrough.ipynb')
  components = _text(code[1].outputs)
  assert "'Transform'" in components and "'Trainer'" in components
  run_summary = _text(code[2].outputs)
  assert '=== tfx-hpm pipeline summary ===' in run_summary
  for node in ('Transform', 'Trainer', 'Evaluator', 'Pusher'):
    assert any(line.split()[:2] == [node, 'COMPLETE']
               for line in run_summary.splitlines()), run_summary
  # Blessed at accuracy_threshold=0.78, above the majority class (~0.767).
  assert 'model blessed: True' in run_summary, run_summary
  decision = _text(code[3].outputs)
  assert "'strategy':" in decision and "'reason':" in decision, decision


def test_walkthrough_links_every_component_notebook():
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  markdown = '\n'.join(cell.source for cell in notebook.cells
                       if cell.cell_type == 'markdown')
  for name in COMPONENT_NOTEBOOKS:
    assert f']({name})' in markdown, name
    assert os.path.isfile(os.path.join(NOTEBOOKS, name)), name


@pytest.mark.parametrize('name', COMPONENT_NOTEBOOKS + ('walkthrough.ipynb',))
def test_committed_notebooks_have_no_outputs(name):
  notebook = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
  for cell in notebook.cells:
    if cell.cell_type == 'code':
      assert not cell.outputs and cell.execution_count is None, (
          f'{name}: clear the outputs before committing '
          f'(jupyter nbconvert --clear-output --inplace notebooks/{name})')


@pytest.mark.slow
@pytest.mark.extended
def test_trainer_notebook_trains_kills_resumes_and_evaluates():
  root, text, images = _run_component_notebook(
      'trainer.ipynb', ['Trainer_auto', 'Trainer_mirrored', 'Trainer_mwms',
                        'Trainer_resumed', 'Evaluator'])
  # The decision and its reason, for auto and the explicit strategies.
  assert 'nothing to distribute' in text, text
  assert "strategy='multi_worker_mirrored' was requested." in text
  # Training curves and the resumed run's curve are drawn inline.
  assert len(images) >= 2
  # The resume event, as model_run records it.
  assert 'restarts: 1  resumes: 1' in text, text
  assert re.search(r"resume event: \{[^\n]*'event': 'resumed'", text), text
  assert re.search(r'optimizer steps: (\d+) of \1 ', text), text
  [model_run] = glob.glob(os.path.join(
      root, 'Trainer_resumed', 'model_run', '*', 'training_result.json'))
  result = training_result.read(os.path.dirname(model_run))
  assert [e['event'] for e in result.resume_events] == ['resumed']
  with open(os.path.join(os.path.dirname(model_run), 'launch.json')) as f:
    launch = json.load(f)
  assert launch['relaunches'][0]['exit_code'] == -9  # SIGKILL
  # The Evaluator's bound is met, and beats the majority class.
  accuracy = float(re.search(r'binary_accuracy: ([0-9.]+)', text).group(1))
  majority = float(re.search(r'the majority class alone scores ([0-9.]+)',
                             text).group(1))
  assert 'validation_ok: True  blessed: True' in text, text
  assert accuracy >= 0.8 > majority, (accuracy, majority)
  _remove_work_dir(root)


@pytest.mark.slow
@pytest.mark.extended
def test_input_pipeline_notebook_shows_the_report_and_the_verdict():
  root, text, images = _run_component_notebook('input_pipeline.ipynb',
                                               ['Trainer'])
  # candidates.png itself, inline, plus the notebook's reader chart.
  assert _read_bytes(os.path.join(root, 'Transform', 'tuned_input_pipeline',
                                  '*', 'candidates.png')) in images
  assert len(images) >= 2
  assert '# Tuned input pipeline' in text  # report.md, rendered
  assert 'stock TFX reader' in text and 'vs stock' in text
  assert re.search(r'\*\*(Not input-bound|Close to input-bound|'
                   r'Input-bound)\.\*\*', text), text
  _remove_work_dir(root)


@pytest.mark.slow
@pytest.mark.extended
def test_pipeline_parallel_notebook_plans_and_matches_one_device():
  root, text, images = _run_component_notebook(
      'pipeline_parallel.ipynb', ['GPipePartitioner', 'Trainer'])
  for chart in ('stage_costs.png', 'schedule.png'):
    assert _read_bytes(os.path.join(root, 'GPipePartitioner',
                                    'partition_plan', '*', chart)) in images
  assert 'same initial weights: True' in text
  assert 'uniform' in text and 'vs optimum' in text
  # The notebook asserts the losses match; here, that the table is there.
  assert 'relative difference' in text
  assert "'pipeline_parallel': {'boundaries':" in text, text
  # GPipe vs 1F1B predicted memory, side by side, and the plan's choice.
  assert 'gpipe MiB' in text and '1f1b MiB' in text, text
  assert re.search(r'plan schedule: (gpipe|1f1b) - ', text), text
  _remove_work_dir(root)
