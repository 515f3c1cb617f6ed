"""A small indexed split, its data order, and the row ids each update of
`ordered_pipeline` reads: what a served partition stream must match, row
for row (tests/offload)."""

import os
from typing import Callable, List, Optional, Tuple

import tensorflow as tf

from components.data import input_pipeline
from components.data import ordered_pipeline
from components.data import shard_index
from components.data.data_order import DataOrder
from tests.support import transform_data

NUM_EXAMPLES = 600
NUM_FILES = 5
BATCH = 8
PARTITIONS = 4
UPDATES = 40  # Crosses an epoch end (18.75 batches a partition).


def write_split(folder: str) -> Tuple[List[str], DataOrder]:
  """The split's files in `folder` and their data order."""
  patterns = transform_data.write_split(folder, NUM_EXAMPLES, NUM_FILES)
  files = input_pipeline.list_files(patterns)
  index = shard_index.build(os.path.dirname(files[0]), files, 'GZIP')
  order = DataOrder(seed=3, partitions=PARTITIONS, batch=BATCH,
                    window=4 * BATCH,
                    shard_records=tuple(s.records for s in index.shards))
  return files, order


def update_rows(files: List[str], order: DataOrder, pipelines: int = 1,
                start: int = 0, serve_of: Optional[Callable] = None,
                each: Optional[Callable[[int], None]] = None
                ) -> List[List[int]]:
  """Each update's row ids, the pipelines' batches joined in order;
  `serve_of(pipeline_id)`: the pipeline's `serve`; `each(update)` runs
  before an update is read."""
  per_pipeline = []
  for pipeline_id in range(pipelines):
    context = tf.distribute.InputContext(
        num_input_pipelines=pipelines, input_pipeline_id=pipeline_id,
        num_replicas_in_sync=pipelines)
    dataset = ordered_pipeline.build_ordered_dataset(
        files, transform_data.FEATURE_SPEC, 'label', order,
        input_context=context, start_update=start, updates=UPDATES - start,
        serve=serve_of and serve_of(pipeline_id))
    rows = []
    for update, (features, _) in enumerate(dataset, start):
      if each:
        each(update)
      rows.append(list(features['id'].numpy()))
    per_pipeline.append(rows)
  return [sum(step, []) for step in zip(*per_pipeline)]


def served_rows(files: List[str], order: DataOrder, offload,
                each: Optional[Callable[[int], None]] = None
               ) -> List[List[int]]:
  """`update_rows` of one pipeline served by `offload`, which is closed
  after (its cells stopped, whatever the reading raised)."""
  try:
    return update_rows(files, order, serve_of=lambda _: offload.serve,
                       each=each)
  finally:
    offload.close()
