"""bench_ceiling's measurements, each in the fresh process `bench_ceiling`
starts (`--mode`): the Trainer's runs, the ceiling and the breakdown; and
the settings they share with the report (`bench_ceiling` says what is
measured and why)."""

import argparse
import glob
import json
import os
import tempfile
import time
from typing import Any, Dict

from benchmarks import harness
from benchmarks import report

TRAIN_STEPS = 20000
ROUNDS = 1
BATCHES = (32, 256)
STRATEGIES = ('one_device', 'mirrored')
EXPLICIT_KS = (64, 256, 1024)
CEILING_K = 256
EVAL_STEPS = 20
PIPELINE_NAME = 'bench_ceiling'
# Goals of issue 20.
GOAL_RATIO = 0.85
GOAL_VS_BEST_K = 0.95
GOAL_OUTSIDE_TRAINING_S = 5.0
DEFAULT_JOB_RUNS = 2  # per round: it varies more than the rest.
SAVE_EVERY_SECONDS = 60
# Largest max/min of the two ceilings bracketing a trainer run (or of the
# preflight's runs) under which a ratio can judge the goals.
MAX_CEILING_SPREAD = 1.10
PREFLIGHT_STEPS = 8192



def steps_at(batch: int, train_steps: int) -> int:
  """`train_steps` at the smallest batch; the same examples at larger
  batches, but at least half the steps (module doc)."""
  return max(1, train_steps // 2, train_steps * BATCHES[0] // batch)


def distribution(strategy: str, batch: int) -> Dict[str, Any]:
  if strategy == 'mirrored':
    return {'strategy': 'mirrored', 'logical_cpu_devices': 2,
            'global_batch_size': batch}
  return {'strategy': strategy, 'global_batch_size': batch}


def _pipeline(root: str, trainer_args=None):
  """ExampleGen .. OptimizedTransform (tuned for batch 32), then optionally
  HighPerfTrainer with `trainer_args` (distribution, train_steps, round)."""
  # pylint: disable=g-import-not-at-top
  from tfx import v1 as tfx
  from components import HighPerfTrainer, OptimizedTransform
  from pipelines import data
  from pipelines import taxi_pipeline
  # pylint: enable=g-import-not-at-top
  module_file = data.default_module_file()
  example_gen, statistics_gen, schema_gen = taxi_pipeline.upstream(
      data.default_data_root())
  transform = OptimizedTransform(
      examples=example_gen.outputs['examples'],
      schema=schema_gen.outputs['schema'], module_file=module_file,
      tuning={'trainer_batch_size': BATCHES[0]}).with_id(
          taxi_pipeline.TRANSFORM_ID)
  components = [example_gen, statistics_gen, schema_gen, transform]
  if trainer_args:
    components.append(HighPerfTrainer(
        module_file=module_file,
        examples=transform.outputs['transformed_examples'],
        transform_graph=transform.outputs['transform_graph'],
        schema=schema_gen.outputs['schema'],
        tuned_input_pipeline=transform.outputs['tuned_input_pipeline'],
        train_args=tfx.proto.TrainArgs(num_steps=trainer_args['train_steps']),
        eval_args=tfx.proto.EvalArgs(
            num_steps=trainer_args.get('eval_steps', EVAL_STEPS)),
        custom_config={'benchmark_round': trainer_args['round']},
        distribution=trainer_args['distribution'],
        fault_tolerance=trainer_args.get('fault_tolerance', {
            'max_restarts': 0, 'save_every_steps': None,
            'save_every_s': SAVE_EVERY_SECONDS})).with_id(
                taxi_pipeline.TRAINER_ID))
  return tfx.dsl.Pipeline(
      pipeline_name=PIPELINE_NAME, pipeline_root=root, components=components,
      enable_cache=True,
      metadata_connection_config=(
          tfx.orchestration.metadata.sqlite_metadata_connection_config(
              os.path.join(root, 'metadata.db'))),
      beam_pipeline_args=['--direct_running_mode=in_memory',
                          '--direct_num_workers=1'])


def _newest(pattern: str) -> str:
  """The newest execution's output folder matching `pattern`."""
  paths = glob.glob(pattern)
  if not paths:
    raise FileNotFoundError(f'Nothing matches {pattern}.')
  return max(paths, key=lambda p: int(p.rstrip('/').split('/')[-1]))


def prepare(root: str) -> Dict[str, str]:
  """Transforms the taxi data once; returns what the ceiling reads."""
  from tfx import v1 as tfx  # pylint: disable=g-import-not-at-top
  tfx.orchestration.LocalDagRunner().run(_pipeline(root))
  return {
      'examples': _newest(os.path.join(root, 'Transform',
                                       'transformed_examples', '*')),
      'transform_graph': _newest(os.path.join(root, 'Transform',
                                              'transform_graph', '*')),
      'tuned_input_pipeline': _newest(os.path.join(
          root, 'Transform', 'tuned_input_pipeline', '*')),
  }


def default_job() -> Dict[str, Any]:
  """`make run`'s Trainer: the steps, eval steps and distribution flags'
  defaults (`pipelines/cli.py`), the component's fault tolerance."""
  from pipelines import cli  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser()
  cli.add_pipeline_flags(parser)
  flags = parser.parse_args([])
  return {'distribution': json.loads(flags.distribution),
          'train_steps': flags.train_steps, 'eval_steps': flags.eval_steps,
          'fault_tolerance': None}


def run_trainer(root: str, trainer_args: Dict[str, Any]) -> Dict[str, Any]:
  """One Trainer execution (upstream cached) with `trainer_args`
  (`_pipeline`'s); its measurements."""
  # pylint: disable=g-import-not-at-top
  from tfx import v1 as tfx
  from pipelines import summary
  # pylint: enable=g-import-not-at-top
  train_steps = trainer_args['train_steps']
  tfx.orchestration.LocalDagRunner().run(_pipeline(root, trainer_args))
  run = summary.read_run(os.path.join(root, 'metadata.db'))
  model_run = report.latest_model_run_uri(root)
  result = harness.read_training_result(model_run)
  with open(os.path.join(model_run, 'launch.json')) as f:
    launch = json.load(f)
  assert result.steps == train_steps, result
  return {'examples_per_sec': result.loop.examples_per_sec,
          'steps_per_execution': result.loop.steps_per_execution,
          'auto': result.loop.steps_per_execution_auto,
          'steps_by_call_length': result.loop.steps_by_call_length,
          'timing': {**launch['timing'], **result.timing},
          'trainer_wall_s': {e.node_id: e.wall_s
                             for e in run.executions}['Trainer']}


def run_ceiling(inputs: Dict[str, str], strategy_name: str, batch: int,
                train_steps: int, intra_op_threads='auto') -> Dict[str, Any]:
  """The ceiling (module doc) in this process: steady examples/s, with
  the op pool of `intra_op_threads` (as the trainer's option)."""
  # pylint: disable=g-import-not-at-top
  from components.data import input_pipeline
  from components.trainer.common import cpu_threads
  from components.trainer.strategies import choice as strategy_lib
  from components.trainer.strategies import registry
  from components.trainer.config import DistributionConfig
  from components.records import tuned_input_pipeline
  from pipelines import taxi_module
  import tensorflow as tf
  import tensorflow_transform as tft
  # pylint: enable=g-import-not-at-top
  config = DistributionConfig.from_dict(distribution(strategy_name, batch))
  strategy_lib.configure_logical_cpus(config.logical_cpu_devices)
  cpu_threads.configure(intra_op_threads)
  strategy = registry.get(config.strategy).build(config)
  replicas = strategy.num_replicas_in_sync
  pipeline_config = tuned_input_pipeline.read(inputs['tuned_input_pipeline'])
  spec = tft.TFTransformOutput(
      inputs['transform_graph']).transformed_feature_spec()
  # One epoch of the trainer's own batches (the rows a cached epoch holds).
  dataset = input_pipeline.build_dataset(
      [os.path.join(inputs['examples'], 'Split-train', '*')], spec,
      taxi_module.LABEL_KEY, batch_size=batch, config=pipeline_config,
      seed=0, num_epochs=1)
  batches = list(dataset)
  stacked = tf.nest.map_structure(lambda *t: tf.stack(t), *batches)
  num_batches = len(batches)
  per_replica = batch // replicas

  def replica_slice(context):
    start = context.replica_id_in_sync_group * per_replica
    return tf.nest.map_structure(
        lambda t: tf.identity(t[:, start:start + per_replica]), stacked)

  data = strategy.experimental_distribute_values_from_function(
      replica_slice)
  with strategy.scope():
    model = taxi_module.build_model({})
    optimizer = model.optimizer
    loss_fn = tf.keras.losses.get(model.loss)  # Per example, if a function.
    if isinstance(loss_fn, tf.keras.losses.Loss):
      loss_fn = type(loss_fn).from_config({**loss_fn.get_config(),
                                           'reduction': 'none'})
    optimizer.build(model.trainable_variables)

  @tf.autograph.experimental.do_not_convert
  def step(local, index):
    features, labels = tf.nest.map_structure(lambda t: t[index], local)
    labels = tf.cast(tf.reshape(labels, [-1, 1]), tf.float32)
    with tf.GradientTape() as tape:
      predictions = model(features, training=True)
      loss = tf.nn.compute_average_loss(loss_fn(labels, predictions),
                                        global_batch_size=batch)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return loss

  @tf.function
  def run(k, offset):
    total = tf.constant(0.0)
    for i in tf.range(k):
      index = (offset + i) % num_batches
      losses = strategy.run(step, args=(data, index))
      total += strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)
    return total / tf.cast(k, tf.float32)

  k = tf.constant(CEILING_K, tf.int64)
  float(run(k, tf.constant(0, tf.int64)))  # Traces; not measured.
  calls = max(1, train_steps // CEILING_K)
  began = time.monotonic()
  for call in range(calls):
    loss = float(run(k, tf.constant(call * CEILING_K, tf.int64)))
  seconds = time.monotonic() - began
  return {'examples_per_sec': calls * CEILING_K * batch / seconds,
          'num_batches': num_batches, 'loss': loss}


def run_breakdown(inputs: Dict[str, str], batch: int, train_steps: int,
                  intra_op_threads, k: int = CEILING_K) -> Dict[str, Any]:
  """Where the loop loses to the ceiling (one_device, `k` steps per call,
  the op pool of `intra_op_threads`): steady examples/s of the ceiling, of
  the trainer's step (replica step, `strategy.run`, step counter, loss
  reduce) over the same stacked batches, of the trainer's input pipeline
  alone (the batches only touched), through
  `distribute_datasets_from_function`'s iterator and through the dataset's
  own, and of the trainer's step runner (input and step); and a profiler
  trace of two of the runner's calls (`tf_trace`)."""
  # pylint: disable=g-import-not-at-top
  from benchmarks import tf_trace
  from components.trainer.managed import accumulation
  from components.trainer.common import cpu_threads
  from components.data import input_pipeline
  from components.data import shard_index
  from components.trainer.managed import datasets
  from components.trainer.managed import step_runners
  from components.records import tuned_input_pipeline
  from pipelines import taxi_module
  import tensorflow as tf
  import tensorflow_transform as tft
  # pylint: enable=g-import-not-at-top
  threads = cpu_threads.configure(intra_op_threads)['threads']
  strategy = tf.distribute.OneDeviceStrategy('/cpu:0')
  config = tuned_input_pipeline.read(inputs['tuned_input_pipeline'])
  spec = tft.TFTransformOutput(
      inputs['transform_graph']).transformed_feature_spec()
  train_files = [os.path.join(inputs['examples'], 'Split-train', '*')]
  data = datasets.TrainingData(
      feature_spec=spec, label_key=taxi_module.LABEL_KEY, raw_label_key=None,
      config=config, tf_transform_output=None)
  # The trainer's data order (one partition) over the examples' index.
  files = input_pipeline.list_files(train_files)
  index, _ = shard_index.ensure(train_files, files, config.compression_type,
                                tempfile.mkdtemp(), build_missing=True)
  check = datasets.DataCheck(train_records=index.records_by_path())
  order = datasets.train_order(data, check, datasets.DATA_SEED, batch, 1)
  # Every iterator below reads at most 2 x train_steps + the traced calls.
  dataset_fn = datasets.ordered_train_dataset_fn(
      check, data, order, 0, 2 * train_steps + 4 * k)
  batches = list(dataset_fn(tf.distribute.InputContext()).take(
      max(1, 10_000 // batch)))
  stacked = tf.nest.map_structure(lambda *t: tf.stack(t), *batches)
  with strategy.scope():
    model = taxi_module.build_model({})
    model.optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64, trainable=False)
  replica_step = accumulation.replica_step_fn(model, 1, batch, batch)

  @tf.function
  def stacked_steps(k, offset):
    total = tf.constant(0.0)
    for i in tf.range(k):
      index = (offset + i) % len(batches)
      batch_i = tf.nest.map_structure(lambda t: t[index], stacked)
      losses = strategy.run(replica_step, args=(batch_i,))
      step.assign_add(1)
      total += strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)
    return total / tf.cast(k, tf.float32)

  def input_only(iterator):
    @tf.function
    def run(k):
      total = tf.constant(0.0)
      for _ in tf.range(k):
        features, _ = next(iterator)
        total += tf.reduce_sum(tf.cast(
            features[taxi_module.transformed_name('fare')], tf.float32))
      return total
    return run

  distributed = input_only(iter(
      strategy.distribute_datasets_from_function(dataset_fn)))
  own = input_only(iter(dataset_fn(tf.distribute.InputContext())))

  runner = step_runners.SynchronousSteps(strategy, dataset_fn, replica_step,
                                         step)

  def timed(call):
    call(0)  # Traces; not measured.
    calls = max(1, train_steps // k)
    began = time.monotonic()
    for index in range(calls):
      float(call((index + 1) * k))
    return calls * k * batch / (time.monotonic() - began)

  kk = tf.constant(k, tf.int64)
  rates = {
      'trainer step over stacked batches': timed(
          lambda at: stacked_steps(kk, tf.constant(at, tf.int64))),
      'input alone, distributed iterator': timed(
          lambda at: distributed(kk)),
      "input alone, the dataset's own iterator": timed(lambda at: own(kk)),
      'trainer step runner (input + step)': timed(
          lambda at: runner(at, k)[1]),
  }
  print(rates, flush=True)
  rates['ceiling'] = run_ceiling(inputs, 'one_device', batch, train_steps,
                                 intra_op_threads)['examples_per_sec']
  calls = 2
  busy = tf_trace.trace(lambda: [float(runner(0, k)[1])
                                 for _ in range(calls)])
  return {'intra_op_threads': threads, 'rates': rates,
          'trace_us_per_step': {label: seconds / (calls * k) * 1e6
                                for label, seconds in busy.items()}}
