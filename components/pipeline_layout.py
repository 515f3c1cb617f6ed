"""Where a TFX pipeline's root is, seen from inside one of its executors.

Components share records that belong to the pipeline rather than to one
artifact (the trainer's checkpoints, its last steady rate) under the root.
TFX gives an executor its output folder, `<root>/<node>/.system/...`, not the
root itself; any tf.io.gfile filesystem. No TFX import.
"""

import os
from typing import Optional


def pipeline_root(executor_output_uri: Optional[str],
                  output_artifact_uri: str) -> str:
  """The root above `<root>/<node>/.system/...`; without that (an executor
  run by hand, TFX's Kubeflow entrypoint, which gives none), the folder
  three above `output_artifact_uri`, one of this execution's output
  artifacts: `<root>/<node>/<output_key>/<execution_id>` in TFX's layout."""
  output_uri = executor_output_uri or ''
  if '/.system/' in output_uri:
    return os.path.dirname(output_uri.split('/.system/')[0])
  return above(output_artifact_uri, 3)


def above(uri: str, levels: int) -> str:
  """The folder `levels` levels above `uri`, never above its filesystem's
  root (`ram://x` two levels up is `ram://`, not the working directory)."""
  scheme, separator, path = uri.rpartition('://')
  path = path.rstrip('/')
  for _ in range(levels):
    path = os.path.dirname(path)
  if separator:
    return f'{scheme}://{path}'
  return path or ('/' if uri.startswith('/') else '.')
