"""Where the pipeline root is, seen from an executor (pure)."""

from components import pipeline_layout


def test_the_root_is_above_the_executor_output_or_the_fallback():
  output = 'gs://b/root/Trainer/.system/executor_execution/7/executor_output.pb'
  assert pipeline_layout.pipeline_root(output, 'x') == 'gs://b/root'
  assert pipeline_layout.pipeline_root(None, 'x') == 'x'


def test_above_never_climbs_past_a_filesystem_root():
  """A model_run on `ram://` has no folders above it: its records stay on
  `ram://`, not in the working directory (a test once wrote one there)."""
  assert pipeline_layout.above('ram://model_run-1', 2) == 'ram://'
  assert pipeline_layout.above('gs://b/r/Trainer/model_run/3', 2) == (
      'gs://b/r/Trainer')
  assert pipeline_layout.above('/r/Trainer/model_run/3/', 2) == '/r/Trainer'
  assert pipeline_layout.above('/a', 2) == '/'
  assert pipeline_layout.above('relative', 1) == '.'
