"""The walkthrough notebook runs top to bottom in a real Jupyter kernel."""

import os

import nbformat
from nbclient import NotebookClient
import pytest

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, 'notebooks', 'walkthrough.ipynb')


def _text(outputs) -> str:
  parts = []
  for output in outputs:
    if output.output_type == 'stream':
      parts.append(output.text)
    elif output.output_type in ('execute_result', 'display_data'):
      parts.append(output.data.get('text/plain', ''))
  return ''.join(parts)


def test_walkthrough_runs_the_pipeline_and_shows_the_trainer_decision():
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  # The kernel starts in the repository root, as the notebook asks.
  NotebookClient(notebook, timeout=900, kernel_name='python3',
                 resources={'metadata': {'path': REPO}}).execute()
  code = [cell for cell in notebook.cells if cell.cell_type == 'code']
  assert not [o for cell in code for o in cell.outputs
              if o.output_type == 'error']
  components = _text(code[1].outputs)
  assert "'Transform'" in components and "'Trainer'" in components
  run_summary = _text(code[2].outputs)
  assert '=== tfx-hpm pipeline summary ===' in run_summary
  for node in ('Transform', 'Trainer', 'Evaluator', 'Pusher'):
    assert any(line.split()[:2] == [node, 'COMPLETE']
               for line in run_summary.splitlines()), run_summary
  decision = _text(code[3].outputs)
  assert "'strategy':" in decision and "'reason':" in decision, decision
