"""Where the pipeline root is, seen from an executor (pure)."""

from components import pipeline_layout


def test_the_root_is_above_the_executor_output_or_an_output_artifact():
  output = 'gs://b/root/Trainer/.system/executor_execution/7/executor_output.pb'
  assert pipeline_layout.pipeline_root(output, 'gs://elsewhere') == (
      'gs://b/root')
  # Without an executor output URI: the trainer's model_run and the
  # transform's tuned_input_pipeline artifacts name the same root.
  for artifact in ('gs://b/root/Trainer/model_run/7',
                   'gs://b/root/Transform/tuned_input_pipeline/5/'):
    assert pipeline_layout.pipeline_root(None, artifact) == 'gs://b/root'


def test_above_never_climbs_past_a_filesystem_root():
  """A model_run on `ram://` has no folders above it: its records stay on
  `ram://`, not in the working directory (a test once wrote one there)."""
  assert pipeline_layout.above('ram://model_run-1', 2) == 'ram://'
  assert pipeline_layout.above('gs://b/r/Trainer/model_run/3', 2) == (
      'gs://b/r/Trainer')
  assert pipeline_layout.above('/r/Trainer/model_run/3/', 2) == '/r/Trainer'
  assert pipeline_layout.above('/a', 2) == '/'
  assert pipeline_layout.above('relative', 1) == '.'
