"""Container entrypoint: TFX's KFP v2 executor entrypoint, fed what KFP sends.

    python -m kubeflow.entrypoint --executor_class_path ... \
        --json_serialized_invocation_args '{{$}}' \
        --json_serialized_inputs_spec_args '<ComponentInputsSpec JSON>' \
        [beam args]

Runs `tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor`
unchanged, after one repair of its `--json_serialized_invocation_args`:

Open-source KFP 2.x passes each input artifact with `type: {instanceSchema:
""}`: its driver rebuilds input artifacts from MLMD and leaves the schema
empty (backend/src/v2/metadata/client.go, GetOutputArtifactsByExecutionId:
`Schema: "" // TODO(Bobgy): figure out how to get schema`). TFX 1.16 takes the
artifact class from that type (kubeflow_v2_entrypoint_utils.
_retrieve_class_path) and fails on an empty schema with `AttributeError:
'NoneType' object has no attribute 'get'` (tensorflow/tfx#7768). The component's
own input definitions, which TFX passes as --json_serialized_inputs_spec_args
(pipeline spec 2.1), hold every input's artifact type; an input artifact whose
type is empty gets it from there. Artifacts that arrive typed (Vertex AI
Pipelines) are left as they are.

And one removal: KFP backends since 2.1x (2.16.1 here, `publish_logs` on by
default) add an output `executor-logs` of type `system.Artifact` to every
container task (driver.go provisionOutputs; the launcher copies the task's
log into it itself). It is not the component's, and TFX imports every output's
class by its schema title: `system.Artifact` does not import, so every task
would fail. It is dropped from what TFX gets; the launcher still records it.

And one registration: TFX's entrypoint imports a custom artifact class by its
schema title, `<module>.<Class>`. tfx-hpm's types are named
`tfx_hpm.TunedInputPipeline` and `tfx_hpm.PartitionPlan` but live in
`components.types`; `components.patches.ARTIFACT_TYPES_BY_TITLE` makes them
importable by that title while TFX's entrypoint runs.

And one check: before the executor runs, a probe object is written under
every output artifact's URI, so that a pipeline root that cannot be written
fails at the first task that writes, naming the URI and the storage's error,
before any work (KFP's driver and launcher write nothing there first).
"""

import os

# Keras 2 (tf-keras) for TFX 1.16, before anything imports TensorFlow (the
# image sets it too; `kubeflow` is a namespace package with no __init__ of
# ours to do it). A value already set wins.
os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')

# pylint: disable=g-import-not-at-top,wrong-import-position
import runpy
import sys
from typing import List, Optional

from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2
# pylint: enable=g-import-not-at-top,wrong-import-position

TFX_ENTRYPOINT = (
    'tfx.orchestration.kubeflow.v2.container.kubeflow_v2_run_executor')
INVOCATION_FLAG = '--json_serialized_invocation_args'
# The backend's own log output (KFP backend 2.1x's publish_logs).
EXECUTOR_LOGS_OUTPUT = 'executor-logs'
INPUTS_SPEC_FLAG = '--json_serialized_inputs_spec_args'
# TF's GCS client retries a missing bucket's 404 without end: the probe of
# an output that does not answer in this time fails.
OUTPUT_CHECK_TIMEOUT_S = 60.0


def _has_schema(artifact_type: pipeline_spec_pb2.ArtifactTypeSchema) -> bool:
  kind = artifact_type.WhichOneof('kind')
  return bool(kind and getattr(artifact_type, kind))


def repair_executor_input(executor_input_json: str,
                          inputs_spec_json: Optional[str]) -> str:
  """The ExecutorInput JSON with every untyped input artifact typed and the
  backend's executor-logs output dropped.

  Raises:
    ValueError: an input artifact has no type and no inputs spec names it.
  """
  executor_input = json_format.Parse(executor_input_json,
                                     pipeline_spec_pb2.ExecutorInput(),
                                     ignore_unknown_fields=True)
  spec = pipeline_spec_pb2.ComponentInputsSpec()
  if inputs_spec_json:
    json_format.Parse(inputs_spec_json, spec, ignore_unknown_fields=True)
  changed = False
  for name, artifact_list in executor_input.inputs.artifacts.items():
    for artifact in artifact_list.artifacts:
      if _has_schema(artifact.type):
        continue
      if name not in spec.artifacts:
        raise ValueError(
            f'Input artifact {name!r} ({artifact.uri}) arrived without a type '
            f'and {INPUTS_SPEC_FLAG} does not define it; compile with '
            'KubeflowV2DagRunnerConfig(use_pipeline_spec_2_1=True).')
      artifact.type.CopyFrom(spec.artifacts[name].artifact_type)
      changed = True
  logs = executor_input.outputs.artifacts.get(EXECUTOR_LOGS_OUTPUT)
  if logs is not None and all(
      artifact.type.schema_title == 'system.Artifact'
      for artifact in logs.artifacts):
    del executor_input.outputs.artifacts[EXECUTOR_LOGS_OUTPUT]
    changed = True
  if not changed:
    return executor_input_json
  return json_format.MessageToJson(executor_input)


def _flag_value(argv: List[str], flag: str) -> Optional[int]:
  """Index of `flag`'s value in argv (`--flag value` or `--flag=value`)."""
  for i, arg in enumerate(argv):
    if arg == flag and i + 1 < len(argv):
      return i + 1
    if arg.startswith(flag + '='):
      return i
  return None


def _flag_text(argv: List[str], flag: str) -> Optional[str]:
  """`flag`'s value in argv, either form, or None."""
  index = _flag_value(argv, flag)
  if index is None:
    return None
  value = argv[index]
  return value[len(flag) + 1:] if value.startswith(flag + '=') else value


def repair_argv(argv: List[str]) -> List[str]:
  """argv with its --json_serialized_invocation_args repaired."""
  argv = list(argv)
  invocation = _flag_value(argv, INVOCATION_FLAG)
  if invocation is None:
    return argv  # TFX's own flag parser reports the missing flag.
  prefix = (INVOCATION_FLAG + '=' if argv[invocation].startswith(
      INVOCATION_FLAG + '=') else '')
  argv[invocation] = prefix + repair_executor_input(
      _flag_text(argv, INVOCATION_FLAG), _flag_text(argv, INPUTS_SPEC_FLAG))
  return argv


def check_outputs_writable(executor_input_json: str,
                           timeout_s: float = OUTPUT_CHECK_TIMEOUT_S) -> None:
  """Writes and removes a probe under each output artifact's URI.

  A value artifact's URI is its file, so its folder is probed.

  Raises:
    components.storage.StorageNotWritableError: naming the output, its URI
      and the storage's error (or that it did not answer in `timeout_s`).
  """
  # pylint: disable=g-import-not-at-top
  from tfx.orchestration.kubeflow.v2.container import (
      kubeflow_v2_entrypoint_utils)
  from tfx.types import value_artifact
  from components import storage
  # pylint: enable=g-import-not-at-top
  executor_input = json_format.Parse(executor_input_json,
                                     pipeline_spec_pb2.ExecutorInput(),
                                     ignore_unknown_fields=True)
  outputs = kubeflow_v2_entrypoint_utils.parse_raw_artifact_dict(
      executor_input.outputs.artifacts)
  for name, artifacts in sorted(outputs.items()):
    for artifact in artifacts:
      location = (os.path.dirname(artifact.uri) if isinstance(
          artifact, value_artifact.ValueArtifact) else artifact.uri)
      storage.check_writable(location, f'{name} output', timeout_s=timeout_s)


def main(argv: Optional[List[str]] = None) -> None:
  from components import patches  # pylint: disable=g-import-not-at-top
  args = repair_argv(sys.argv[1:] if argv is None else argv)
  with patches.installed(patches.ARTIFACT_TYPES_BY_TITLE,
                         patches.DIRECT_RUNNER_IN_PROCESS):
    invocation = _flag_text(args, INVOCATION_FLAG)
    if invocation is not None:
      check_outputs_writable(invocation)
    sys.argv = [TFX_ENTRYPOINT] + args
    runpy.run_module(TFX_ENTRYPOINT, run_name='__main__', alter_sys=True)


if __name__ == '__main__':
  main()
