"""Where one training's checkpoints live: a folder that survives TFX.

TFX gives every execution fresh output URIs and deletes its stateful working
dir, so a restarted Trainer cannot find the previous attempt's checkpoints
there. `stable_checkpoint_dir` derives the location from the pipeline, the
node and a fingerprint of the inputs and training config instead: re-running
the same training finds its checkpoints, a changed input or config gets a new,
empty directory (and `CheckpointStore.other_fingerprints` says what was there).
Pure Python: the Kubeflow compile names the same root.
"""

import hashlib
import json
import os
import re
from typing import Any, Dict, Optional

# The default checkpoint root's folder under the pipeline root.
CHECKPOINT_SUBDIR = '_hpm_checkpoints'
_SAFE_NAME = re.compile(r'[^A-Za-z0-9._-]+')


def checkpoint_root(backup_root: Optional[str], pipeline_root: str) -> str:
  """`fault_tolerance.backup_root` where set, else
  `<pipeline_root>/_hpm_checkpoints`: outside any run's folder (Kubeflow's
  `<pipeline_root>/<pipeline>/<run id>/...`), so a resubmitted run finds the
  checkpoints of the one it replaces. The trainer keys its checkpoints under
  it by pipeline, node and training fingerprint (`stable_checkpoint_dir`)."""
  return backup_root or os.path.join(pipeline_root, CHECKPOINT_SUBDIR)


def join(*parts: str) -> str:
  """`/`-joined path on any gfile filesystem (os.path.join is local)."""
  return '/'.join([parts[0].rstrip('/')] + [p.strip('/') for p in parts[1:]])


def training_fingerprint(input_uris: Dict[str, Any],
                         training_config: Dict[str, Any]) -> str:
  """A short hash naming one training: same inputs and config, same name.

  Args:
    input_uris: Input artifact URIs by name (e.g. examples, transform graph).
      TFX reuses a cached artifact's URI, so an unchanged upstream keeps it.
    training_config: Everything that changes the training trajectory: module
      file contents (or hash), hparams, train steps, distribution and input
      pipeline configs. Leave out checkpoint cadence, which does not.
  """
  canonical = json.dumps({'inputs': input_uris, 'config': training_config},
                         sort_keys=True, default=str, separators=(',', ':'))
  return hashlib.sha256(canonical.encode('utf-8')).hexdigest()[:16]


def stable_checkpoint_dir(backup_root: str, pipeline_name: str, node_id: str,
                          fingerprint: str) -> str:
  """`<backup_root>/<pipeline>/<node>/<fingerprint>` on any gfile filesystem."""
  parts = {'backup_root': backup_root, 'pipeline_name': pipeline_name,
           'node_id': node_id, 'fingerprint': fingerprint}
  for name, value in parts.items():
    if not isinstance(value, str) or not value.strip():
      raise ValueError(f'{name}={value!r} must be a non-empty string.')
  names = [_SAFE_NAME.sub('_', v) for v in (pipeline_name, node_id,
                                             fingerprint)]
  return '/'.join([backup_root.rstrip('/')] + names)
