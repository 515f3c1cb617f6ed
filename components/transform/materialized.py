"""The stock Transform's materialized write: its files per split, what it
counted, the shard indexes written after it, and which output a failed write
could not use.

A split gets `num_output_shards` files, more where one would exceed
`max_shard_mb` of its raw examples (`decisions.shard_count`), so that a shard
stays a small part of an epoch at any size.
"""

import os
from typing import Dict, List, Optional

from absl import logging
import apache_beam as beam
import tensorflow as tf
from tfx import types
from tfx.types import artifact_utils
from tfx.utils import io_utils

from components import storage
from components import write_errors
from components.data import shard_index
from components.patches import transform as transform_patches
from components.transform import decisions
from components.transform.config import TuningConfig


def shards_by_split(examples: List[types.Artifact],
                    tuning: TuningConfig) -> Dict[str, int]:
  """Files to write per split of the raw `examples`."""
  shards = {split: decisions.shard_count(size, tuning.num_output_shards,
                                         tuning.max_shard_mb)
            for split, size in raw_bytes_by_split(examples).items()}
  if any(count != tuning.num_output_shards for count in shards.values()):
    logging.info('OptimizedTransform: shards per split, at most %g MB of raw '
                 'examples each: %s', tuning.max_shard_mb, shards)
  return shards


def raw_bytes_by_split(examples: List[types.Artifact]) -> Dict[str, int]:
  """Each split's raw example bytes over the artifacts (file sizes only)."""
  sizes: Dict[str, int] = {}
  for artifact in examples:
    for split in artifact_utils.decode_split_names(artifact.split_names):
      uri = artifact_utils.get_split_uri([artifact], split)
      sizes[split] = sizes.get(split, 0) + sum(
          tf.io.gfile.stat(path).length
          for path in tf.io.gfile.glob(io_utils.all_files_pattern(uri)))
  return sizes


def write_shard_indexes(transformed: List[types.Artifact]) -> None:
  """Each materialized split's shard index, beside its `Split-*` folder
  (the trainer checks its data against it instead of counting)."""
  for artifact in transformed:
    for split in artifact_utils.decode_split_names(artifact.split_names):
      folder = artifact_utils.get_split_uri([artifact], split)
      # Gzipped TFRecords, as the Transform writes tf.Examples; not
      # materialized, or in another format: nothing to index.
      files = tf.io.gfile.glob(os.path.join(folder, '*.gz'))
      if files:
        shard_index.write(
            shard_index.build(folder, files, 'GZIP'),
            shard_index.artifact_index_path(folder))


def raise_if_a_location_failed(error: BaseException,
                                outputs: Dict[str, List[types.Artifact]]
                               ) -> None:
  """A stock write that failed for a full or read-only location, named: the
  output the error mentions, else the local one with the least free space
  (Beam's errors name no path), else all of them."""
  problem = write_errors.location_problem(error)
  if problem is None:
    return
  number, what = problem
  text = str(error)
  named = [(key, artifact.uri) for key, artifacts in sorted(outputs.items())
           for artifact in artifacts]
  found = [(k, u) for k, u in named if u in text]
  if not found:
    local = [(storage.free_bytes(u), k, u) for k, u in named
             if storage.is_local(u)]
    found = [min(local)[1:]] if local else []
  where = (f'The {found[0][0]} output location {found[0][1]}' if found else
           f'One of the output locations {[u for _, u in named]}')
  first_line = next((line for line in text.splitlines() if line.strip()),
                    type(error).__name__)
  raise storage.ExplainedOSError(
      number, f'{where} {what} ({first_line}). Free space there (or make it '
      'writable) and rerun; the inputs and other runs\' outputs are '
      'untouched, and nothing is retried.') from error


def examples_written(pipelines) -> Dict[str, int]:
  """Output path -> examples written, from the sharded write's Beam counters
  in `pipelines` (the stock executor's; where the runner reports any)."""
  counts = {}
  for pipeline in pipelines:
    result = getattr(pipeline, 'result', None)
    if result is None:
      continue
    try:
      counters = result.metrics().query(
          beam.metrics.MetricsFilter().with_namespace(
              transform_patches.METRICS_NAMESPACE))['counters']
    except Exception as e:  # pylint: disable=broad-except
      logging.info('No Beam metrics from this runner: %s', e)
      continue
    for counter in counters:
      name = counter.key.metric.name
      if name.startswith(transform_patches.EXAMPLES_COUNTER):
        value = counter.committed
        if value is None:
          value = counter.attempted
        counts[name[len(transform_patches.EXAMPLES_COUNTER):]] = int(
            value or 0)
  return counts


def split_count(counts: Dict[str, int], transformed: List[types.Artifact],
                 split: str) -> Optional[int]:
  """Examples written into `split`'s folders, None if any is not counted."""
  total = 0
  for uri in artifact_utils.get_split_uris(transformed, split):
    matches = [n for path, n in counts.items()
               if os.path.dirname(path.rstrip('/')) == uri.rstrip('/')]
    if not matches:
      return None
    total += sum(matches)
  return total
