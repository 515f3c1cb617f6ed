"""What earlier runs of this pipeline left: the last tuning, the last training.

A TFX 1.16 executor gets no MLMD handle (`BaseExecutor.Context` holds paths
and the pipeline IR, not the metadata connection), and the alternatives that
do reach MLMD cost more than they give: a resolver input (the latest
TunedInputPipeline / ModelRun channel) changes the inputs of every run, so
the step would never hit the execution cache, and a custom driver does not
compile for Kubeflow V2. So the executor reads the artifacts' files, which
live in the pipeline root in TFX's layout
`<pipeline_root>/<node_id>/<output_key>/<execution_id>/`:
- the previous TunedInputPipeline artifacts of this node are the siblings of
  this execution's output folder; each has `fingerprint.json` (what it was
  tuned on) next to `config.json` (`records.tuned_input_pipeline`);
- the steady `examples_per_sec` the latest managed HighPerfTrainer training
  published under the pipeline root (`components.records.training_result`).
With another layout (e.g. Kubeflow's per-run folders) nothing is found and
the component tunes from scratch. Any tf.io.gfile filesystem; no TFX import.
"""

import dataclasses
import hashlib
import json
import os
from typing import Any, Dict, Optional, Tuple

from absl import logging
import tensorflow as tf

from components.data.input_pipeline import InputPipelineConfig
from components.records import training_result
from components.records import tuned_input_pipeline
from components import storage

FINGERPRINT_FILE = 'fingerprint.json'
_FORMAT_VERSION = 1


def feature_spec_digest(feature_spec: Dict[str, Any]) -> str:
  """A stable digest of the transformed feature spec (names, types, shapes).

  That is the part of the transformed schema the reader depends on; domains
  and statistics in the schema do not change how examples are read.
  """
  text = repr(sorted((name, repr(spec)) for name, spec in
                     feature_spec.items()))
  return hashlib.sha256(text.encode()).hexdigest()


def tuning_key(feature_spec: Dict[str, Any], num_examples: Optional[int],
               split: str, batch_size: int) -> Dict[str, Any]:
  """What a tuning is valid for: the same data volume, schema and batch."""
  return {'version': _FORMAT_VERSION,
          'feature_spec_sha256': feature_spec_digest(feature_spec),
          'num_examples': num_examples, 'tune_split': split,
          'batch_size': batch_size}


@dataclasses.dataclass
class Reusable:
  """The newest previous tuning of this node, and whether it may be reused."""
  uri: str
  config: Optional[InputPipelineConfig]
  reason: str  # Why it is (or is not) reused, for the report.


def _read_json(path: str) -> Optional[Dict[str, Any]]:
  try:
    with tf.io.gfile.GFile(path) as f:
      return json.load(f)
  except (tf.errors.OpError, ValueError) as e:
    logging.info('Cannot read %s: %s', path, e)
    return None


def previous_tuning(output_uri: str, key: Dict[str, Any]) -> Optional[Reusable]:
  """The newest earlier TunedInputPipeline of this node, checked against key.

  Args:
    output_uri: This execution's TunedInputPipeline folder.
    key: `tuning_key(...)` of this execution's data.

  Returns:
    None when there is no earlier one; else a Reusable whose config is set
    only when its key equals `key` (with a known example count).
  """
  parent = os.path.dirname(output_uri.rstrip('/'))
  this = os.path.basename(output_uri.rstrip('/'))
  try:
    names = tf.io.gfile.listdir(parent)
  except tf.errors.OpError:
    return None
  fingerprints = [os.path.join(parent, n.rstrip('/'), FINGERPRINT_FILE)
                  for n in names if n.rstrip('/') != this]
  fingerprints = [f for f in fingerprints if tf.io.gfile.exists(f)]
  if not fingerprints:
    return None
  newest = storage.newest_first(fingerprints)[0]
  uri = os.path.dirname(newest)
  old = _read_json(newest) or {}
  differences = [
      what for what, field in (('transformed feature spec',
                                'feature_spec_sha256'),
                               ('tune split', 'tune_split'),
                               ('batch size', 'batch_size'),
                               ('format', 'version'))
      if old.get(field) != key.get(field)]
  if old.get('num_examples') != key.get('num_examples') or (
      key.get('num_examples') is None):
    differences.append(f'example count ({old.get("num_examples")} then, '
                       f'{key.get("num_examples")} now)')
  if differences:
    return Reusable(uri, None, 'not reused: changed since ' + uri + ': ' +
                    ', '.join(differences))
  try:
    config = tuned_input_pipeline.read(uri)
  except (TypeError, ValueError, FileNotFoundError,
          tf.errors.OpError) as e:
    return Reusable(uri, None, f'not reused: unreadable config in {uri} ({e})')
  return Reusable(uri, config, f'the previous tuning {uri}')


@dataclasses.dataclass
class PreviousTraining:
  """The last training's steady rate and the batch its input pipeline read."""
  examples_per_sec: float
  # Examples per batch of its input pipeline: each replica's batch times the
  # gradient-accumulation steps (what the tuner measures at).
  reader_batch: int
  uri: str


def previous_training(pipeline_root: str) -> Optional[PreviousTraining]:
  """The rate the newest HighPerfTrainer training of this pipeline
  published (`training_result.publish_steady_rate`)."""
  if not pipeline_root:
    return None
  rate = training_result.newest_steady_rate(pipeline_root)
  return rate and PreviousTraining(rate.examples_per_sec, rate.reader_batch,
                                   rate.model_run_dir)


def write_fingerprint(output_uri: str, key: Dict[str, Any],
                      extra: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
  """Writes `fingerprint.json` (key plus `extra`) into the artifact."""
  content = {**key, **extra}
  path = os.path.join(output_uri, FINGERPRINT_FILE)
  with tf.io.gfile.GFile(path, 'w') as f:
    f.write(json.dumps(content, sort_keys=True, indent=1))
  return path, content
