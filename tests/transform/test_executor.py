"""OptimizedTransform's executor: the sharded Beam write (fast, real Beam,
through its patch of TFX's TransformProcessor, components.patches.transform),
what it tunes on for each stock input."""

import glob
import os
import re
import threading

import apache_beam as beam
import pyarrow as pa
import pytest
import tensorflow as tf
from tfx.components.transform import executor as transform_executor
from tfx.components.transform import labels
from tfx.proto import transform_pb2
from tfx.types import artifact_utils
from tfx.types import standard_artifacts
from tfx.types import standard_component_specs
from tfx.utils import proto_utils
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2

from components.patches import transform as transform_patches
from components.transform.config import TuningConfig
from components.transform import tuning_inputs

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


def _examples(file_format, payload_format):
  artifact = standard_artifacts.Examples()
  artifact.split_names = artifact_utils.encode_split_names(['train', 'eval'])
  artifact.set_string_custom_property('file_format', file_format)
  artifact.set_string_custom_property('payload_format', payload_format)
  return {standard_component_specs.EXAMPLES_KEY: [artifact]}


@pytest.mark.parametrize('examples, splits, materialize, expected', [
    (('tfrecords_gzip', 'FORMAT_TF_EXAMPLE'), None, True, ('train', None)),
    (('tfrecords_gzip', 'FORMAT_TF_EXAMPLE'), (['train'], ['eval']), False,
     ('eval', None)),
    (('tfrecords_gzip', 'FORMAT_TF_EXAMPLE'), (['train'], []), True,
     (None, r"no split to tune on: Transform transforms \[\]")),
    (('tfrecords_gzip', 'FORMAT_TF_SEQUENCE_EXAMPLE'), None, True,
     ('train', None)),
    (('tfrecords_gzip', 'FORMAT_TF_SEQUENCE_EXAMPLE'), None, False,
     (None, r"examples are \['tfrecords_gzip/FORMAT_TF_SEQUENCE_EXAMPLE'\].*"
      'and Transform did not materialize')),
    (('parquet', 'FORMAT_PARQUET'), None, True,
     (None, r"examples are \['parquet/FORMAT_PARQUET'\] \(it reads gzipped")),
])
def test_every_stock_input_is_taken_and_what_cannot_be_tuned_is_said(
    examples, splits, materialize, expected):
  """Inputs the stock Transform takes but the reader cannot tune on (no
  split transformed, Parquet, unmaterialized SequenceExamples) leave the
  default pipeline with the reason, instead of failing the step."""
  properties = {standard_component_specs.SPLITS_CONFIG_KEY: (
      proto_utils.proto_to_json(transform_pb2.SplitsConfig(
          analyze=splits[0], transform=splits[1])) if splits else None)}
  outputs = ({standard_component_specs.TRANSFORMED_EXAMPLES_KEY:
              [standard_artifacts.Examples()]} if materialize else {})
  split, why = tuning_inputs.split_to_tune(
      TuningConfig(), _examples(*examples), outputs, properties)
  assert split == expected[0]
  if expected[1] is None:
    assert why is None
  else:
    assert re.search(expected[1], why), why


def test_a_full_output_location_fails_the_write_naming_it(tmp_path):
  """Beam's own write on a full file system: the error names the output and
  says the location is full (not retried: nothing a rerun can cure)."""
  from components import storage  # pylint: disable=g-import-not-at-top
  from components.transform import materialized  # pylint: disable=g-import-not-at-top
  from tests.support import small_disk  # pylint: disable=g-import-not-at-top
  with small_disk.tmpfs(str(tmp_path / 'disk'), '256k') as disk:
    small_disk.fill(disk)
    with pytest.raises(Exception) as beam_error:
      _write(disk, 2)
    examples = standard_artifacts.Examples()
    examples.uri = os.path.join(disk, 'Split-train')
    graph = standard_artifacts.TransformGraph()
    graph.uri = str(tmp_path / 'graph')
    with pytest.raises(storage.ExplainedOSError) as error:
      materialized.raise_if_a_location_failed(
          beam_error.value,
          {standard_component_specs.TRANSFORM_GRAPH_KEY: [graph],
           standard_component_specs.TRANSFORMED_EXAMPLES_KEY: [examples]})
  message = str(error.value)
  assert message.startswith(
      f'The transformed_examples output location {examples.uri} is full ('), (
          message)
  assert 'No space left on device' in message
  assert error.value.__cause__ is beam_error.value


def test_a_split_gets_a_shard_per_bounded_size():
  from components.transform import decisions  # pylint: disable=g-import-not-at-top
  mb = 2**20
  assert decisions.shard_count(10 * mb, 16, 128) == 16  # Small: the floor.
  assert decisions.shard_count(100_000 * mb, 16, 128) == 782  # 100 GB.
  assert decisions.shard_count(100_000 * mb, 16, 0) == 16  # No bound.
  assert decisions.shard_count(100_000 * mb, 0, 128) == 0  # Runner decides.


def test_each_split_is_written_in_its_own_shard_count(tmp_path):
  output_path = os.path.join(str(tmp_path), 'Split-eval',
                             'transformed_examples')
  with transform_patches.sharded_writes(4, {'eval': 3, 'train': 7}):
    processor = transform_executor.TransformProcessor()
    with beam.Pipeline(argv=['--direct_running_mode=in_memory',
                             '--direct_num_workers=1']) as pipeline:
      _ = (pipeline | beam.Create(_batches(), reshuffle=False)
           | processor._EncodeAndWrite(  # pylint: disable=protected-access
               schema=SCHEMA, file_format=labels.FORMAT_TFRECORD,
               output_path=output_path))
  assert len(glob.glob(os.path.join(str(tmp_path), 'Split-eval', '*'))) == 3
