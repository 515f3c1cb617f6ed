"""The JSON description of one training job, handed to training processes.

The executor resolves everything a training process needs (files, output
dirs, configs, the stable checkpoint dir) into a `TrainingTask`; every process
of a local cluster, and the in-process trainer, starts from the same task;
`feature_spec` is what its examples parse with. No TFX import, so child
processes start fast and tests run without TFX.
"""

import dataclasses
import json
import os
from typing import Any, Dict, List, Optional

import tensorflow as tf

from components import storage


@dataclasses.dataclass
class TrainingTask:
  """Everything a training process needs, JSON-serializable."""
  # The user module: `module_file` (path) or `module_path` (importable name).
  module_file: Optional[str]
  module_path: Optional[str]
  # 'managed' (module has build_model; we own the loop) or 'run_fn'.
  mode: str
  train_files: List[str]
  eval_files: List[str]
  transform_output: Optional[str]
  schema_path: Optional[str]
  serving_model_dir: str
  model_run_dir: str
  train_steps: int
  eval_steps: int
  hparams: Dict[str, Any]
  custom_config: Dict[str, Any]
  # DistributionConfig.to_dict() (components/trainer/config.py).
  distribution: Dict[str, Any]
  # FaultToleranceConfig.to_dict() (components/trainer/checkpoint/config.py).
  fault_tolerance: Dict[str, Any]
  # Stable checkpoint location that survives executions (resolved by the
  # executor from pipeline name, node id and the training fingerprint).
  checkpoint_dir: str
  # InputPipelineConfig.to_dict() from a TunedInputPipeline, or None.
  input_pipeline: Optional[Dict[str, Any]] = None
  # URI of a PartitionPlan artifact, or None.
  partition_plan_uri: Optional[str] = None
  # The `base_model` input's SavedModel (`fn_args.base_model`): a fresh
  # managed training starts from its weights; None starts from scratch.
  base_model: Optional[str] = None
  # The full TFX executor inputs, for `run_fn` mode: the training process
  # rebuilds the stock `fn_args` from them (artifacts as JSON).
  executor_io: Optional[Dict[str, Any]] = None
  # The weights of the module's model, counted by the executor (managed mode,
  # where an `auto` option reads it before the training process builds the
  # model: `cpu_threads.compute_bound`); None: not counted.
  model_weights: Optional[int] = None

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), sort_keys=True, indent=1)

  @classmethod
  def from_json(cls, text: str) -> 'TrainingTask':
    return cls(**json.loads(text))

  def save(self, path: str) -> None:
    storage.write_text(path, self.to_json())

  @classmethod
  def load(cls, path: str) -> 'TrainingTask':
    return cls.from_json(storage.read_text(path))

  def output_dirs(self) -> Dict[str, str]:
    """The folders the training processes write, by role: every process of
    a cluster must reach them."""
    return {'model': self.serving_model_dir, 'model_run': self.model_run_dir,
            'checkpoints': self.checkpoint_dir}

  def local_output_dirs(self) -> Dict[str, str]:
    """The output folders on a local filesystem: processes on other hosts
    cannot see them."""
    return {role: path for role, path in self.output_dirs().items()
            if storage.is_local(path)}


def feature_spec(task: TrainingTask) -> Dict[str, Any]:
  """Parsing spec of the training examples: transformed, else from schema."""
  import tensorflow_transform as tft  # pylint: disable=g-import-not-at-top
  if task.transform_output:
    return tft.TFTransformOutput(task.transform_output
                                ).transformed_feature_spec()
  if task.schema_path:
    from google.protobuf import text_format  # pylint: disable=g-import-not-at-top
    from tensorflow_metadata.proto.v0 import schema_pb2  # pylint: disable=g-import-not-at-top
    from tensorflow_transform.tf_metadata import schema_utils  # pylint: disable=g-import-not-at-top
    schema = schema_pb2.Schema()
    path = task.schema_path
    if tf.io.gfile.isdir(path):  # A Schema artifact's folder.
      path = os.path.join(path, 'schema.pbtxt')
    with tf.io.gfile.GFile(path) as f:
      text_format.Parse(f.read(), schema)
    return schema_utils.schema_as_feature_spec(schema).feature_spec
  raise ValueError('Parsing the examples needs a transform_graph or a schema '
                   'input; the Trainer got neither.')
