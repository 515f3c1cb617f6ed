"""Trainer-level taxi pipeline runs on one upstream a test run.

Runs in `shared_taxi_root` (tests/conftest.py) start from one MLMD file with
caching on: the same pipeline name, the stock Transform on the taxi sample,
so ExampleGen .. Transform execute once (`run_upstream`) and each run adds
only its Trainer, Evaluator and Pusher. The module is named by import
(`MODULE`), not as a file: a file would be packaged into a wheel under the
pipeline root, whose path would enter the Transform's cache key, and each
worker has a root of its own. Each export is judged on the accuracy bound
alone (runs on a tiny sample are not ordered by quality).
"""

import os
import shutil
from typing import Optional

from tfx import v1 as tfx
from tfx.orchestration import pipeline as pipeline_lib

from pipelines import summary
from pipelines import taxi_pipeline

NAME = 'tfx_hpm_tests'
MODULE = 'pipelines.taxi_module'
METADATA = 'metadata.db'


def run(root: str, data_root: str,
        make_trainer: taxi_pipeline.TrainerFactory, *, train_steps: int,
        eval_steps: int, accuracy_threshold: float,
        module_file: Optional[str] = None) -> summary.RunSummary:
  """The taxi pipeline with `make_trainer`'s Trainer, read back from MLMD."""
  tfx.orchestration.LocalDagRunner().run(_pipeline(
      root, data_root, make_trainer, module_file or MODULE,
      train_steps=train_steps, eval_steps=eval_steps,
      accuracy_threshold=accuracy_threshold))
  return summary.read_run(os.path.join(root, METADATA))


def run_upstream(root: str, data_root: str) -> None:
  """ExampleGen .. Transform of `run`'s pipeline, recorded in `root`'s MLMD
  file for the later runs' cache."""
  pipeline = _pipeline(root, data_root, taxi_pipeline.stock_trainer, MODULE,
                       train_steps=1, eval_steps=1, accuracy_threshold=0.0)
  tfx.orchestration.LocalDagRunner().run(
      pipeline, run_options=pipeline_lib.RunOptions(
          to_nodes=[taxi_pipeline.TRANSFORM_ID]))


def start_from(upstream: str, root: str) -> None:
  """Makes `root` (a new local folder) a pipeline root whose MLMD file has
  `upstream`'s executions: a run of `NAME` there with caching on reuses them
  (their artifacts stay in `upstream`)."""
  shutil.copy(os.path.join(upstream, METADATA), os.path.join(root, METADATA))


def _pipeline(root: str, data_root: str,
              make_trainer: taxi_pipeline.TrainerFactory, module: str, *,
              train_steps: int, eval_steps: int,
              accuracy_threshold: float) -> tfx.dsl.Pipeline:
  return taxi_pipeline.create_pipeline(
      pipeline_name=NAME, pipeline_root=root,
      serving_model_dir=os.path.join(root, 'serving_model'),
      data_root=data_root, module_file=module, train_steps=train_steps,
      eval_steps=eval_steps, make_trainer=make_trainer, enable_cache=True,
      accuracy_threshold=accuracy_threshold, compare_to_baseline=False,
      metadata_path=os.path.join(root, METADATA))
