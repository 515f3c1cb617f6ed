"""bench_transform's settings and what runs in one process: the pipelines
(the upstream, one Transform step, one HighPerfTrainer step, each in the
fresh process `bench_transform` starts, `--mode`), their MLMD records and
the readers' rates (`bench_transform` says what is measured and why)."""

import glob
import json
import math
import os
import shutil
import time
from typing import Dict, List

from benchmarks import harness
from benchmarks import report

SCALE_EXAMPLES = 1_000_000
BATCH_SIZE = 256
# The default job's trainer reads batches of 32 (DistributionConfig's default
# per-replica batch, one device): what hpm_factories passes to the tuning.
TRAINER_BATCH = 32
# (batch, how the batches are taken). 'python': next() per batch, as the
# goal's 1M benchmark always did; 'in-graph': inside a tf.function (the
# tuner's method, and how a trainer with several steps per call takes them;
# at a small batch Python's per-batch cost would be most of the time).
READER_BATCHES = ((BATCH_SIZE, 'python'), (TRAINER_BATCH, 'in-graph'))
TRANSFORM_ROUNDS = 3
# The tuning's own report and chart beside this lane's results:
# transform_tuning_report.md and transform_candidates.png on the plain-names
# lane.
TUNING_REPORT = f'{report.results_name("transform")}_tuning_report.md'
TUNING_CHART = f'{report.results_name("transform")}_candidates.png'
READER_ROUNDS = 3
# Transform variants, in the order each round runs them. 'reused' is the
# second run of 'searching' in that run's root.
TRANSFORM_VARIANTS = {
    'stock': 'stock Transform',
    'optimized': 'OptimizedTransform, default job (early stop on, tuning '
                 f'at the trainer batch {TRAINER_BATCH})',
    'searching': 'OptimizedTransform, early_stop off (full search)',
    'reused': 'OptimizedTransform, early_stop off, second run (previous '
              'tuning reused)',
}
OPTIMIZED_TUNING = {
    'optimized': {'trainer_batch_size': TRAINER_BATCH},
    'searching': {'trainer_batch_size': TRAINER_BATCH, 'early_stop': False},
}
TRAINER_ROUNDS = 2
TRAINER_STEPS = 1000
TRAINER_EVAL_STEPS = 10
# The input pipelines HighPerfTrainer is fed: (label, config for it). 'tuned'
# wires in OptimizedTransform's artifact, 'defaults' none; 'sequential' is a
# hand-made artifact in the shape of the stock reader.
TRAINER_INPUTS = {
    'tuned': 'tuned artifact (OptimizedTransform)',
    'defaults': 'no artifact (InputPipelineConfig defaults)',
    'sequential': 'sequential config (1 shard at a time, 1 parse call, '
                  'no cache)',
}
SEQUENTIAL_CONFIG = {'read_ahead_shards': 1, 'parse_parallel_calls': 1,
                     'cache': 'none'}
BEAM_ARGS = ['--direct_running_mode=in_memory', '--direct_num_workers=1']
GOAL_FIRST_EPOCH = 2.0
GOAL_LATER_EPOCHS = 0.8
# OptimizedTransform's step at most 5% slower than the stock Transform.
GOAL_TRANSFORM_RATIO = 1.05


def _metadata_config(path):
  from tfx import v1 as tfx  # pylint: disable=g-import-not-at-top
  return tfx.orchestration.metadata.sqlite_metadata_connection_config(path)


def _run_pipeline(root: str, components) -> None:
  from tfx import v1 as tfx  # pylint: disable=g-import-not-at-top
  tfx.orchestration.LocalDagRunner().run(tfx.dsl.Pipeline(
      pipeline_name=os.path.basename(root), pipeline_root=root,
      components=components, beam_pipeline_args=BEAM_ARGS,
      metadata_connection_config=_metadata_config(
          os.path.join(root, 'metadata.db'))))


def _store(metadata_path: str):
  from ml_metadata.metadata_store import metadata_store  # pylint: disable=g-import-not-at-top
  from ml_metadata.proto import metadata_store_pb2  # pylint: disable=g-import-not-at-top
  config = metadata_store_pb2.ConnectionConfig()
  config.sqlite.filename_uri = metadata_path
  return metadata_store.MetadataStore(config)


def _wall_seconds(metadata_path: str, node_id: str) -> float:
  """A step's wall time: its (newest) MLMD execution's lifetime."""
  from pipelines import summary  # pylint: disable=g-import-not-at-top
  run = summary.read_run(metadata_path)
  return [e.wall_s for e in run.executions if e.node_id == node_id][-1]


def step_seconds(metadata_path: str) -> Dict[str, object]:
  """The Transform step's wall time; for ours what it did after Transform.

  OptimizedTransform records the stock Transform's share, its decision and
  the rates it measured as custom properties (the newest artifact: a root
  can hold two runs).
  """
  from components.types import TunedInputPipeline  # pylint: disable=g-import-not-at-top
  result = {'step': _wall_seconds(metadata_path, 'Transform')}
  artifacts = _store(metadata_path).get_artifacts_by_type(
      TunedInputPipeline.TYPE_NAME)
  if artifacts:
    props = max(artifacts, key=lambda a: a.id).custom_properties
    result['stock_inside'] = props['transform_seconds'].double_value
    result['after'] = props['after_transform_seconds'].double_value
    result['decision'] = props['decision'].string_value
    result['reader'] = props['examples_per_sec'].double_value
    result['consumer'] = (props['consumer_examples_per_sec'].double_value
                          if 'consumer_examples_per_sec' in props else None)
    result['candidates'] = props['num_candidates'].int_value
  return result


def run_upstream(root: str) -> Dict[str, str]:
  """CsvExampleGen -> StatisticsGen -> SchemaGen on the full taxi data."""
  from pipelines import data  # pylint: disable=g-import-not-at-top
  from pipelines import taxi_pipeline  # pylint: disable=g-import-not-at-top
  _run_pipeline(root, list(taxi_pipeline.upstream(data.default_data_root())))
  return {
      'examples': glob.glob(os.path.join(root, 'CsvExampleGen', 'examples',
                                         '*'))[0],
      'schema': glob.glob(os.path.join(root, 'SchemaGen', 'schema', '*'))[0],
  }


def transform_worker(variant: str, examples_uri: str, schema_uri: str,
                     root: str) -> None:
  """One Transform step (in this fresh process) over imported inputs."""
  from tfx import v1 as tfx  # pylint: disable=g-import-not-at-top
  from components import OptimizedTransform  # pylint: disable=g-import-not-at-top
  from pipelines import data  # pylint: disable=g-import-not-at-top
  examples = tfx.dsl.Importer(
      source_uri=examples_uri,
      artifact_type=tfx.types.standard_artifacts.Examples,
      properties={'split_names': json.dumps(['train', 'eval'])},
      custom_properties={'file_format': 'tfrecords_gzip',
                         'payload_format': 'FORMAT_TF_EXAMPLE'},
  ).with_id('examples')
  schema = tfx.dsl.Importer(
      source_uri=schema_uri,
      artifact_type=tfx.types.standard_artifacts.Schema).with_id('schema')
  common = dict(examples=examples.outputs['result'],
                schema=schema.outputs['result'],
                module_file=data.default_module_file())
  if variant == 'stock':
    transform = tfx.components.Transform(**common)
  else:
    transform = OptimizedTransform(**common,
                                   tuning=OPTIMIZED_TUNING[variant])
  transform = transform.with_id('Transform')
  _run_pipeline(root, [examples, schema, transform])


def output(root: str, output: str) -> str:
  """The (first run's) output folder of the root's Transform."""
  paths = glob.glob(os.path.join(root, 'Transform', output, '*'))
  return min(paths, key=lambda p: int(os.path.basename(p)))


def scale_split(split_dir: str, out_dir: str, min_examples: int) -> int:
  """Copies the split's files until they hold >= min_examples; returns N."""
  from components.data import input_pipeline  # pylint: disable=g-import-not-at-top
  files = sorted(glob.glob(os.path.join(split_dir, '*')))
  per_copy = input_pipeline.count_records(files, 'GZIP')
  copies = math.ceil(min_examples / per_copy)
  os.makedirs(out_dir, exist_ok=True)
  for c in range(copies):
    for f in files:
      shutil.copy(f, os.path.join(
          out_dir, f'copy{c:04d}-{os.path.basename(f)}'))
  return copies * per_copy


def _epoch_rate(iterator, num_batches: int, batch_size: int,
                mode: str = 'python') -> float:
  """Examples/s of taking num_batches batches (a full epoch) from iterator."""
  if mode == 'in-graph':
    from components.transform import measurement  # pylint: disable=g-import-not-at-top
    pull = measurement._in_graph_puller(iterator)  # pylint: disable=protected-access
    pull(1)  # Traced outside the timing.
    start = time.perf_counter()
    rows = pull(num_batches - 1)
    return rows / (time.perf_counter() - start)
  start = time.perf_counter()
  for _ in range(num_batches):
    next(iterator)
  return num_batches * batch_size / (time.perf_counter() - start)


def stock_reader(pattern: str, schema, label: str, batch_size: int):
  """The dataset the stock Trainer's `fn_args.data_accessor` builds."""
  from tfx.components.util import tfxio_utils  # pylint: disable=g-import-not-at-top
  from tfx.types import standard_artifacts  # pylint: disable=g-import-not-at-top
  from tfx_bsl.public import tfxio  # pylint: disable=g-import-not-at-top
  examples = standard_artifacts.Examples()
  examples.uri = os.path.dirname(os.path.dirname(pattern))
  factory = tfxio_utils.get_tf_dataset_factory_from_artifact([examples], [])
  return factory([pattern], tfxio.TensorFlowDatasetOptions(
      batch_size=batch_size, label_key=label), schema)


def measure_readers(pattern: str, num_examples: int, stock_graph: str,
                    tuned_config, batch_size: int,
                    mode: str) -> Dict[str, List[float]]:
  """Examples/s of full epochs: stock, ours (epoch 1, 2), ceiling."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tensorflow_transform as tft  # pylint: disable=g-import-not-at-top
  from components.data import input_pipeline  # pylint: disable=g-import-not-at-top
  from pipelines import taxi_module  # pylint: disable=g-import-not-at-top

  tft_output = tft.TFTransformOutput(stock_graph)
  spec = tft_output.transformed_feature_spec()
  label = taxi_module.LABEL_KEY
  num_batches = num_examples // batch_size

  def ceiling():
    def parse(serialized):
      features = tf.io.parse_example(serialized, spec)
      return features, features.pop(label)
    files = input_pipeline.list_files([pattern])
    return tf.data.TFRecordDataset(files, 'GZIP').batch(
        batch_size, drop_remainder=True).map(parse).cache().repeat().prefetch(
            tf.data.AUTOTUNE)

  rates = {'stock': [], 'ours_first': [], 'ours_later': [], 'ceiling': []}
  for round_index in range(READER_ROUNDS):
    rates['stock'].append(_epoch_rate(
        iter(stock_reader(pattern, tft_output.transformed_metadata.schema,
                          label, batch_size)), num_batches, batch_size, mode))
    ours = iter(input_pipeline.build_dataset(
        [pattern], spec, label, batch_size, tuned_config, seed=round_index))
    rates['ours_first'].append(_epoch_rate(ours, num_batches, batch_size,
                                           mode))
    rates['ours_later'].append(_epoch_rate(ours, num_batches, batch_size,
                                           mode))
    del ours
    cached = iter(ceiling())
    for _ in range(num_batches):  # Fills the cache.
      next(cached)
    rates['ceiling'].append(_epoch_rate(cached, num_batches, batch_size,
                                        mode))
    del cached
    print(f'[bench_transform] reader batch {batch_size} ({mode}) round '
          f'{round_index}: '
          + ', '.join(f'{k} {v[-1]:,.0f}' for k, v in rates.items()),
          flush=True)
  return rates


def trainer_worker(examples_uri: str, graph_uri: str, tuned_uri: str,
                   root: str) -> None:
  """One HighPerfTrainer run (in this fresh process) over imported inputs.

  `tuned_uri` is a TunedInputPipeline folder (config.json), or '' to wire in
  none.
  """
  from tfx import v1 as tfx  # pylint: disable=g-import-not-at-top
  from components import HighPerfTrainer  # pylint: disable=g-import-not-at-top
  from components.types import TunedInputPipeline  # pylint: disable=g-import-not-at-top
  from pipelines import data  # pylint: disable=g-import-not-at-top
  examples = tfx.dsl.Importer(
      source_uri=examples_uri,
      artifact_type=tfx.types.standard_artifacts.Examples,
      properties={'split_names': json.dumps(['train', 'eval'])},
  ).with_id('examples')
  graph = tfx.dsl.Importer(
      source_uri=graph_uri,
      artifact_type=tfx.types.standard_artifacts.TransformGraph,
  ).with_id('transform_graph')
  components = [examples, graph]
  tuned = None
  if tuned_uri:
    importer = tfx.dsl.Importer(
        source_uri=tuned_uri, artifact_type=TunedInputPipeline).with_id(
            'tuned_input_pipeline')
    components.append(importer)
    tuned = importer.outputs['result']
  components.append(HighPerfTrainer(
      module_file=data.default_module_file(),
      examples=examples.outputs['result'],
      transform_graph=graph.outputs['result'],
      tuned_input_pipeline=tuned,
      train_args=tfx.proto.TrainArgs(num_steps=TRAINER_STEPS),
      eval_args=tfx.proto.EvalArgs(num_steps=TRAINER_EVAL_STEPS),
      distribution={'strategy': 'one_device', 'global_batch_size': BATCH_SIZE},
      fault_tolerance={'max_restarts': 0}).with_id('Trainer'))
  _run_pipeline(root, components)


def trainer_result(root: str) -> Dict[str, float]:
  """The loop's steady examples/s and the Trainer step's wall seconds."""
  metadata_path = os.path.join(root, 'metadata.db')
  [model_run] = _store(metadata_path).get_artifacts_by_type('ModelRun')
  result = harness.read_training_result(model_run.uri)
  if result.steps != TRAINER_STEPS:
    raise RuntimeError(f'HighPerfTrainer trained {result.steps} steps, not '
                       f'{TRAINER_STEPS}: {result}')
  return {'loop': result.loop.examples_per_sec,
          'wall': _wall_seconds(metadata_path, 'Trainer')}


def sequential_artifact(tuned_uri: str, work: str) -> str:
  """A TunedInputPipeline folder: the tuned config, made sequential."""
  from components.data.input_pipeline import InputPipelineConfig  # pylint: disable=g-import-not-at-top
  from components.records import tuned_input_pipeline  # pylint: disable=g-import-not-at-top
  config = dict(tuned_input_pipeline.read(tuned_uri).to_dict(),
                **SEQUENTIAL_CONFIG)
  folder = os.path.join(work, 'sequential_input_pipeline')
  os.makedirs(folder, exist_ok=True)
  tuned_input_pipeline.write(folder, InputPipelineConfig.from_dict(config))
  return folder


def scaled_examples(transformed_uri: str, scaled_train: str) -> str:
  """An Examples folder: the scaled train split and the real eval split."""
  folder = os.path.dirname(scaled_train)
  eval_dir = os.path.join(folder, 'Split-eval')
  if not os.path.exists(eval_dir):
    shutil.copytree(os.path.join(transformed_uri, 'Split-eval'), eval_dir)
  return folder
