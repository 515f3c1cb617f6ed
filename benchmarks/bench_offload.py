"""Input offload: the trainer on one core, its reader in a cell on another.

    python -m benchmarks.bench_offload [--rounds R] [--train-steps N]

`distribution.offload` has the trainer's partitions produced by tf.data
service cells (`components/offload`). On this machine the training process
is pinned to its last core (`os.sched_setaffinity`, inherited by its
threads) and a local cell runs on the others (`launch.spare_cpus`). The
reader is made expensive: the full taxi data read raw and transformed on
the fly (`transform_placement='on_the_fly'`: the stock Transform's graph
applied in the reader), the taxi model (`pipelines/taxi_module.py`), global
batch BATCH (and LARGE_BATCH), the managed loop as the executor starts it
(`components.trainer.process.entry`). Each measurement in a fresh process:

- trainer: training_result.json's steady examples/s without offload and
  with one cell (`offload={'cells': 1}`), and, for where the time goes, of
  the trainer reading Transform's materialized examples instead (the reader
  parses only), ROUNDS interleaved rounds, medians. Goal: >= GOAL x with the
  cell, judged at each batch size.
- cost: the consumer's CPU per batch (`time.process_time` of a process on
  one core) pulled through `ordered_pipeline.build_ordered_dataset` by a
  traced loop, as the trainer's steps pull theirs: from the local on-the-fly
  reader, from an in-memory stream of the same batches and from a cell
  (`served.Offload.serve`), per batch size of COST_BATCHES, COST_ROUNDS rounds,
  medians; at BATCH also the tf.data service client alone (the cell's
  dataset read directly: no pump thread, no queue). The served wall
  rate is the cell's production rate (the consumer waits on it). Every
  update's features and label are hashed: served and local must be
  equal.
- image: one cell's production rate of image-sized records (JPEGs decoded,
  cropped, resized and flipped to 224x224x3 uint8) and the consumer's CPU per
  batch.

On paper: `sizing.cells_needed` for a HOST_CORES-core host with
ACCELERATORS accelerators, from the measured cell rates and assumed
accelerator rates (ASSUMED_RATES).
"""

import argparse
import glob
import hashlib
import json
import os
import statistics
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Tuple

from benchmarks import processes
from benchmarks import report

MODULE = 'benchmarks.bench_offload'
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
  from tests.support import taxi_runs
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
  from tests.support import trainer_testing
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
  with open(os.path.join(task.model_run_dir, 'training_result.json')) as f:
    result = json.load(f)
  assert result['steps'] == train_steps, result
  offload = result['offload']
  if cells and (offload['lost'] or offload['partitions'] != {'0': 'cell-0'}):
    raise RuntimeError(f'The cell did not serve the whole training: {offload}')
  return {'examples_per_sec': result['examples_per_sec'],
          'train_wall_s': result['train_wall_s'],
          'train_loss': result['train_loss'],
          'steps_per_execution': result['steps_per_execution'],
          'offload': result['offload'],
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
  return {key: statistics.median(p[key] for p in pulls)
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


def _median(runs: List[Dict[str, Any]], key: str) -> float:
  return statistics.median(r[key] for r in runs)


def _trainer_section(trainer: Dict[str, List[Dict[str, Any]]],
                     train_steps: int, cores: List[int]) -> str:
  rows = [[SETUP_LABELS[setup], SETUPS[setup][2],
           f'{_median(r, "examples_per_sec"):,.0f}',
           f'{_median(r, "examples_per_sec") / SETUPS[setup][2]:,.0f}',
           f'{_median(r, "train_wall_s"):.1f}',
           ' / '.join(f'{x["examples_per_sec"]:,.0f}' for x in r),
           ' / '.join(f'{x["other_cores"]["busy"]:.0%}' for x in r),
           ' / '.join(f'{x["trainer_core"]["steal"]:.0%}' for x in r),
           ' / '.join(f'{x["train_loss"]:.6f}' for x in r)]
          for setup, r in trainer.items()]
  same = [len({x['train_loss'] for setup in pair for x in trainer[setup]})
          == 1 for pair in PAIRS.values()]
  materialized = {x['train_loss'] for x in trainer['materialized']}
  ratios = {batch: _ratio(trainer, batch) for batch in PAIRS}
  return '\n\n'.join([
      'The taxi model trained by the managed loop (one_device, '
      f'{train_steps} steps at global batch {BATCH} and {LARGE_BATCH}, '
      f'{STEPS_PER_CALL} steps a call, seeded), its process '
      f'pinned to core {cores[-1]} of {cores}; the reader transforms the raw '
      'taxi examples on the fly (the stock Transform\'s graph in the '
      'reader) or, to see where the time goes, parses the examples '
      'Transform materialized. With one cell, the cell is a local process '
      'on the other core(s). Steady examples/s from training_result.json '
      f'(after the first call); {len(trainer["local"])} interleaved rounds, '
      'medians. The train wall time includes starting the cell. Busy and '
      'stolen (by the hypervisor): shares of the cores\' time over the whole '
      'training process (/proc/stat); without a cell the other core\'s '
      'busy time is the machine\'s other work, with one it is the cell\'s '
      'and that work.',
      report.table(['setup', 'batch', 'examples/s (median)', 'steps/s',
                    'train wall s', 'every round',
                    'other core(s) busy, every round',
                    'trainer\'s core stolen, every round',
                    'final train loss, every round'], rows),
      report.table(['goal', 'batch', 'wanted', 'measured', 'per round', ''],
                   [['one cell / without offload, the trainer on one core',
                     batch, f'>= {GOAL}x', f'{ratio:.2f}x', ' / '.join(
                         f'{c["examples_per_sec"] / w["examples_per_sec"]:.2f}x'
                         for c, w in zip(trainer[PAIRS[batch][1]],
                                         trainer[PAIRS[batch][0]])),
                     'met' if ratio >= GOAL else '**not met**']
                    for batch, ratio in ratios.items()]),
      'The same rows each update with and without the cell, end to end: '
      + ('at each batch size every on-the-fly run ended on the same '
         'training loss, bit for bit' + (
             ' (and so did the materialized runs: the on-the-fly reader '
             'yields the tensors Transform wrote).'
             if materialized == {x['train_loss'] for x in trainer['local']}
             else '.')
         if all(same)
         else '**the runs ended on different training losses** (the '
         'rows are compared update by update below).')])


def _ratio(trainer: Dict[str, List[Dict[str, Any]]], batch: int) -> float:
  without, cell = PAIRS[batch]
  return (_median(trainer[cell], 'examples_per_sec') /
          _median(trainer[without], 'examples_per_sec'))


def _cost_section(costs: Dict[int, Any]) -> str:
  rows = []
  for batch, c in costs.items():
    service = c['served']['cpu_ms'] - c['memory']['cpu_ms']
    reading = c['local']['cpu_ms'] - c['memory']['cpu_ms']
    rows.append([
        batch, f"{c['local']['cpu_ms']:.3f}", f"{c['memory']['cpu_ms']:.3f}",
        f"{c['served']['cpu_ms']:.3f}", f'{service:.3f}',
        f'{service / reading:.2f}', f"{c['local']['rows_per_s']:,.0f}",
        f"{c['served']['rows_per_s']:,.0f}" + (
            ' (consumer-bound)' if c['served']['cpu_ms'] >= CONSUMER_BOUND
            * c['served']['wall_ms'] else ''),
        f"{c['updates_compared']}: " + (
            'equal' if c['rows_equal'] else
            f"**differ** from update {c['first_difference']}")])
  at = costs[BATCH]
  client = at['client_alone']['cpu_ms']
  return '\n\n'.join([
      '## The consumer\'s cost of the service path\n\n'
      'CPU ms per batch of the consumer, a process on one core, pulling the '
      'batches of one partition through `build_ordered_dataset` by a traced '
      'loop as the trainer\'s steps pull theirs (about ten epochs, the first '
      'fifth not timed: start-up), medians of the rounds: from the local '
      'on-the-fly reader, from an in-memory stream of the same batches (the '
      'cost of consuming at all) and from a cell (`served.Offload.serve`). '
      'Service path: served - in-memory; the reader\'s work: local - '
      'in-memory. The served wall rate is what the cell makes where the '
      'consumer waits on it (consumer-bound: its CPU is at least '
      f'{CONSUMER_BOUND:.0%} of the wall time). Updates compared: the '
      'sha256 of every update\'s '
      'features and label, served against local.',
      report.table(['batch', 'local reader CPU ms', 'in-memory CPU ms',
                    'served CPU ms', 'service path ms',
                    'service path / reader\'s work',
                    'local reader rows/s (one core)',
                    'cell rows/s (served wall)', 'updates compared'], rows),
      f'At batch {BATCH} the tf.data service client alone (the cell\'s '
      'dataset read directly: no pump thread, no queue) costs the '
      f'consumer {client:.3f} ms a batch; the pump thread and the queue the '
      f'consumer\'s pipeline dequeues from add '
      f'{at["served"]["cpu_ms"] - client:.3f} ms.'])


def _time_section(trainer: Dict[str, List[Dict[str, Any]]],
                  costs: Dict[int, Any]) -> str:
  ms = {setup: 1e3 * BATCH / _median(trainer[setup], 'examples_per_sec')
        for setup in ('local', 'cell', 'materialized')}
  at = costs[BATCH]
  memory = at['memory']['cpu_ms']
  reading = at['local']['cpu_ms'] - memory
  service = at['served']['cpu_ms'] - memory
  client = at['client_alone']['cpu_ms'] - memory
  rest = ms['local'] - reading
  ratio = _ratio(trainer, BATCH)

  def gain(path: float) -> str:
    return f'{ms["local"]:.2f} / ({rest:.2f} + {path:.2f}) = ' + (
        f'{ms["local"] / (rest + path):.2f}x')

  text = (
      '## Where the time goes\n\n'
      f'Milliseconds per batch of {BATCH} on the trainer\'s core (medians '
      f'above): {ms["local"]:.2f} reading on the fly, {ms["cell"]:.2f} with '
      f'the cell, {ms["materialized"]:.2f} reading materialized examples '
      '(with the cell the trainer runs at '
      f'{ms["materialized"] / ms["cell"]:.2f} of that rate). The reader\'s '
      f'work is {reading:.2f} ms (measured alone, above), the rest, '
      f'{rest:.2f} ms, the step and the managed loop, which stay on the '
      'core. Moving the reader to a cell gains at most '
      f'{ms["local"]:.2f} / {rest:.2f} = {ms["local"] / rest:.2f}x, less '
      f'the service path, which costs the consumer {service:.2f} ms a batch '
      f'({service / reading:.0%} of the reader\'s work it moves): '
      f'{gain(service)} (measured {ratio:.2f}x; the parts come from other '
      'processes on a shared VM). Of the service path, the tf.data service '
      f'client takes {client:.2f} ms and the pump and its queue '
      f'{service - client:.2f} ms; with the client alone it would be '
      f'{gain(client)}.')
  if ratio >= GOAL:
    return text + f' The goal is met at batch {BATCH}.'
  if ms['local'] / rest < GOAL:
    why = ('even a free service path would not reach it: the reader is too '
           'small a part of the trainer\'s time on one core')
  elif ms['local'] / (rest + client) < GOAL:
    why = ('the tf.data service client alone costs the consumer too much '
           'of what the cell takes off the core')
  else:
    why = ('the consumer\'s cost of the service path keeps the gain under '
           'it')
  return text + (
      f' At batch {BATCH} the goal is not met: {why}. The service path '
      'costs per batch and '
      'the reader per row, so its share falls as batches grow (the table '
      'above); a step cheaper than the reader (an accelerator taking the '
      'step) leaves the reader more of the core\'s time, and the cell more '
      'to gain.')


def _image_section(images: Dict[str, Any]) -> str:
  local, served_ = images['local'], images['served']
  return (
      '## Image-sized records\n\n'
      f'{IMAGES} JPEGs of {IMAGE_HW[1]}x{IMAGE_HW[0]} (mean '
      f'{images["jpeg_bytes"] / 1e3:.0f} KB) decoded, cropped, resized to '
      f'{IMAGE_OUT}x{IMAGE_OUT}x3 uint8 and flipped, batches of '
      f'{IMAGE_BATCH}: one core reads {local["rows_per_s"]:,.0f} images/s '
      f'itself; one cell serves {served_["rows_per_s"]:,.0f} images/s, at '
      f'{served_["cpu_ms"]:.2f} ms of consumer CPU a batch (reading locally: '
      f'{local["cpu_ms"]:.2f} ms).')


def _paper_section(paper: List[Dict[str, Any]], costs: Dict[int, Any]
                  ) -> str:
  from components.offload import sizing  # pylint: disable=g-import-not-at-top
  spare = HOST_CORES - ACCELERATORS
  taxi_rate = ASSUMED_RATES['taxi'][0]
  largest = max(costs)
  rows = [[p['kind'], f"{p['consumer_rate']:,} (assumed)",
           f"{p['cell_rate']:,.0f}", p['per_accelerator'], p['cells'],
           p['on_host'], p['elsewhere'], f"{p['receiving_cores']:.2f}"]
          for p in paper]
  return '\n\n'.join([
      f'## On paper: a {HOST_CORES}-core host with {ACCELERATORS} '
      'accelerators\n\n'
      'One training process per accelerator, one core each; the other '
      f'{spare} cores hold one local cell each. Cells per accelerator by '
      '`sizing.cells_needed` (the auto-scaler rule, '
      f'{sizing.HEADROOM:g}x headroom) from the cell rate measured here. '
      '**The accelerator rates are assumptions**: ' + '; '.join(
          f"{p['kind']} {p['consumer_rate']:,} examples/s: {p['basis']}"
          for p in paper) + '. Receiving: the share of its core a training '
      'process spends pulling its batches through the service path at that '
      'rate (the served consumer CPU per batch measured here). A process '
      'needs data_partitions >= its cells (a partition is one job on one '
      'cell).',
      report.table(['record', 'an accelerator trains ex/s',
                    'a cell makes ex/s (measured)', 'cells per accelerator',
                    f'cells for {ACCELERATORS}', 'on the host',
                    'on other hosts (launcher ray)',
                    'receiving, cores per process'], rows),
      f'Receiving {taxi_rate:,} taxi examples a second takes a training '
      f'process {paper[0]["receiving_cores"]:.2f} cores at batch {BATCH} and '
      f'{taxi_rate / largest * costs[largest]["served"]["cpu_ms"] / 1e3:.2f}'
      f' at batch {largest}: small records at a high rate want large '
      'batches through the service path.'])


def _body(trainer: Dict[str, List[Dict[str, Any]]], costs: Dict[int, Any],
          images: Dict[str, Any], paper: List[Dict[str, Any]],
          train_steps: int, cores: List[int], load: List[float],
          wall_s: float) -> str:
  return '\n\n'.join([
      _trainer_section(trainer, train_steps, cores), _cost_section(costs),
      _time_section(trainer, costs), _image_section(images),
      _paper_section(paper, costs),
      f'Load average (1 min) before / after: {load[0]:.1f} / {load[1]:.1f} '
      f'(the machine is shared). Benchmark wall time: {wall_s:.0f} s.']) + '\n'


def main(results_dir: str = 'benchmarks/results', rounds: int = ROUNDS,
         train_steps: int = TRAIN_STEPS) -> str:
  began = time.monotonic()
  work = tempfile.mkdtemp(prefix='bench_offload_')
  load_before = os.getloadavg()[0]
  inputs = processes.run_mode(MODULE, work, 'prepare', {})
  trainer = {setup: [] for setup in SETUPS}
  for round_index in range(rounds):
    order = list(SETUPS)
    if round_index % 2:
      order.reverse()
    for setup in order:
      run = processes.run_mode(MODULE, work, 'trainer', {
          'inputs': inputs, 'setup': setup, 'train_steps': train_steps,
          'root': os.path.join(work, f'trainer-{setup}-{round_index}')})
      trainer[setup].append(run)
      print(f'[bench_offload] round {round_index} {setup}: '
            f'{run["examples_per_sec"]:,.0f} examples/s', flush=True)
  costs = {int(batch): value for batch, value in processes.run_mode(
      MODULE, work, 'cost', {'inputs': inputs, 'rounds': COST_ROUNDS}).items()}
  images = processes.run_mode(MODULE, work, 'image', {})
  paper = paper_cells(costs, images)
  with open(os.path.join(work, 'results.json'), 'w') as f:
    json.dump({'trainer': trainer, 'costs': costs, 'images': images,
               'paper': paper}, f, indent=1)
  print(f'[bench_offload] every measurement: {f.name}', flush=True)
  body = _body(trainer, costs, images, paper, train_steps,
               sorted(os.sched_getaffinity(0)),
               [load_before, os.getloadavg()[0]], time.monotonic() - began)
  return report.write(results_dir, 'offload',
                      'Input offload: the trainer\'s reader in a tf.data '
                      'service cell', body)


if __name__ == '__main__':
  parser = argparse.ArgumentParser(prog=f'python -m {MODULE}')
  parser.add_argument('--results-dir', default='benchmarks/results')
  parser.add_argument('--rounds', type=int, default=ROUNDS)
  parser.add_argument('--train-steps', type=int, default=TRAIN_STEPS)
  processes.add_mode_arguments(parser)
  args = parser.parse_args()
  if args.mode is None:
    print(main(args.results_dir, args.rounds, args.train_steps))
  else:
    spec = json.loads(args.spec)
    if args.mode == 'prepare':
      value = prepare(os.path.join(args.root, 'upstream'))
    elif args.mode == 'trainer':
      value = run_trainer(spec['inputs'], spec['root'], spec['setup'],
                          spec['train_steps'])
    elif args.mode == 'cost':
      value = measure_costs(spec['inputs'], spec['rounds'])
    else:
      value = measure_images(args.root)
    processes.write_result(args.out, value)
