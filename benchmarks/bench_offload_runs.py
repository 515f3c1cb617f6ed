"""bench_offload's settings and measurements, each in the fresh process
`bench_offload` starts (`--mode`): the upstream, one training per setup,
the consumer's cost of the service path, image-sized records; and the cells
on paper (`bench_offload` says what is measured and why)."""

import glob
import hashlib
import os
import statistics
import subprocess
import time
from typing import Any, Dict, List, Tuple

from benchmarks import harness

ROUNDS = 4
COST_ROUNDS = 3
BATCH = 256
TRAIN_STEPS = 2000
# Steps per call, fixed: `auto` picks 64 or 256 here by a few percent, which
# moves the rate, and the final loss is the mean over the last call's steps.
STEPS_PER_CALL = 64
GOAL = 1.6
TRAINER_TIMEOUT_S = 300
# A larger global batch, where the service path's per-batch cost is a
# smaller share of the reader's per-row work.
LARGE_BATCH = 1024
# The trainer's setups: (the reader transforms on the fly, cells, batch).
SETUPS = {'local': (True, 0, BATCH), 'cell': (True, 1, BATCH),
          'materialized': (False, 0, BATCH),
          'local_large': (True, 0, LARGE_BATCH),
          'cell_large': (True, 1, LARGE_BATCH)}
SETUP_LABELS = {
    'local': 'on the fly, without offload',
    'cell': 'on the fly, one cell (`offload={"cells": 1}`)',
    'materialized': 'materialized examples (reader parses only), without '
                    'offload',
    'local_large': 'on the fly, without offload',
    'cell_large': 'on the fly, one cell'}
# (without, with a cell) setups compared for the goal, per batch.
PAIRS = {BATCH: ('local', 'cell'), LARGE_BATCH: ('local_large', 'cell_large')}
# Batch size -> batches pulled per cost measurement (about 100k rows, ten
# epochs, each); the first fifth are not timed (`_drain`).
COST_BATCHES = {64: 1600, 256: 400, 1024: 100}
# Image-sized records: IMAGES distinct JPEGs of IMAGE_HW, served in batches.
IMAGES = 64
IMAGE_HW = (375, 500)
IMAGE_OUT = 224
IMAGE_BATCH = 64
IMAGE_BATCHES = 16
IMAGE_WARMUP = 2
# A served stream whose consumer's CPU is this share of its wall time is
# bound by the consumer, not by what the cell makes.
CONSUMER_BOUND = 0.8
# The host on paper.
HOST_CORES = 16
ACCELERATORS = 8
# A training process's partitions: more than it needs cells, no bound.
PAPER_PARTITIONS = 64
# Examples/s one accelerator trains: assumptions, not measurements.
ASSUMED_RATES = {
    'taxi': (400_000, 'the taxi model (17k weights) steps at least as fast '
             "as this machine's one-core ceiling at batch 256, 380k-450k "
             'examples/s (results/ceiling.md)'),
    'image': (2_500, 'ResNet-50-class training with mixed precision on one '
              'A100-class GPU, of the order of the published figures'),
}


def _newest(pattern: str) -> str:
  """The newest execution's output folder matching `pattern`."""
  return max(glob.glob(pattern), key=lambda p: int(os.path.basename(p)))


def prepare(root: str) -> Dict[str, str]:
  """ExampleGen .. the stock Transform on the full taxi data; the folders
  the trainer reads."""
  # pylint: disable=g-import-not-at-top
  from pipelines import data
  from components.testing import taxi_runs
  # pylint: enable=g-import-not-at-top
  taxi_runs.run_upstream(root, data.default_data_root())
  return {
      'raw': _newest(os.path.join(root, 'CsvExampleGen', 'examples', '*')),
      'transformed': _newest(os.path.join(root, 'Transform',
                                          'transformed_examples', '*')),
      'graph': _newest(os.path.join(root, 'Transform', 'transform_graph',
                                    '*')),
      'schema': _newest(os.path.join(root, 'SchemaGen', 'schema', '*')),
  }


def _pipeline_config(inputs: Dict[str, str]) -> Dict[str, Any]:
  return {'transform_placement': 'on_the_fly',
          'transform_graph_uri': inputs['graph'],
          'raw_file_patterns': {
              split: [os.path.join(inputs['raw'], f'Split-{split}', '*')]
              for split in ('train', 'eval')}}


def _pin_last_core() -> None:
  """Pins this process to its last core: a cell it starts gets the others
  (`launch.spare_cpus`)."""
  os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})


def _cpu_times() -> Dict[str, List[int]]:
  """Per core, /proc/stat's jiffies (user nice system idle iowait irq
  softirq steal)."""
  with open('/proc/stat') as f:
    return {fields[0]: [int(v) for v in fields[1:9]]
            for fields in (line.split() for line in f)
            if fields[0].startswith('cpu') and fields[0] != 'cpu'}


def _core_shares(before: Dict[str, List[int]], after: Dict[str, List[int]],
                 cores) -> Dict[str, float]:
  """The busy and the stolen (by the hypervisor) shares of `cores`' time
  between the two readings."""
  delta = [[a - b for a, b in zip(after[f'cpu{core}'], before[f'cpu{core}'])]
           for core in cores]
  total = max(1, sum(map(sum, delta)))
  return {'busy': sum(d[0] + d[1] + d[2] + d[5] + d[6] for d in delta) / total,
          'steal': sum(d[7] for d in delta) / total}


def run_trainer(inputs: Dict[str, str], root: str, setup: str,
                train_steps: int) -> Dict[str, Any]:
  """One managed training of `setup` in a process pinned to the last
  core."""
  # pylint: disable=g-import-not-at-top
  from components.trainer.common.task import TrainingTask
  from components.testing import trainer_testing
  # pylint: enable=g-import-not-at-top
  on_the_fly, cells, batch = SETUPS[setup]
  os.makedirs(root)
  task = TrainingTask(
      module_file=None, module_path='pipelines.taxi_module', mode='managed',
      train_files=[os.path.join(inputs['transformed'], 'Split-train', '*')],
      eval_files=[os.path.join(inputs['transformed'], 'Split-eval', '*')],
      transform_output=inputs['graph'], schema_path=inputs['schema'],
      serving_model_dir=os.path.join(root, 'serving_model'),
      model_run_dir=os.path.join(root, 'model_run'),
      train_steps=train_steps, eval_steps=2, hparams={}, custom_config={},
      # Seeded: both setups start from the same weights.
      distribution={'strategy': 'one_device', 'global_batch_size': batch,
                    'steps_per_execution': STEPS_PER_CALL, 'seed': 0,
                    'offload': {'cells': cells}},
      fault_tolerance={'max_restarts': 0, 'save_every_steps': None,
                       'save_every_s': 600},
      checkpoint_dir=os.path.join(root, 'checkpoints'),
      input_pipeline=_pipeline_config(inputs) if on_the_fly else None)
  task_path = os.path.join(root, 'task.json')
  task.save(task_path)
  core = {max(os.sched_getaffinity(0))}
  others = sorted(os.sched_getaffinity(0) - core)
  before = _cpu_times()
  with open(os.path.join(root, 'trainer.log'), 'w') as log:
    code = subprocess.run(
        trainer_testing.worker_argv(task_path), stdout=log,
        stderr=subprocess.STDOUT, env=trainer_testing.child_env(),
        preexec_fn=lambda: os.sched_setaffinity(0, core),
        timeout=TRAINER_TIMEOUT_S, check=False).returncode
  after = _cpu_times()
  if code:
    with open(os.path.join(root, 'trainer.log')) as f:
      raise RuntimeError(f'Training ({setup}) exited {code}:\n'
                         f'{f.read()[-4000:]}')
  result = harness.read_training_result(task.model_run_dir)
  assert result.steps == train_steps, result
  offload = result.loop.offload
  if cells and (offload['lost'] or offload['partitions'] != {'0': 'cell-0'}):
    raise RuntimeError(f'The cell did not serve the whole training: {offload}')
  return {'examples_per_sec': result.loop.examples_per_sec,
          'train_wall_s': result.train_wall_s,
          'train_loss': result.loop.train_loss,
          'steps_per_execution': result.loop.steps_per_execution,
          'offload': result.loop.offload,
          'trainer_core': _core_shares(before, after, core),
          'other_cores': _core_shares(before, after, others)}


def _digest(element) -> str:
  features, label = element
  digest = hashlib.sha256()
  for key in sorted(features):
    digest.update(key.encode())
    digest.update(features[key].numpy().tobytes())
  digest.update(label.numpy().tobytes())
  return digest.hexdigest()


def _drain(dataset, elements: int, warmup: int, rows: int
          ) -> Dict[str, float]:
  """Consumer CPU and wall ms per element of `dataset` (`elements` of
  `rows` rows), pulled by a traced loop as the trainer's steps pull theirs,
  after the first `warmup` (the start-up: tracing, a cell's first element,
  the first epochs' set-up, a tenth of a second and more here)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  @tf.function
  def pull(iterator, count):
    for _ in tf.range(count):
      iterator.get_next()

  iterator = iter(dataset)
  pull(iterator, tf.constant(warmup, tf.int64))
  cpu, wall = time.process_time(), time.monotonic()
  pull(iterator, tf.constant(elements - warmup, tf.int64))
  cpu, wall = time.process_time() - cpu, time.monotonic() - wall
  return {'cpu_ms': 1e3 * cpu / (elements - warmup),
          'wall_ms': 1e3 * wall / (elements - warmup),
          'rows_per_s': (elements - warmup) * rows / wall}


def _medians(pulls: List[Dict[str, float]]) -> Dict[str, float]:
  return {key: harness.median_of(pulls, key)
          for key in ('cpu_ms', 'wall_ms', 'rows_per_s')}


def measure_costs(inputs: Dict[str, str], rounds: int) -> Dict[str, Any]:
  """The `cost` measurements (module doc), in this process on one core:
  per batch size, the rows served against the local reader's, then
  `rounds` rounds of local, in-memory and served; medians."""
  _pin_last_core()
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  import tensorflow_transform as tft
  from components.data import input_pipeline
  from components.data import ordered_pipeline
  from components.data import shard_index
  from components.data.config import InputPipelineConfig
  from components.data.data_order import DataOrder
  from components.offload import served
  from components.offload import stream
  from components.offload.config import OffloadConfig
  from components.trainer.managed import datasets
  from pipelines import taxi_module
  # pylint: enable=g-import-not-at-top
  config = InputPipelineConfig(**_pipeline_config(inputs)).validate()
  files = input_pipeline.list_files(config.raw_file_patterns['train'])
  index = shard_index.build(os.path.dirname(files[0]), files, 'GZIP')
  spec = tft.TFTransformOutput(inputs['graph']).transformed_feature_spec()
  parser = input_pipeline.make_parser(spec, taxi_module.LABEL_KEY, config)
  results = {}
  for batch, batches in COST_BATCHES.items():
    order = DataOrder(
        seed=datasets.DATA_SEED, partitions=1, batch=batch,
        window=config.shuffle_window_batches * batch,
        shard_records=tuple(s.records for s in index.shards))

    def dataset(serve, order=order, batches=batches):
      return ordered_pipeline.build_ordered_dataset(
          files, spec, taxi_module.LABEL_KEY, order, config,
          updates=batches, serve=serve)

    offload = served.Offload(OffloadConfig(cells=1), 1, batch)
    try:
      local = list(dataset(None))
      local_digests = [_digest(e) for e in local]
      cell_digests = [_digest(e) for e in dataset(offload.serve)]
      stacked = tf.nest.map_structure(lambda *t: tf.stack(t), *local)
      del local
      streams = {
          'local': lambda: dataset(None),
          'memory': lambda stacked=stacked: dataset(
              lambda partition, first, count, local_stream: (
                  tf.data.Dataset.from_tensor_slices(stacked).skip(
                      first).take(count))),
          'served': lambda: dataset(offload.serve)}
      if batch == BATCH:
        _, cell = offload.pool.cell_of(0)
        # The cell's dataset read directly: the tf.data service client
        # alone, without the offload's pump and queue.
        streams['client_alone'] = lambda: stream.from_cell(
            ordered_pipeline.partition_batches(
                order, files, 0, 0, batches, parser, config,
                config.read_compression()).enumerate(),
            cell.address, f'direct-{time.time_ns()}')
      pulls = {name: [] for name in streams}
      for round_index in range(rounds):
        for name, make_stream in streams.items():
          pulls[name].append(_drain(make_stream(), batches, batches // 5,
                                    batch))
        print(f'[bench_offload] batch {batch} round {round_index}: CPU ms '
              'a batch: ' + ', '.join(
                  f'{name} {p[-1]["cpu_ms"]:.3f}'
                  for name, p in pulls.items()), flush=True)
    finally:
      offload.close()
    results[batch] = {name: _medians(values)
                      for name, values in pulls.items()}
    results[batch].update(
        rounds={name: [round(p['cpu_ms'], 3) for p in values]
                for name, values in pulls.items()},
        updates_compared=len(local_digests),
        rows_equal=local_digests == cell_digests,
        first_difference=next(
            (i for i, (a, b) in enumerate(zip(local_digests, cell_digests))
             if a != b), None))
  return results


def _write_images(folder: str) -> Tuple[List[str], float]:
  """A TFRecord file of IMAGES smooth, noisy JPEGs with a label; its
  files and the JPEGs' mean size."""
  # pylint: disable=g-import-not-at-top
  import numpy as np
  import tensorflow as tf
  # pylint: enable=g-import-not-at-top
  os.makedirs(folder, exist_ok=True)
  path = os.path.join(folder, 'images.tfrecord')
  height, width = IMAGE_HW
  y, x = np.mgrid[0:height, 0:width].astype('f4')
  sizes = []
  with tf.io.TFRecordWriter(path) as writer:
    for i in range(IMAGES):
      rng = np.random.default_rng(i)
      channels = [128 + 60 * np.sin(x / rng.uniform(8, 40) + rng.uniform(
          0, 6)) * np.cos(y / rng.uniform(8, 40) + rng.uniform(0, 6))
                  for _ in range(3)]
      pixels = np.clip(np.stack(channels, -1) + rng.normal(
          0, 16, (height, width, 3)), 0, 255).astype('uint8')
      jpeg = tf.io.encode_jpeg(pixels, quality=90).numpy()
      sizes.append(len(jpeg))
      writer.write(tf.train.Example(features=tf.train.Features(feature={
          'image': tf.train.Feature(bytes_list=tf.train.BytesList(
              value=[jpeg])),
          'label': tf.train.Feature(int64_list=tf.train.Int64List(
              value=[i % 10]))})).SerializeToString())
  return [path], statistics.mean(sizes)


def measure_images(root: str) -> Dict[str, Any]:
  """The `image` measurements (module doc), in this process on one core."""
  _pin_last_core()
  # pylint: disable=g-import-not-at-top
  import tensorflow as tf
  from components.offload import served
  from components.offload.config import OffloadConfig
  # pylint: enable=g-import-not-at-top
  files, jpeg_bytes = _write_images(os.path.join(root, 'images'))
  spec = {'image': tf.io.FixedLenFeature([], tf.string),
          'label': tf.io.FixedLenFeature([], tf.int64)}
  crop = min(IMAGE_HW)

  @tf.autograph.experimental.do_not_convert
  def preprocess(serialized):
    example = tf.io.parse_single_example(serialized, spec)
    image = tf.io.decode_jpeg(example['image'], channels=3)
    image = tf.image.random_crop(image, [crop, crop, 3])
    image = tf.image.resize(image, [IMAGE_OUT, IMAGE_OUT])
    image = tf.image.random_flip_left_right(image)
    return tf.cast(image, tf.uint8), example['label']

  def local_stream(first, batches):
    return tf.data.TFRecordDataset(files).repeat().map(
        preprocess, num_parallel_calls=tf.data.AUTOTUNE).batch(
            IMAGE_BATCH, drop_remainder=True).skip(first).take(batches)

  local = _drain(local_stream(0, IMAGE_BATCHES), IMAGE_BATCHES,
                 IMAGE_WARMUP, IMAGE_BATCH)
  offload = served.Offload(OffloadConfig(cells=1), 1, IMAGE_BATCH)
  try:
    cell = _drain(offload.serve(0, 0, IMAGE_BATCHES, local_stream).prefetch(
        tf.data.AUTOTUNE), IMAGE_BATCHES, IMAGE_WARMUP, IMAGE_BATCH)
  finally:
    offload.close()
  return {'jpeg_bytes': jpeg_bytes, 'local': local, 'served': cell}


def paper_cells(costs: Dict[int, Any], images: Dict[str, Any]
               ) -> List[Dict[str, Any]]:
  """`sizing.cells_needed` on the host on paper, per record kind."""
  from components.offload import sizing  # pylint: disable=g-import-not-at-top
  kinds = {
      'taxi': (costs[BATCH]['served'], BATCH),
      'image': (images['served'], IMAGE_BATCH)}
  spare_cores = HOST_CORES - ACCELERATORS
  rows = []
  for kind, (measured, batch) in kinds.items():
    consumer_rate, basis = ASSUMED_RATES[kind]
    choice = sizing.cells_needed(consumer_rate, measured['rows_per_s'],
                                 PAPER_PARTITIONS)
    cells = ACCELERATORS * choice.cells
    rows.append({
        'kind': kind, 'consumer_rate': consumer_rate, 'basis': basis,
        'cell_rate': measured['rows_per_s'], 'per_accelerator': choice.cells,
        'reason': choice.reason, 'cells': cells,
        'on_host': min(cells, spare_cores),
        'elsewhere': max(0, cells - spare_cores),
        # Of one core, what a training process spends receiving its batches.
        'receiving_cores': consumer_rate / batch * measured['cpu_ms'] / 1e3})
  return rows
