"""Runs a compiled KFP v2 PipelineJob (pipeline spec 2.1) on this machine the
way the open-source KFP 2.x backend's driver and launcher run it.

    backend = KfpBackend('pipeline.json', work_dir='/tmp/kfp')
    results = backend.run()          # every task, in dependency order
    results['Pusher'].outputs        # {'pushed_model': [RuntimeArtifact]}

For each task of `pipelineSpec.root.dag` (topological order of
`dependentTasks` and the producers its inputs name), this does what the
backend's Go code does, read from kubeflow/pipelines at tag 2.16.1 (the
backend released with KFP SDK 2.16.1, the TFX 1.21 lane's; it runs the TFX
1.16 lane's KFP 2.5 output alike). First read at 2.0.5; what changed since
is marked (2.16):

- inputs (driver, backend/src/v2/driver/driver.go `resolveInputs`):
  `parameterValues` from `runtimeValue.constant`, from the root's inputs
  (`componentInputParameter`: runtimeConfig.parameterValues, else the root's
  defaults) or from an upstream task's output parameters; `artifacts` from
  the upstream task's recorded outputs, rebuilt from MLMD as the driver does
  (`metadata.Artifact.ToRuntimeArtifact`): `name` is the MLMD id, the
  metadata is the artifact's custom properties, and the type is
  `{instanceSchema: ""}` (client.go GetOutputArtifactsByExecutionId leaves the
  schema empty; see kubeflow/entrypoint.py for what that does to TFX).
  The deprecated `inputs.parameters` is never filled (KFP 2.x does not).
- outputs (driver.go `provisionOutputs`): one artifact per output definition,
  named by its key (2.16), at `<task root>/<output>`, the task root being
  `<pipeline_root>/<pipeline name>/<run id>/<task>/<uuid>` (2.16: the uuid,
  `GenerateOutputURI(root, [task, uuid])`; the root's query is dropped),
  typed and with the metadata of the output definition; with `publish_logs`
  (the backend's default, 2.16) one more, `executor-logs` (system.Artifact)
  at `<task root>/executor-logs-0` (the launcher's retry index), which is in
  `{{$}}` too, is never merged with the ExecutorOutput and holds the task's
  log; `outputFile` under the task root's local path (`/gcs/<bucket>/...`,
  `/s3/...`, `/minio/...`; 2.16), else `/tmp/kfp_outputs/output_metadata.json`
  (LocalPathForURI's fallback), and `/tmp/kfp/outputs/<name>` per output
  parameter, all inside the task's own folder here, since every task is its
  own pod there.
- the command (launcher_v2.go `executeV2`): component input defaults added
  (`addDefaultParams`), then every placeholder of `getPlaceholders` replaced
  in command and args (`{{$}}` is the ExecutorInput as JSON, plus the
  `{{$.inputs/outputs...}}` forms); the container's `command` + `args` run as
  one process with this process's environment plus the container's `env`
  (driver.go `initPodSpecPatch` puts it on the pod), in the task's folder. The
  only deviation: a leading `python` is this interpreter (the test venv, where
  tfx-hpm is installed as in the image), not the image's.
- after the process (`execute`, `uploadOutputArtifacts`): a non-zero exit
  fails the task; the ExecutorOutput in outputFile (absent: empty) is merged
  into the provisioned artifacts (`mergeRuntimeArtifacts`: its uri and
  metadata win) and each output is recorded as a LIVE artifact of its schema
  title, its metadata becoming custom properties (`toMLMDArtifact`; a
  `display_name` is added as RecordArtifact does, and for a gs://, s3:// or
  minio:// URI its `store_session_info`, 2.16).

What the OSS backend does not do, and this does, as Vertex AI Pipelines does:
- `lifecycle.preCacheCheck` (the FileBasedExampleGen driver TFX adds to
  CsvExampleGen) runs first, in the same task folder, with the same
  ExecutorInput; the OSS backend ignores it (nothing in backend/src/v2 reads
  it) and ExampleGen then resolves its input without a span.
- `resolver` executors (TFX's LatestBlessedModelStrategy): the OSS compiler
  rejects them (backend/src/v2/compiler/argocompiler/dag.go: "resolver
  executors not implemented"). Here a resolver is a query over the artifacts
  this backend has recorded so far (`ArtifactStore`, the MLMD stand-in):
  the filters TFX writes (`schema_title=`, `state=`,
  `metadata.<key>.number_value=` / `string_value=`, `name=`, joined by AND,
  with `{{$.inputs.artifacts[...].metadata[...]}}` placeholders) select the
  newest matching artifact, or none (a first run: no blessed model yet).

Not emulated: caching (every task runs), conditions, loops and sub-DAGs
(NotImplementedError), resources (listed in the result, not enforced), the
launcher's download of input artifacts to /gcs/... paths (TFX reads URIs),
the upload of the executor log to a remote `executor-logs` URI (written only
where the URI is a local path), the runtime placeholders of 2.16's
`resolveInputParameter` (`{{$.pipeline_job_name}}` ...: TFX compiles none),
and 2.16's refusal of a pipeline root without a bucket scheme (local roots run
here, as the 2.0.5 driver ran them).
"""

import collections
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import uuid
from typing import Any, Dict, List, Mapping, Optional

from google.protobuf import json_format
from google.protobuf import struct_pb2
from kfp.pipeline_spec import pipeline_spec_pb2 as pb

OUTPUT_METADATA_PATH = 'tmp/kfp_outputs/output_metadata.json'
OUTPUT_PARAMETERS_DIR = 'tmp/kfp/outputs'
LOG_TAIL_CHARS = 6000

_TITLE = re.compile(r'^title:\s*(\S+)', re.M)
_INPUT_METADATA = re.compile(
    r"\{\{\$\.inputs\.artifacts\['([^']+)'\]\.metadata\['([^']+)'\]\}\}")


class TaskFailed(RuntimeError):
  """A task's process exited non-zero (the message ends with its log)."""


def schema_title(artifact_type: pb.ArtifactTypeSchema) -> str:
  if artifact_type.schema_title:
    return artifact_type.schema_title
  match = _TITLE.search(artifact_type.instance_schema or '')
  if not match:
    raise ValueError(f'Artifact type without a title: {artifact_type}')
  return match.group(1)


# --- The MLMD stand-in -------------------------------------------------------


@dataclasses.dataclass
class Artifact:
  id: int
  schema_title: str
  uri: str
  # MLMD custom properties as {'string_value'|'double_value'|'int_value'|
  # 'struct_value': value}.
  custom_properties: Dict[str, Dict[str, Any]]
  state: str = 'LIVE'
  producer: str = ''
  run_id: str = ''


def _to_mlmd_value(name: str, value: struct_pb2.Value) -> Dict[str, Any]:
  """metadata.StructValueToMLMDValue: how the launcher stores metadata."""
  kind = value.WhichOneof('kind')
  if kind == 'string_value':
    return {'string_value': value.string_value}
  if kind == 'number_value':
    return {'double_value': value.number_value}
  if kind == 'bool_value':
    return {'int_value': int(value.bool_value)}
  if kind == 'list_value':
    return {'struct_value': {'list': json_format.MessageToDict(
        value.list_value)}}
  if kind == 'struct_value':
    return {'struct_value': {'struct': json_format.MessageToDict(
        value.struct_value)}}
  # KFP: "unknown/unsupported value type" (null is a TODO there).
  raise TaskFailed(f'metadata {name!r} has a value KFP cannot record: '
                   f'{kind}')


def _from_mlmd_value(value: Dict[str, Any]) -> Any:
  """metadata.toRuntimeArtifact: MLMD property -> metadata JSON value."""
  (kind, v), = value.items()
  return float(v) if kind in ('double_value', 'int_value') else v


# The object stores KFP 2.16 knows (objectstore: gs, s3, minio) and the local
# paths their URIs are mounted at (LocalPathForURI).
BUCKET_SCHEMES = ('gs', 's3', 'minio')
EXECUTOR_LOGS = 'executor-logs'


def bucket_scheme(uri: str) -> Optional[str]:
  scheme, sep, _ = uri.partition('://')
  return scheme if sep and scheme in BUCKET_SCHEMES else None


def local_path_for_uri(uri: str) -> Optional[str]:
  """`/gcs/<bucket>/...` for gs://..., `/s3/...`, `/minio/...`; else None."""
  scheme = bucket_scheme(uri)
  if scheme is None:
    return None
  return '/' + ('gcs' if scheme == 'gs' else scheme) + '/' + uri.partition(
      '://')[2]


class ArtifactStore:
  """The artifacts a KfpBackend recorded, across its runs (MLMD's role)."""

  def __init__(self):
    self.artifacts: List[Artifact] = []

  def record(self, output_name: str, artifact: pb.RuntimeArtifact,
             producer: str, run_id: str,
             display_name: bool = True) -> Artifact:
    """RecordArtifact: metadata -> custom properties, display_name added
    (not by the importer), the store session of a bucket URI (2.16)."""
    props = {k: _to_mlmd_value(k, v)
             for k, v in artifact.metadata.fields.items()}
    if display_name:
      props.setdefault('display_name', {'string_value': output_name})
    scheme = bucket_scheme(artifact.uri)
    if scheme:
      props.setdefault('store_session_info', {'string_value': json.dumps(
          {'Provider': scheme, 'Params': {'fromEnv': 'true'}},
          separators=(',', ':'))})
    record = Artifact(id=len(self.artifacts) + 1,
                      schema_title=schema_title(artifact.type),
                      uri=artifact.uri, custom_properties=props,
                      producer=producer, run_id=run_id)
    self.artifacts.append(record)
    return record

  def get(self, artifact_id: int) -> Artifact:
    return self.artifacts[artifact_id - 1]

  @staticmethod
  def to_runtime_artifact(artifact: Artifact) -> pb.RuntimeArtifact:
    """What a downstream task gets (driver: ToRuntimeArtifact)."""
    result = pb.RuntimeArtifact(name=str(artifact.id), uri=artifact.uri)
    result.type.instance_schema = ''  # OutputArtifact.Schema is "" there.
    result.metadata.update({k: _from_mlmd_value(v) for k, v in
                            artifact.custom_properties.items()})
    return result

  def query(self, clauses: List[tuple]) -> Optional[Artifact]:
    """The newest artifact matching every (field, value) clause."""
    for artifact in reversed(self.artifacts):
      if all(_matches(artifact, field, value) for field, value in clauses):
        return artifact
    return None


def _matches(artifact: Artifact, field: str, value: str) -> bool:
  if field == 'schema_title':
    return artifact.schema_title == value
  if field == 'state':
    return artifact.state == value
  if field == 'name':
    return str(artifact.id) == value
  match = re.fullmatch(r'metadata\.([^.]+)\.(number_value|string_value)',
                       field)
  if not match:
    raise NotImplementedError(f'resolver filter field {field!r}')
  prop = artifact.custom_properties.get(match.group(1))
  if prop is None:
    return False
  actual = _from_mlmd_value(prop)
  if match.group(2) == 'number_value':
    return isinstance(actual, float) and actual == float(value)
  return actual == value


def parse_filter(query: str) -> List[tuple]:
  """'a="x" AND b=1' -> [('a', 'x'), ('b', '1')] (TFX's resolver filters)."""
  clauses = []
  for clause in query.split(' AND '):
    field, sep, value = clause.strip().partition('=')
    if not sep:
      raise NotImplementedError(f'resolver filter clause {clause!r}')
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
      value = value[1:-1]
    clauses.append((field.strip(), value))
  return clauses


def _copy_log(log_path: str, uri: str) -> None:
  """The task's log into its executor-logs artifact, where that is a local
  path (the launcher uploads it to the object store)."""
  if '://' in uri:
    return
  os.makedirs(os.path.dirname(uri), exist_ok=True)
  with open(log_path, 'rb') as src, open(uri, 'wb') as dst:
    dst.write(src.read())


# --- Tasks -------------------------------------------------------------------


@dataclasses.dataclass
class TaskResult:
  name: str
  kind: str  # 'container', 'resolver' or 'importer'
  outputs: Dict[str, List[pb.RuntimeArtifact]]
  output_parameters: Dict[str, Any]
  executor_input: Optional[pb.ExecutorInput] = None
  executor_output: Optional[pb.ExecutorOutput] = None
  argv: List[str] = dataclasses.field(default_factory=list)
  resources: Dict[str, Any] = dataclasses.field(default_factory=dict)
  wall_s: float = 0.0
  log_path: Optional[str] = None


class KfpBackend:
  """One pipeline job, run task by task as KFP's driver + launcher would."""

  def __init__(self, job_path: str, work_dir: str,
               run_id: Optional[str] = None, python: str = sys.executable,
               env: Optional[Mapping[str, str]] = None,
               store: Optional[ArtifactStore] = None,
               task_timeout_s: float = 1800.0, echo: bool = True,
               publish_logs: bool = True):
    with open(job_path) as f:
      job_dict = json.load(f)
    self.job = json_format.ParseDict(job_dict, pb.PipelineJob())
    self.spec = json_format.ParseDict(job_dict['pipelineSpec'],
                                      pb.PipelineSpec())
    self.pipeline_root = self.job.runtime_config.gcs_output_directory
    if not self.pipeline_root:
      raise ValueError('The job has no runtimeConfig.gcsOutputDirectory.')
    self.pipeline_name = self.spec.pipeline_info.name
    self.run_id = run_id or uuid.uuid4().hex[:12]
    self.work_dir = os.path.abspath(work_dir)
    self.python = python
    self.env = dict(os.environ if env is None else env)
    self.store = store or ArtifactStore()
    self.task_timeout_s = task_timeout_s
    self.echo = echo
    self.publish_logs = publish_logs
    self.results: Dict[str, TaskResult] = {}
    # Output artifacts of this run: task -> output key -> store ids.
    self._outputs: Dict[str, Dict[str, List[int]]] = {}

  # The DAG.

  @staticmethod
  def _upstream(task: pb.PipelineTaskSpec) -> set:
    names = set(task.dependent_tasks)
    for spec in task.inputs.artifacts.values():
      if spec.HasField('task_output_artifact'):
        names.add(spec.task_output_artifact.producer_task)
    for spec in task.inputs.parameters.values():
      if spec.HasField('task_output_parameter'):
        names.add(spec.task_output_parameter.producer_task)
    return names

  def task_order(self) -> List[str]:
    """Topological order (Kahn; ties by name, so runs are reproducible)."""
    tasks = self.spec.root.dag.tasks
    upstream = {name: self._upstream(task) for name, task in tasks.items()}
    for name, deps in upstream.items():
      unknown = deps - set(tasks)
      if unknown:
        raise ValueError(f'Task {name} depends on unknown tasks {unknown}.')
    order, done = [], set()
    while len(order) < len(tasks):
      ready = sorted(n for n in tasks if n not in done and upstream[n] <= done)
      if not ready:
        raise ValueError(f'Cycle among {sorted(set(tasks) - done)}.')
      order.append(ready[0])
      done.add(ready[0])
    return order

  def run(self) -> Dict[str, TaskResult]:
    """Runs every task; raises TaskFailed at the first failure."""
    if self.spec.root.dag.outputs.ListFields():
      raise NotImplementedError('DAG outputs')
    for name in self.task_order():
      self.results[name] = self.run_task(name)
    return self.results

  def run_task(self, name: str) -> TaskResult:
    task = self.spec.root.dag.tasks[name]
    if task.trigger_policy.condition or task.trigger_policy.strategy:
      raise NotImplementedError(f'{name}: trigger policies (conditions)')
    if task.WhichOneof('iterator'):
      raise NotImplementedError(
          f'{name}: loops ({task.WhichOneof("iterator")})')
    component = self.spec.components[task.component_ref.name]
    if component.WhichOneof('implementation') != 'executor_label':
      raise NotImplementedError(f'{name}: sub-DAG components')
    executor = self.spec.deployment_spec.fields['executors'].struct_value \
        .fields[component.executor_label]
    executor_spec = json_format.ParseDict(
        json_format.MessageToDict(executor),
        pb.PipelineDeploymentConfig.ExecutorSpec())
    kind = executor_spec.WhichOneof('spec')
    inputs = self._resolve_inputs(name, task)
    start = time.monotonic()
    if kind == 'container':
      result = self._run_container(name, component, executor_spec.container,
                                   inputs)
    elif kind == 'resolver':
      result = self._run_resolver(name, component, executor_spec.resolver,
                                  inputs)
    elif kind == 'importer':
      result = self._run_importer(name, component, executor_spec.importer,
                                  inputs)
    else:
      raise NotImplementedError(f'{name}: executor kind {kind}')
    result.wall_s = time.monotonic() - start
    if self.echo:
      print(f'[kfp_backend] {name} ({kind}) done in {result.wall_s:.1f} s',
            flush=True)
    return result

  # Inputs and outputs.

  def _root_parameter(self, key: str) -> struct_pb2.Value:
    values = self.job.runtime_config.parameter_values
    if key in values:
      return values[key]
    definition = self.spec.root.input_definitions.parameters.get(key)
    if definition is not None and definition.HasField('default_value'):
      return definition.default_value
    raise ValueError(f'Pipeline parameter {key!r} has no value.')

  def _resolve_inputs(self, name: str,
                      task: pb.PipelineTaskSpec) -> pb.ExecutorInput.Inputs:
    inputs = pb.ExecutorInput.Inputs()
    for key, spec in task.inputs.parameters.items():
      kind = spec.WhichOneof('kind')
      if kind == 'runtime_value':
        if spec.runtime_value.WhichOneof('value') != 'constant':
          # The 2.0 IR's `constantValue`: driver.go fails the same way.
          raise TaskFailed(
              f'{name}: resolving input parameter {key}: param runtime value '
              f'spec of type {spec.runtime_value.WhichOneof("value")} not '
              'implemented')
        inputs.parameter_values[key].CopyFrom(spec.runtime_value.constant)
      elif kind == 'component_input_parameter':
        inputs.parameter_values[key].CopyFrom(
            self._root_parameter(spec.component_input_parameter))
      elif kind == 'task_output_parameter':
        producer = spec.task_output_parameter
        value = self.results[producer.producer_task].output_parameters[
            producer.output_parameter_key]
        inputs.parameter_values[key].CopyFrom(value)
      else:
        raise NotImplementedError(f'{name}: input parameter kind {kind}')
    for key, spec in task.inputs.artifacts.items():
      if not spec.HasField('task_output_artifact'):
        raise NotImplementedError(f'{name}: input artifact {key} {spec}')
      producer = spec.task_output_artifact
      ids = self._outputs[producer.producer_task].get(
          producer.output_artifact_key)
      if ids is None:
        raise TaskFailed(f'{name}: cannot find output artifact key '
                         f'{producer.output_artifact_key!r} in producer task '
                         f'{producer.producer_task!r}')
      artifact_list = inputs.artifacts[key]  # Empty when a resolver found none.
      for artifact_id in ids:
        artifact_list.artifacts.append(
            self.store.to_runtime_artifact(self.store.get(artifact_id)))
    return inputs

  def task_root(self, task_name: str) -> str:
    """`<root>/<pipeline>/<run>/<task>/<uuid>`, new for each execution."""
    return '/'.join([self.pipeline_root.partition('?')[0].rstrip('/'),
                     self.pipeline_name, self.run_id, task_name,
                     str(uuid.uuid4())])

  def _provision_outputs(self, name: str, component: pb.ComponentSpec,
                         pod_dir: str) -> pb.ExecutorInput.Outputs:
    task_root = self.task_root(name)
    local = local_path_for_uri(task_root)
    outputs = pb.ExecutorInput.Outputs(output_file=(
        os.path.join(pod_dir, local.lstrip('/'), 'output_metadata.json')
        if local else os.path.join(pod_dir, OUTPUT_METADATA_PATH)))
    for key, definition in component.output_definitions.artifacts.items():
      artifact = outputs.artifacts[key].artifacts.add(
          name=key, uri=f'{task_root}/{key}')
      artifact.type.CopyFrom(definition.artifact_type)
      if definition.HasField('metadata'):
        artifact.metadata.CopyFrom(definition.metadata)
    if self.publish_logs:
      logs = outputs.artifacts[EXECUTOR_LOGS].artifacts.add(
          name=EXECUTOR_LOGS, uri=f'{task_root}/{EXECUTOR_LOGS}-0')
      logs.type.schema_title = 'system.Artifact'
    for key in component.output_definitions.parameters:
      outputs.parameters[key].output_file = os.path.join(
          pod_dir, OUTPUT_PARAMETERS_DIR, key)
    return outputs

  @staticmethod
  def _with_defaults(executor_input: pb.ExecutorInput,
                     component: pb.ComponentSpec) -> pb.ExecutorInput:
    result = pb.ExecutorInput()
    result.CopyFrom(executor_input)
    for key, definition in component.input_definitions.parameters.items():
      if (key not in result.inputs.parameter_values and
          definition.HasField('default_value')):
        result.inputs.parameter_values[key].CopyFrom(definition.default_value)
    return result

  @staticmethod
  def placeholders(executor_input: pb.ExecutorInput) -> Dict[str, str]:
    """launcher_v2.go getPlaceholders."""
    values = {'{{$}}': json.dumps(json_format.MessageToDict(executor_input),
                                  separators=(',', ':'))}
    for key, artifacts in executor_input.inputs.artifacts.items():
      if artifacts.artifacts:
        values[f"{{{{$.inputs.artifacts['{key}'].uri}}}}"] = \
            artifacts.artifacts[0].uri
    for key, artifacts in executor_input.outputs.artifacts.items():
      if artifacts.artifacts:
        values[f"{{{{$.outputs.artifacts['{key}'].uri}}}}"] = \
            artifacts.artifacts[0].uri
    for key, value in executor_input.inputs.parameter_values.items():
      kind = value.WhichOneof('kind')
      if kind == 'string_value':
        text = value.string_value
      elif kind == 'number_value':
        text = repr(value.number_value)
        text = text[:-2] if text.endswith('.0') else text
      elif kind == 'bool_value':
        text = 'true' if value.bool_value else 'false'
      else:
        text = json.dumps(json_format.MessageToDict(value),
                          separators=(',', ':'))
      values[f"{{{{$.inputs.parameters['{key}']}}}}"] = text
    for key, parameter in executor_input.outputs.parameters.items():
      values[f"{{{{$.outputs.parameters['{key}'].output_file}}}}"] = \
          parameter.output_file
    return values

  def _substitute(self, argv: List[str], values: Dict[str, str]) -> List[str]:
    result = []
    for arg in argv:
      for placeholder, value in values.items():
        arg = arg.replace(placeholder, value)
      if re.search(r"\{\{\$\.(inputs|outputs)\.artifacts\['[^']+'\]\.path\}\}",
                   arg):
        raise NotImplementedError('.path placeholders (the launcher mounts '
                                  'artifacts under /gcs/...)')
      result.append(arg)
    if result and result[0] == 'python':
      result[0] = self.python  # The one deviation from the container.
    return result

  # Executors.

  def _exec(self, name: str, argv: List[str], pod_dir: str,
            log_path: str, env: Mapping[str, str]) -> None:
    with open(log_path, 'ab') as log:
      log.write(('$ ' + ' '.join(a if len(a) < 200 else a[:200] + '...'
                                  for a in argv) + '\n').encode())
      log.flush()
      try:
        proc = subprocess.run(argv, cwd=pod_dir, env=env,
                              stdout=log, stderr=subprocess.STDOUT,
                              timeout=self.task_timeout_s, check=False)
        code = proc.returncode
      except subprocess.TimeoutExpired:
        code = f'timeout after {self.task_timeout_s} s'
    if code != 0:
      with open(log_path, 'rb') as f:
        tail = f.read().decode(errors='replace')[-LOG_TAIL_CHARS:]
      raise TaskFailed(f'Task {name} failed ({code}); log {log_path}, last '
                       f'lines:\n{tail}')

  def _run_container(self, name, component, container,
                     inputs) -> TaskResult:
    pod_dir = os.path.join(self.work_dir, self.run_id, name)
    os.makedirs(pod_dir, exist_ok=True)
    log_path = os.path.join(pod_dir, 'log.txt')
    executor_input = pb.ExecutorInput(inputs=inputs)
    executor_input.outputs.CopyFrom(
        self._provision_outputs(name, component, pod_dir))
    with_defaults = self._with_defaults(executor_input, component)
    values = self.placeholders(with_defaults)
    os.makedirs(os.path.dirname(executor_input.outputs.output_file),
                exist_ok=True)
    for parameter in executor_input.outputs.parameters.values():
      os.makedirs(os.path.dirname(parameter.output_file), exist_ok=True)
    env = {**self.env, **{e.name: e.value for e in container.env}}
    hook = container.lifecycle.pre_cache_check
    if hook.command:
      # Vertex's hook, which has no executor-logs output (an OSS backend's).
      hook_input = pb.ExecutorInput()
      hook_input.CopyFrom(with_defaults)
      hook_input.outputs.artifacts.pop(EXECUTOR_LOGS, None)
      self._exec(name + ' (preCacheCheck)',
                 self._substitute(list(hook.command) + list(hook.args),
                                  self.placeholders(hook_input)),
                 pod_dir, log_path, env)
    argv = self._substitute(list(container.command) + list(container.args),
                            values)
    self._exec(name, argv, pod_dir, log_path, env)

    executor_output = pb.ExecutorOutput()
    if os.path.exists(executor_input.outputs.output_file):
      with open(executor_input.outputs.output_file) as f:
        json_format.Parse(f.read(), executor_output)
    output_parameters = dict(executor_output.parameter_values)
    for key, parameter in executor_input.outputs.parameters.items():
      if key not in output_parameters:
        with open(parameter.output_file) as f:
          output_parameters[key] = struct_pb2.Value(string_value=f.read())
    outputs = {}
    self._outputs[name] = {}
    # The component's outputs first, the backend's log last (MLMD ids).
    for key, artifact_list in sorted(
        executor_input.outputs.artifacts.items(),
        key=lambda item: item[0] == EXECUTOR_LOGS):
      artifact = pb.RuntimeArtifact()
      artifact.CopyFrom(artifact_list.artifacts[0])
      produced = executor_output.artifacts.get(key)
      if key == EXECUTOR_LOGS:
        _copy_log(log_path, artifact.uri)
      elif produced is not None and produced.artifacts:
        src = produced.artifacts[0]  # mergeRuntimeArtifacts(src, dst)
        if src.uri:
          artifact.uri = src.uri
        for k, v in src.metadata.fields.items():
          artifact.metadata.fields[k].CopyFrom(v)
      record = self.store.record(key, artifact, name, self.run_id)
      self._outputs[name][key] = [record.id]
      outputs[key] = [artifact]
    return TaskResult(
        name=name, kind='container', outputs=outputs,
        output_parameters=output_parameters, executor_input=executor_input,
        executor_output=executor_output, argv=argv,
        resources=json_format.MessageToDict(container.resources),
        log_path=log_path)

  def _run_resolver(self, name, component, resolver, inputs) -> TaskResult:
    """Vertex-style resolver: a query over this backend's artifacts."""
    del component
    outputs = {}
    self._outputs[name] = {}
    for key, query in resolver.output_artifact_queries.items():
      text, unresolved = query.filter, False

      def input_metadata(match):
        nonlocal unresolved
        artifacts = inputs.artifacts[match.group(1)].artifacts if (
            match.group(1) in inputs.artifacts) else []
        field = artifacts[0].metadata.fields.get(match.group(2)) if (
            artifacts) else None
        if field is None:
          unresolved = True
          return ''
        value = json_format.MessageToDict(field)
        return value if isinstance(value, str) else json.dumps(value)

      text = _INPUT_METADATA.sub(input_metadata, text)
      found = None if unresolved else self.store.query(parse_filter(text))
      self._outputs[name][key] = [found.id] if found else []
      outputs[key] = ([self.store.to_runtime_artifact(found)]
                      if found else [])
      if self.echo:
        why = 'its input is empty' if unresolved else text
        print(f'[kfp_backend] {name}: {key} <- '
              f'{found.uri if found else "nothing"} ({why})', flush=True)
    return TaskResult(name=name, kind='resolver', outputs=outputs,
                      output_parameters={})

  def _run_importer(self, name, component, importer, inputs) -> TaskResult:
    """importer_launcher.go: an artifact for a given URI (reused unless
    reimport)."""
    source = importer.artifact_uri
    if source.WhichOneof('value') == 'constant':
      uri = source.constant.string_value
    elif source.WhichOneof('value') == 'runtime_parameter':
      uri = inputs.parameter_values[source.runtime_parameter].string_value
    else:
      raise NotImplementedError(f'{name}: importer uri {source}')
    (key,) = component.output_definitions.artifacts.keys()
    if not bucket_scheme(uri) and not uri.startswith('mem://'):
      raise TaskFailed(f'{name}: no provider scheme found in artifact URI '
                       f'{uri!r}')
    title = schema_title(importer.type_schema)
    found = None if importer.reimport else next(
        (a for a in reversed(self.store.artifacts)
         if a.uri == uri and a.schema_title == title), None)
    if found is None:
      artifact = pb.RuntimeArtifact(uri=uri)
      artifact.type.CopyFrom(importer.type_schema)
      if importer.HasField('metadata'):
        artifact.metadata.CopyFrom(importer.metadata)
      found = self.store.record(key, artifact, name, self.run_id,
                                display_name=False)
    self._outputs[name] = {key: [found.id]}
    return TaskResult(name=name, kind='importer',
                      outputs={key: [self.store.to_runtime_artifact(found)]},
                      output_parameters={})

  def timings(self) -> Dict[str, float]:
    return collections.OrderedDict(
        (name, round(r.wall_s, 1)) for name, r in self.results.items())
