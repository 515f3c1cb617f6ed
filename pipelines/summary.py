"""Reads a finished pipeline run back from MLMD and formats a summary."""

import dataclasses
from typing import Dict, List, Optional

from ml_metadata import metadata_store
from ml_metadata.proto import metadata_store_pb2
import tensorflow_model_analysis as tfma
from tfx.dsl.io import fileio

_STATE_NAMES = {
    v: k for k, v in metadata_store_pb2.Execution.State.items()
}


@dataclasses.dataclass
class ExecutionSummary:
  node_id: str
  state: str
  wall_s: float


@dataclasses.dataclass
class RunSummary:
  executions: List[ExecutionSummary]
  pushed_model: Optional[str]
  metrics: Dict[str, float]
  blessed: Optional[bool]

  def format(self) -> str:
    lines = ['', '=== tfx-hpm pipeline summary ===',
             f'{"component":<34}{"state":<10}{"wall s":>8}']
    for e in self.executions:
      lines.append(f'{e.node_id:<34}{e.state:<10}{e.wall_s:>8.1f}')
    lines.append(f'{"total (sum of components)":<44}'
                 f'{sum(e.wall_s for e in self.executions):>8.1f}')
    lines.append(f'model blessed: {self.blessed}')
    lines.append(f'pushed model:  {self.pushed_model or "(not pushed)"}')
    for name, value in sorted(self.metrics.items()):
      lines.append(f'eval {name}: {value:.4f}')
    return '\n'.join(lines)


def _store(metadata_path: str) -> metadata_store.MetadataStore:
  config = metadata_store_pb2.ConnectionConfig()
  config.sqlite.filename_uri = metadata_path
  config.sqlite.connection_mode = 1  # READONLY
  return metadata_store.MetadataStore(config)


def _node_id(store, execution) -> str:
  # TFX links every execution to a 'node' context named '<pipeline>.<node>'.
  for context in store.get_contexts_by_execution(execution.id):
    if store.get_context_types_by_id([context.type_id])[0].name == 'node':
      return context.name.split('.', 1)[-1]
  return str(execution.type_id)


def _latest_output(store, execution_id: int, type_name: str):
  events = store.get_events_by_execution_ids([execution_id])
  ids = [e.artifact_id for e in events
         if e.type == metadata_store_pb2.Event.OUTPUT]
  arts = [a for a in store.get_artifacts_by_id(ids)
          if store.get_artifact_types_by_id([a.type_id])[0].name == type_name]
  return arts[-1] if arts else None


def read_run(metadata_path: str) -> RunSummary:
  """Summarises the most recent execution of every node in the store."""
  store = _store(metadata_path)
  latest = {}
  for execution in store.get_executions():
    node = _node_id(store, execution)
    prev = latest.get(node)
    if prev is None or execution.id > prev.id:
      latest[node] = execution
  executions = []
  for node, execution in sorted(latest.items(),
                                key=lambda kv: kv[1].create_time_since_epoch):
    wall = (execution.last_update_time_since_epoch -
            execution.create_time_since_epoch) / 1000.0
    executions.append(ExecutionSummary(
        node, _STATE_NAMES.get(execution.last_known_state, '?'), wall))

  pushed_model, metrics, blessed = None, {}, None
  for node, execution in latest.items():
    pushed = _latest_output(store, execution.id, 'PushedModel')
    if pushed is not None:
      prop = pushed.custom_properties.get('pushed_destination')
      if prop and pushed.custom_properties['pushed'].int_value == 1:
        pushed_model = prop.string_value
    evaluation = _latest_output(store, execution.id, 'ModelEvaluation')
    if evaluation is not None and fileio.isdir(evaluation.uri):
      metrics = _overall_metrics(evaluation.uri)
    blessing = _latest_output(store, execution.id, 'ModelBlessing')
    if blessing is not None and 'blessed' in blessing.custom_properties:
      blessed = blessing.custom_properties['blessed'].int_value == 1
  return RunSummary(executions, pushed_model, metrics, blessed)


def _overall_metrics(evaluation_uri: str) -> Dict[str, float]:
  """Metrics of the overall slice of the candidate model."""
  result = tfma.load_eval_result(evaluation_uri)
  for slice_key, by_output in result.slicing_metrics:
    if slice_key:
      continue
    values = {}
    for output_metrics in by_output.values():
      for sub_metrics in output_metrics.values():
        for name, value in sub_metrics.items():
          if 'doubleValue' in value:
            values[name] = value['doubleValue']
    return values
  return {}
