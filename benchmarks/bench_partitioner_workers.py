"""bench_partitioner's workers: the TensorFlow measurements, each in the
fresh process `bench_partitioner` starts (`--mode`), since logical devices
and the allocator must be configured before TensorFlow starts; the models
they measure and the settings they share with the report."""

import json
import os
import tempfile
import time

# Importing TensorFlow does not start its devices; each worker configures
# them before its first op.
import tensorflow as tf

from benchmarks import harness
from benchmarks import report
from components.devices import configure_logical_cpus
from components.partitioner import profiling
from components.pipeline_parallel import graph as graph_lib
from components.pipeline_parallel import placement
from components.pipeline_parallel import runner as pipeline_runner
from components.pipeline_parallel import schedules
from components.pipeline_parallel import timeline
from pipelines import taxi_module

LOGICAL_DEVICES = 4
REAL_MODEL_MICROBATCH = 16
STAGE_COUNTS = (2, 4, 8)
PIPELINE_BATCH = 512
PIPELINE_WIDTH = 512
PIPELINE_LAYERS = 8
# (stages, micro-batches, remat) for the step time and bubble table.
# K=1 with M>1 isolates the cost of micro-batching itself.
PIPELINE_RUNS = [(1, 1, 'never'), (1, 4, 'never'), (1, 16, 'never'),
                 (2, 1, 'never'), (2, 4, 'never'),
                 (2, 16, 'never'), (2, 16, 'except_last'), (2, 16, 'always'),
                 (4, 1, 'never'), (4, 4, 'never'), (4, 16, 'never')]
TIMED_ROUNDS = 7
MEMORY_BATCH = 2048
MEMORY_WIDTH = 256
MEMORY_MICROBATCHES = 8
# GPipe against 1F1B, side by side in one process.
SCHEDULE_STAGES = (2, 4)
SCHEDULE_MICROBATCHES = (4, 8, 16)
SCHEDULE_CHART_CASE = (4, 8)  # (K, M) whose measured schedules are charted.
SCHEDULE_CHART = f'{report.results_name("partitioner")}_schedules.png'


# ---------------------------------------------------------------- models


def _real_models():
  """name -> (model, one micro-batch of inputs)."""
  b = REAL_MODEL_MICROBATCH
  models = {}

  taxi = taxi_module.build_model()
  models['taxi wide&deep'] = (taxi, tf.nest.map_structure(
      lambda kt: tf.ones([b, 1], kt.dtype), taxi.input))

  x = tf.keras.Input((256,))
  h = x
  for width in (64, 1024, 64, 2048, 128, 512, 32, 1024, 256, 64):
    h = tf.keras.layers.Dense(width, activation='relu')(h)
  mlp = tf.keras.Model(x, tf.keras.layers.Dense(1)(h))
  models['heterogeneous MLP'] = (mlp, tf.random.normal([b, 256]))

  image = tf.keras.Input((32, 32, 3))
  h = image
  for filters in (16, 16, None, 32, 32, None, 64, 64):
    h = (tf.keras.layers.MaxPooling2D()(h) if filters is None else
         tf.keras.layers.Conv2D(filters, 3, padding='same',
                                activation='relu')(h))
  h = tf.keras.layers.GlobalAveragePooling2D()(h)
  cnn = tf.keras.Model(image, tf.keras.layers.Dense(10)(h))
  models['small CNN'] = (cnn, tf.random.normal([b, 32, 32, 3]))

  tokens = tf.keras.Input((32, 64))
  h = tokens
  for _ in range(4):
    attended = tf.keras.layers.MultiHeadAttention(4, 16)(h, h)
    h = tf.keras.layers.LayerNormalization()(
        tf.keras.layers.Add()([h, attended]))
    ffn = tf.keras.layers.Dense(256, activation='relu')(h)
    ffn = tf.keras.layers.Dense(64)(ffn)
    h = tf.keras.layers.LayerNormalization()(tf.keras.layers.Add()([h, ffn]))
  encoder = tf.keras.Model(
      tokens, tf.keras.layers.Dense(1)(
          tf.keras.layers.GlobalAveragePooling1D()(h)))
  models['transformer encoder (skips)'] = (encoder,
                                           tf.random.normal([b, 32, 64]))
  for model, _ in models.values():
    model.compile(optimizer='adam', loss='mse')
  return models


def _mlp(width, layers, seed=0):
  tf.keras.utils.set_random_seed(seed)
  model = tf.keras.Sequential(
      [tf.keras.Input((width,))] +
      [tf.keras.layers.Dense(width, activation='relu')
       for _ in range(layers)] + [tf.keras.layers.Dense(1)])
  model.compile(optimizer='adam', loss='mse')
  return model


def _even_boundaries(num_calls, num_stages):
  # The hidden layers split evenly; the tiny head joins the last stage.
  hidden = num_calls - 1
  cuts = [s * hidden // num_stages for s in range(num_stages)]
  return cuts + [num_calls]


def _runner_plan(graph, num_stages, num_microbatches, remat, offload=False):
  return {'num_stages': num_stages, 'num_microbatches': num_microbatches,
          'remat': remat, 'offload_activations': offload,
          'boundaries': _even_boundaries(graph.num_calls, num_stages),
          'layer_signature': graph.class_names()}


# --------------------------------------------------------------- workers


def _worker_profiles(unused_argument):
  profiles = {}
  for name, (model, features) in _real_models().items():
    profiles[name] = json.loads(
        profiling.profile_model(model, features, repeats=5).to_json())
  return profiles


def _pipeline_devices() -> None:
  """LOGICAL_DEVICES logical CPUs, one core per op, like devices that
  compute one op at a time; stages then run in parallel only through
  inter-op parallelism."""
  configure_logical_cpus(LOGICAL_DEVICES)
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(LOGICAL_DEVICES)


def _warmed_runner(plan, width, features, labels):
  """A runner of `plan` for the MLP of `width`, traced by two steps."""
  devices = placement.stage_devices(LOGICAL_DEVICES)[:plan['num_stages']]
  model = placement.build_model_on_devices(
      lambda: _mlp(width, PIPELINE_LAYERS), plan, devices)
  runner = pipeline_runner.PipelineRunner(model, plan, devices)
  for _ in range(2):
    runner.train_step(features, labels).numpy()
  return runner


def _worker_pipeline(unused_argument):
  _pipeline_devices()
  features = tf.random.normal([PIPELINE_BATCH, PIPELINE_WIDTH])
  labels = tf.random.normal([PIPELINE_BATCH, 1])
  graph = graph_lib.LayerGraph(_mlp(PIPELINE_WIDTH, PIPELINE_LAYERS))
  runners = [
      _warmed_runner(_runner_plan(graph, num_stages, num_micro, remat),
                     PIPELINE_WIDTH, features, labels)
      for num_stages, num_micro, remat in PIPELINE_RUNS]
  times, load_before, load_after = _time_round_robin(runners, features,
                                                   labels)
  rows = []
  for (num_stages, num_micro, remat), runner, samples in zip(
      PIPELINE_RUNS, runners, times):
    with tempfile.TemporaryDirectory() as trace_dir:
      tf.profiler.experimental.start(trace_dir)
      runner.train_step(features, labels).numpy()
      tf.profiler.experimental.stop()
      idle = timeline.idle_fraction(timeline.trace_ops(trace_dir),
                                    num_stages)
    rows.append({
        'stages': num_stages, 'microbatches': num_micro, 'remat': remat,
        'step_seconds': harness.median(samples), 'measured_idle': idle,
    })
  return {'rows': rows, 'load': [load_before, load_after]}


def _time_round_robin(runners, features, labels):
  """Step seconds of each runner over TIMED_ROUNDS rounds, and the load
  before and after. Round-robin, so that load from other processes hits
  every run alike."""
  times = [[] for _ in runners]
  load_before = os.getloadavg()[0]
  for _ in range(TIMED_ROUNDS):
    for runner, samples in zip(runners, times):
      start = time.perf_counter()
      runner.train_step(features, labels).numpy()
      samples.append(time.perf_counter() - start)
  return times, load_before, os.getloadavg()[0]


def _worker_schedules(unused_argument):
  """GPipe vs 1F1B: step time, measured schedule and idle, transient peak.

  On the memory section's model: its activations (2 MiB per layer and
  mini-batch) outweigh its weights (256 KiB per layer), so the schedules'
  activation memory shows; with weights as large as the activations, the
  weight gradients of a stage's backward dominate the peak instead.
  """
  _pipeline_devices()
  features = tf.random.normal([MEMORY_BATCH, MEMORY_WIDTH])
  labels = tf.random.normal([MEMORY_BATCH, 1])
  graph = graph_lib.LayerGraph(_mlp(MEMORY_WIDTH, PIPELINE_LAYERS))
  cases = [(k, m, schedule) for k in SCHEDULE_STAGES
           for m in SCHEDULE_MICROBATCHES for schedule in schedules.SCHEDULES]
  runners = [
      _warmed_runner({**_runner_plan(graph, num_stages, num_micro, 'never'),
                      'schedule': schedule}, MEMORY_WIDTH, features, labels)
      for num_stages, num_micro, schedule in cases]
  times, load_before, load_after = _time_round_robin(runners, features,
                                                   labels)
  rows = []
  for (num_stages, num_micro, schedule), runner, samples in zip(
      cases, runners, times):
    tf.config.experimental.reset_memory_stats('CPU:0')
    resident = tf.config.experimental.get_memory_info('CPU:0')['current']
    runner.train_step(features, labels).numpy()
    transient = tf.config.experimental.get_memory_info('CPU:0')['peak'] - (
        resident)
    with tempfile.TemporaryDirectory() as trace_dir:
      tf.profiler.experimental.start(trace_dir)
      runner.train_step(features, labels).numpy()
      tf.profiler.experimental.stop()
      ops = timeline.trace_ops(trace_dir)
    rows.append({
        'stages': num_stages, 'microbatches': num_micro,
        'schedule': schedule, 'step_seconds': harness.median(samples),
        'measured_idle': timeline.idle_fraction(ops, num_stages),
        'transient_bytes': transient, 'tasks': timeline.tasks(ops),
    })
  return {'rows': rows, 'load': [load_before, load_after]}


def _worker_memory(argument):
  """Peak memory of one remat mode ('<remat>' or '<remat>+offload')."""
  configure_logical_cpus(2)
  remat, _, offload = argument.partition('+')
  features = tf.random.normal([MEMORY_BATCH, MEMORY_WIDTH])
  labels = tf.random.normal([MEMORY_BATCH, 1])
  graph = graph_lib.LayerGraph(_mlp(MEMORY_WIDTH, PIPELINE_LAYERS))
  devices = placement.stage_devices(2)
  plan = _runner_plan(graph, 2, MEMORY_MICROBATCHES, remat, bool(offload))
  model = placement.build_model_on_devices(
      lambda: _mlp(MEMORY_WIDTH, PIPELINE_LAYERS), plan, devices)
  runner = pipeline_runner.PipelineRunner(model, plan, devices)
  runner.train_step(features, labels).numpy()  # Traces, creates slots.
  tf.config.experimental.reset_memory_stats('CPU:0')
  resident = tf.config.experimental.get_memory_info('CPU:0')['current']
  runner.train_step(features, labels).numpy()
  peak = tf.config.experimental.get_memory_info('CPU:0')['peak']
  return {'remat': remat, 'offload': bool(offload),
               'resident': resident, 'peak': peak}


WORKERS = {'profiles': _worker_profiles, 'pipeline': _worker_pipeline,
           'memory': _worker_memory, 'schedules': _worker_schedules}
