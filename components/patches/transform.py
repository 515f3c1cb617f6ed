"""The stock Transform executor's private hooks OptimizedTransform uses.

- `sharded_writes(num_shards)`: while the block runs, the stock executor in
  this thread writes its transformed examples in `num_shards` files per
  split, inside its own Beam pipeline (so re-sharding scales with the
  runner), and counts them in a Beam counter per output path. It installs
  `SHARDED_TRANSFORM_WRITES`: TFX's `TransformProcessor` is swapped
  process-wide for a subclass whose `_EncodeAndWrite` writes sharded; the
  shard count is per thread, so a stock Transform running in another thread
  of the same process meanwhile writes as stock.
- `TransformExecutorHooks`: the stock executor, whose `run_stock` runs the
  stock `Do` calling a `StockHooks` object from its private
  `_GetPreprocessingFn` and `_make_beam_pipeline`
  (`TRANSFORM_EXECUTOR_HOOKS`).
"""

import contextlib
import functools
import os
import threading
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import apache_beam as beam
from tfx.components.transform import executor as transform_executor
from tfx.components.transform import labels
from tensorflow_metadata.proto.v0 import schema_pb2

from components.data import input_pipeline
from components import patches

METRICS_NAMESPACE = 'tfx_hpm'
# Counter name prefix of the examples written per output path.
EXAMPLES_COUNTER = 'examples_written:'

_shards_by_thread: Dict[int, Tuple[int, Dict[str, int]]] = {}


@contextlib.contextmanager
def sharded_writes(num_shards: int,
                   by_split: Optional[Dict[str, int]] = None
                  ) -> Iterator[None]:
  """Makes the stock executor, in this thread, write `num_shards` files per
  split, or `by_split[<split>]` where given."""
  thread = threading.get_ident()
  with patches.installed(patches.SHARDED_TRANSFORM_WRITES):
    _shards_by_thread[thread] = (num_shards, dict(by_split or {}))
    try:
      yield
    finally:
      _shards_by_thread.pop(thread, None)


@functools.lru_cache(maxsize=None)
def sharded_processor(stock: type) -> type:
  """A subclass of the stock TransformProcessor that writes sharded."""

  class ShardedTransformProcessor(stock):
    """The stock processor; TFRecord output in a fixed number of shards."""

    @staticmethod
    def _EncodeAndWrite(schema: schema_pb2.Schema, file_format: str,  # pylint: disable=invalid-name
                        output_path: str):
      shards = _shards_by_thread.get(threading.get_ident())
      if shards is None or file_format != labels.FORMAT_TFRECORD:
        return stock._EncodeAndWrite(  # pylint: disable=protected-access
            schema=schema, file_format=file_format, output_path=output_path)
      default, by_split = shards
      # `output_path` is a file prefix inside the split's folder.
      split = input_pipeline.split_name(
          os.path.dirname(output_path.rstrip('/')))
      return _EncodeAndWriteSharded(  # pylint: disable=no-value-for-parameter
          schema=schema, output_path=output_path,
          num_shards=by_split.get(split, default),
          to_examples=stock._RecordBatchToExamplesFn)  # pylint: disable=protected-access

  return ShardedTransformProcessor


@beam.ptransform_fn
@beam.typehints.with_input_types(Tuple[Any, Dict[str, Any]])
def _EncodeAndWriteSharded(pcoll: beam.PCollection, schema: schema_pb2.Schema,  # pylint: disable=invalid-name
                           output_path: str, num_shards: int,
                           to_examples: Callable[..., beam.DoFn]
                           ) -> beam.pvalue.PDone:
  """The stock TFRecord write (same records, names), `num_shards` files.

  `num_shards` 0 lets the runner decide, as the stock write does. Examples
  are counted per RecordBatch into a Beam counter named by `output_path`.
  """
  counter = beam.metrics.Metrics.counter(METRICS_NAMESPACE,
                                         EXAMPLES_COUNTER + output_path)

  def count(element):
    counter.inc(element[0].num_rows)
    return element

  return (pcoll
          | 'CountExamples' >> beam.Map(count)
          | 'EncodeAndSerialize' >> beam.ParDo(to_examples(schema))
          | 'ExtractExamples' >> beam.Values()
          | 'WriteToTFRecord' >> beam.io.WriteToTFRecord(
              output_path, file_name_suffix='.gz', num_shards=num_shards))


class StockHooks:
  """What the stock executor calls in `TransformExecutorHooks.run_stock`;
  these do nothing."""

  def on_preprocessing_fn(self, fn: Callable[..., Any]) -> None:
    """Called with the module's preprocessing_fn once the stock executor
    loaded it."""

  def on_beam_pipeline(self, pipeline: beam.Pipeline) -> None:
    """Called with each Beam pipeline the stock executor makes."""


class TransformExecutorHooks(transform_executor.Executor):
  """The stock Transform executor, run with hooks by `run_stock`."""

  # The hooks of the running `run_stock`; outside it (the stock `Do`), none.
  _hooks = StockHooks()

  def run_stock(self, hooks: StockHooks,
                input_dict: Dict[str, Any], output_dict: Dict[str, Any],
                exec_properties: Dict[str, Any]) -> None:
    """The stock `Do`, calling `hooks`."""
    self._hooks = hooks
    try:
      super().Do(input_dict, output_dict, exec_properties)
    finally:
      del self._hooks

  def _GetPreprocessingFn(self, inputs, unused_outputs):  # pylint: disable=invalid-name
    fn = super()._GetPreprocessingFn(inputs, unused_outputs)
    self._hooks.on_preprocessing_fn(fn)
    return fn

  def _make_beam_pipeline(self):
    pipeline = super()._make_beam_pipeline()
    self._hooks.on_beam_pipeline(pipeline)
    return pipeline
