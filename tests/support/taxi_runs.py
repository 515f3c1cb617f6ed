"""Trainer-level taxi pipeline runs in the session's shared root.

Runs in `shared_taxi_root` (tests/conftest.py) share one MLMD file with
caching on: the same pipeline name, the stock Transform on the taxi sample,
so ExampleGen .. Transform execute once a session and each run adds only its
Trainer, Evaluator and Pusher. Each export is judged on the accuracy bound
alone (runs on a tiny sample are not ordered by quality).
"""

import os
from typing import Optional

from tfx import v1 as tfx

from pipelines import summary
from pipelines import taxi_pipeline

NAME = 'tfx_hpm_tests'


def run(root: str, data_root: str,
        make_trainer: taxi_pipeline.TrainerFactory, *, train_steps: int,
        eval_steps: int, accuracy_threshold: float,
        module_file: Optional[str] = None) -> summary.RunSummary:
  """The taxi pipeline with `make_trainer`'s Trainer, read back from MLMD."""
  pipeline = taxi_pipeline.create_pipeline(
      pipeline_name=NAME, pipeline_root=root,
      serving_model_dir=os.path.join(root, 'serving_model'),
      data_root=data_root, module_file=module_file, train_steps=train_steps,
      eval_steps=eval_steps, make_trainer=make_trainer, enable_cache=True,
      accuracy_threshold=accuracy_threshold, compare_to_baseline=False)
  tfx.orchestration.LocalDagRunner().run(pipeline)
  return summary.read_run(os.path.join(root, 'metadata.db'))
