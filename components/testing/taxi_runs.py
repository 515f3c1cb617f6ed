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

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from ml_metadata import metadata_store
from ml_metadata.proto import metadata_store_pb2
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
        module_file: Optional[str] = None,
        metadata_dir: Optional[str] = None,
        from_trainer: bool = False) -> summary.RunSummary:
  """The taxi pipeline with `make_trainer`'s Trainer, read back from MLMD
  (its file in the local `metadata_dir`, else in `root`); `from_trainer`:
  only Trainer and what follows, on the artifacts of the run before."""
  metadata_path = os.path.join(metadata_dir or root, METADATA)
  tfx.orchestration.LocalDagRunner().run(
      _pipeline(root, data_root, make_trainer, module_file or MODULE,
                train_steps=train_steps, eval_steps=eval_steps,
                accuracy_threshold=accuracy_threshold,
                metadata_path=metadata_path),
      run_options=pipeline_lib.RunOptions(
          from_nodes=[taxi_pipeline.TRAINER_ID]) if from_trainer else None)
  return summary.read_run(metadata_path)


def run_upstream(root: str, data_root: str) -> None:
  """ExampleGen .. Transform of `run`'s pipeline, recorded in `root`'s MLMD
  file for the later runs' cache."""
  pipeline = _pipeline(root, data_root, taxi_pipeline.stock_trainer, MODULE,
                       train_steps=1, eval_steps=1, accuracy_threshold=0.0,
                       metadata_path=os.path.join(root, METADATA))
  tfx.orchestration.LocalDagRunner().run(
      pipeline, run_options=pipeline_lib.RunOptions(
          to_nodes=[taxi_pipeline.TRANSFORM_ID]))


def start_from(upstream: str, root: str) -> None:
  """Makes `root` (a new local folder) a pipeline root whose MLMD file has
  `upstream`'s executions: a run of `NAME` there with caching on reuses them
  (their artifacts stay in `upstream`)."""
  shutil.copy(os.path.join(upstream, METADATA), os.path.join(root, METADATA))


def start_moved(upstream: str, destination: str, metadata_dir: str) -> None:
  """`start_from` with `upstream`'s artifacts copied under `destination` (a
  gs:// folder): the MLMD file in `metadata_dir` names the copies. A run
  there `from_trainer` reads its inputs from `destination`, as a pipeline on
  that storage would (a cached run would not: a cache key holds its inputs'
  URIs). Copied through Beam's filesystem, as Beam would have written them."""
  metadata_path = os.path.join(metadata_dir, METADATA)
  shutil.copy(os.path.join(upstream, METADATA), metadata_path)
  config = metadata_store_pb2.ConnectionConfig()
  config.sqlite.filename_uri = metadata_path
  store = metadata_store.MetadataStore(config)
  moved = [a for a in store.get_artifacts() if a.uri.startswith(upstream)]
  for artifact in moved:
    source = artifact.uri
    artifact.uri = f'{destination}/{os.path.relpath(source, upstream)}'
    files = ([source] if os.path.isfile(source) else
             [os.path.join(folder, name)
              for folder, _, names in os.walk(source) for name in names])
    for local in files:
      remote = f'{destination}/{os.path.relpath(local, upstream)}'
      # As is: by default Beam compresses what a .gz name is written to.
      with open(local, 'rb') as f, FileSystems.create(
          remote, compression_type=CompressionTypes.UNCOMPRESSED) as out:
        out.write(f.read())
  store.put_artifacts(moved)


def _pipeline(root: str, data_root: str,
              make_trainer: taxi_pipeline.TrainerFactory, module: str, *,
              train_steps: int, eval_steps: int, accuracy_threshold: float,
              metadata_path: str) -> tfx.dsl.Pipeline:
  return taxi_pipeline.create_pipeline(
      pipeline_name=NAME, pipeline_root=root,
      serving_model_dir=os.path.join(root, 'serving_model'),
      data_root=data_root, module_file=module, train_steps=train_steps,
      eval_steps=eval_steps, make_trainer=make_trainer, enable_cache=True,
      accuracy_threshold=accuracy_threshold, compare_to_baseline=False,
      metadata_path=metadata_path)
