"""Measures a plan's schedule on real devices: one traced pipelined step.

With `measure_schedule`, the executor runs this module in a fresh process,
because the stages need R x K devices (GPUs, else logical CPUs, which must
be configured before TensorFlow starts):

    python -m components.partitioner.measure INPUT.json OUTPUT.json

INPUT holds the plan, the model's Keras config (rebuilt with
`model_from_json`, so custom layers need to be registered Keras
serializables) and its optimizer. The step runs on zeros shaped like the
model's inputs against zero labels with mean squared error: the loss's own
cost is negligible against the layers', and timings do not depend on the
values. OUTPUT gets `timeline.measure_step`'s idle fraction and tasks.
"""

import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, Mapping

import tensorflow as tf

from components.devices import configure_logical_cpus
from components.pipeline_parallel import placement
from components.pipeline_parallel import runner as pipeline_runner
from components.pipeline_parallel import timeline
from components.records import partition_plan

TIMEOUT_S = 1800


def run(model: tf.keras.Model, plan: Mapping[str, Any]) -> Dict[str, Any]:
  """Measures `plan` for `model` in a fresh process; its timeline."""
  try:
    model_json = model.to_json()
  except (NotImplementedError, TypeError, ValueError) as e:
    raise ValueError(
        'measure_schedule rebuilds the model from its Keras config in a '
        f'fresh process, and model {model.name!r} has none: {e}. Register '
        'custom layers as Keras serializables with get_config, or set '
        'measure_schedule to False.') from e
  with tempfile.TemporaryDirectory() as scratch:
    input_path = os.path.join(scratch, 'input.json')
    output_path = os.path.join(scratch, 'output.json')
    with open(input_path, 'w') as f:
      json.dump({'plan': plan, 'model': model_json,
                 'optimizer': tf.keras.optimizers.serialize(model.optimizer)},
                f)
    proc = subprocess.run(
        [sys.executable, '-m', 'components.partitioner.measure', input_path,
         output_path], capture_output=True, text=True, timeout=TIMEOUT_S,
        check=False)
    if proc.returncode:
      raise RuntimeError('measuring the schedule failed (exit '
                         f'{proc.returncode}):\n{proc.stderr[-4000:]}')
    with open(output_path) as f:
      return json.load(f)


def main(input_path: str, output_path: str) -> None:
  with open(input_path) as f:
    spec = json.load(f)
  plan = partition_plan.PlanRecord.from_dict(spec['plan'])
  if not tf.config.list_physical_devices('GPU'):
    configure_logical_cpus(plan.num_devices)
  devices = placement.stage_devices(plan.num_devices)

  def build():
    model = tf.keras.models.model_from_json(spec['model'])
    model.compile(optimizer=tf.keras.optimizers.deserialize(spec['optimizer']),
                  loss='mse')
    return model

  model = placement.build_model_on_devices(build, plan, devices)
  runner = pipeline_runner.PipelineRunner(model, plan, devices)
  batch = plan.batch_size
  features = tf.nest.map_structure(
      lambda kt: tf.zeros([batch] + kt.shape[1:].as_list(), kt.dtype),
      model.input)
  labels = tf.nest.map_structure(
      lambda kt: tf.zeros([batch] + kt.shape[1:].as_list(), tf.float32),
      model.output)
  result = timeline.measure_step(runner, features, labels)
  with open(output_path, 'w') as f:
    json.dump({**result, 'devices': devices}, f)


if __name__ == '__main__':
  main(*sys.argv[1:3])
