"""The sharded Beam write of OptimizedTransform's executor (fast, real Beam),
through its patch of TFX's TransformProcessor (components.patches.transform)."""

import glob
import os
import threading

import apache_beam as beam
import pyarrow as pa
import tensorflow as tf
from tfx.components.transform import executor as transform_executor
from tfx.components.transform import labels
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2

from components.patches import transform as transform_patches

SCHEMA = text_format.Parse('''
feature { name: "x" type: INT }
''', schema_pb2.Schema())
NUM_ROWS = 50


def _batches():
  return [(pa.RecordBatch.from_arrays(
      [pa.array([[i] for i in range(start, start + 10)],
                type=pa.large_list(pa.int64()))], ['x']), {})
          for start in range(0, NUM_ROWS, 10)]


def _write(tmp_path, num_shards):
  output_path = os.path.join(str(tmp_path), 'Split-train',
                             'transformed_examples')
  with transform_patches.sharded_writes(num_shards):
    processor = transform_executor.TransformProcessor()
    pipeline = beam.Pipeline(argv=['--direct_running_mode=in_memory',
                                   '--direct_num_workers=1'])
    with pipeline:
      _ = (pipeline | beam.Create(_batches(), reshuffle=False)
           | processor._EncodeAndWrite(  # pylint: disable=protected-access
               schema=SCHEMA, file_format=labels.FORMAT_TFRECORD,
               output_path=output_path))
  files = sorted(glob.glob(os.path.join(str(tmp_path), 'Split-train', '*')))
  values = sorted(
      tf.train.Example.FromString(r).features.feature['x'].int64_list.value[0]
      for r in tf.data.TFRecordDataset(files, 'GZIP').as_numpy_iterator())
  counters = pipeline.result.metrics().query(
      beam.metrics.MetricsFilter().with_namespace(
          transform_patches.METRICS_NAMESPACE))['counters']
  return files, values, {c.key.metric.name: c.committed for c in counters}


def test_beam_writes_the_wanted_shards_and_counts_examples(tmp_path):
  stock = transform_executor.TransformProcessor
  files, values, counters = _write(tmp_path, 4)
  assert [os.path.basename(f) for f in files] == [
      f'transformed_examples-{k:05d}-of-00004.gz' for k in range(4)]
  assert values == list(range(NUM_ROWS))  # Every record, once.
  [(name, count)] = counters.items()
  assert name.endswith(os.path.join('Split-train', 'transformed_examples'))
  assert count == NUM_ROWS
  # After the write the stock processor is back in place.
  assert transform_executor.TransformProcessor is stock


def test_more_shards_than_records_still_writes_every_shard(tmp_path):
  files, values, _ = _write(tmp_path, NUM_ROWS + 3)
  assert len(files) == NUM_ROWS + 3
  assert values == list(range(NUM_ROWS))


def test_other_threads_write_as_stock():
  seen = {}

  def other_thread():
    seen['class'] = transform_executor.TransformProcessor
    seen['shards'] = transform_patches._shards_by_thread.get(  # pylint: disable=protected-access
        threading.get_ident())

  with transform_patches.sharded_writes(4):
    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
  # The class is patched process-wide, but the shard count is this thread's.
  assert seen['class'].__name__ == 'ShardedTransformProcessor'
  assert seen['shards'] is None
