"""What HighPerfTrainer records on its ModelRun artifact: the distribution
decision (custom properties and `distribution_decision.json` beside the run's
logs), the Ray placement, the training result's key numbers, and a failed
training's `failure.json`.

`model_run` is the TFX ModelRun artifact (anything with `uri` and the
`set_*_custom_property` methods).
"""

import dataclasses
import json
import os
from typing import Any, Dict

from absl import logging
import tensorflow as tf

from components import storage
from components.records import training_result
from components.trainer.cluster import supervisor
from components.trainer import config as config_lib
from components.trainer.launchers import registry as launchers
from components.trainer.strategies import choice as strategy_lib

DECISION_FILE = 'distribution_decision.json'
# A failed training's class and message (the execution fails, so MLMD gets
# no properties; the folder stays).
FAILURE_FILE = 'failure.json'


def record_placement(model_run,
                     placement: Dict[str, Dict[str, Any]]) -> None:
  """Which Ray node ran which task (the last attempt's)."""
  nodes = {name: {'node_id': where['node_id'], 'node_ip': where['node_ip']}
           for name, where in placement.items()}
  model_run.set_string_custom_property('ray_placement',
                                       json.dumps(nodes, sort_keys=True))
  path = os.path.join(model_run.uri, DECISION_FILE)
  decision = storage.read_json(path) or {}
  decision['placement'] = nodes
  storage.write_json(path, decision)


def record_decision(model_run,
                    config: config_lib.DistributionConfig, reason: str,
                    env: strategy_lib.Environment,
                    launcher_reason: str = 'requested') -> None:
  """The strategy and launcher chosen, and why (also in DECISION_FILE)."""
  model_run.set_string_custom_property('strategy', config.strategy)
  model_run.set_string_custom_property('strategy_reason', reason)
  model_run.set_string_custom_property('launcher', config.launcher)
  model_run.set_string_custom_property('launcher_reason', launcher_reason)
  if launchers.on_ray_cluster(config.launcher):
    from components.trainer.cluster import ray_backend  # pylint: disable=g-import-not-at-top
    model_run.set_string_custom_property(
        'ray_address', ray_backend.resolve_address(config.ray.address))
  # Ints: TFX's Kubeflow entrypoint cannot translate MLMD bool values.
  if config.seed is not None:
    model_run.set_int_custom_property('seed', config.seed)
  model_run.set_int_custom_property('deterministic',
                                    int(config.deterministic))
  storage.write_json(os.path.join(model_run.uri, DECISION_FILE), {
      'strategy': config.strategy, 'reason': reason,
      'launcher': config.launcher, 'launcher_reason': launcher_reason,
      'environment': dataclasses.asdict(env), 'config': config.to_dict()})


def record_result(model_run, result: training_result.TrainingResult,
                  launch: Dict[str, Any]) -> None:
  """The training result's fields marked for MLMD (`mlmd_properties`), its
  resume events, and the launch's relaunches and membership changes."""
  for name, value in result.mlmd_properties():
    if isinstance(value, int):
      model_run.set_int_custom_property(name, value)
    elif isinstance(value, float):
      model_run.set_float_custom_property(name, value)
    else:
      model_run.set_string_custom_property(name, value)
  # `restarts`: relaunches after failures (what max_restarts bounds);
  # preemptions and membership changes are counted apart.
  counts = supervisor.count_by_cause([
      supervisor.ProcessExit(**r)
      for r in launch.get('relaunches', [])])
  model_run.set_int_custom_property('restarts', counts[supervisor.FAILURE])
  model_run.set_int_custom_property('preemption_relaunches',
                                    counts[supervisor.PREEMPTION])
  model_run.set_int_custom_property('membership_relaunches',
                                    counts[supervisor.MEMBERSHIP])
  # An elastic cluster's worker-count changes: when, why, from and to.
  membership = launch.get('membership') or []
  model_run.set_string_custom_property('membership', json.dumps(membership))
  # Where training resumed from, and what each crash cost (issue: resume
  # events live on the artifact, not only in training_result.json).
  events = result.resume_events
  model_run.set_string_custom_property('resume_events', json.dumps(events))
  model_run.set_int_custom_property('resumes', sum(
      1 for e in events if e.get('event') == 'resumed'))


def record_failure(model_run_dir: str,
                   error: supervisor.ClusterFailedError) -> None:
  """FAILURE_FILE: the failure's class, process, message and relaunches. A
  location that cannot take it (full) is a warning: the training's own
  error is the one raised."""
  try:
    storage.write_json(os.path.join(model_run_dir, FAILURE_FILE), {
        'failure_class': error.failure.failure_class or error.failure.cause,
        'process': error.failure.process,
        'exit_code': error.failure.exit_code,
        'message': str(error).split('\n', 1)[0],
        'relaunches': [dataclasses.asdict(r) for r in error.relaunches]})
  except (OSError, tf.errors.OpError) as e:
    logging.warning('Could not record the failure in %s: %s', model_run_dir,
                    e)
