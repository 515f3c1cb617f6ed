"""The shard index: each data file of a split, its record count and size,
written once.

OptimizedTransform writes it beside the examples it materializes
(`<artifact>/shard_index-<split>.json`, outside the `Split-*` folders that
readers glob); for examples it did not write, the trainer builds it once
(the files counted in parallel) and keeps it beside its checkpoints. Shards
are named relative to their split folder, so the index travels with a copied
artifact. Before training, `check` compares the files with it: a shard whose
size changed (cut short by an interrupted copy, rewritten) or that is gone
fails at once, naming it; no restart counts records again.
"""

import concurrent.futures
import dataclasses
import errno
import os
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from components.data import input_pipeline
from components.data import shard_check
from components import storage

FORMAT_VERSION = 1
INDEX_NAME = 'shard_index-{split}.json'
# Files counted at once: reading is I/O and decompression in TF's threads.
_COUNTING_THREADS = 8
# The source of an index OptimizedTransform wrote (its counts are the
# files' as written).
WRITTEN_WITH_THE_EXAMPLES = 'written with the examples'


class ShardChangedError(ValueError):
  """A data file differs from what the shard index recorded of it."""


class ShardMissingError(storage.ExplainedOSError):
  """An indexed data file is gone."""

  def __init__(self, message: str):
    super().__init__(errno.ENOENT, message)


@dataclasses.dataclass(frozen=True)
class Shard:
  name: str  # Relative to the split folder.
  records: int
  bytes: int


@dataclasses.dataclass(frozen=True)
class ShardIndex:
  """The shards of one split, in name order."""
  folder: str
  compression: str
  shards: Tuple[Shard, ...]

  @property
  def records(self) -> int:
    return sum(s.records for s in self.shards)

  def records_by_path(self) -> Dict[str, int]:
    return {os.path.join(self.folder, s.name): s.records for s in self.shards}

  def to_dict(self) -> Dict[str, object]:
    return {'format_version': FORMAT_VERSION, 'compression': self.compression,
            'shards': [dataclasses.asdict(s) for s in self.shards]}

  @classmethod
  def from_dict(cls, folder: str, values: Dict[str, object],
                path: str) -> 'ShardIndex':
    if values.get('format_version') != FORMAT_VERSION:
      raise ValueError(f'{path} has format_version '
                       f'{values.get("format_version")!r}; this version of '
                       f'tfx-hpm reads version {FORMAT_VERSION}.')
    return cls(folder, values['compression'],
               tuple(Shard(**s) for s in values['shards']))


def split_folder(file_patterns: Sequence[str]) -> Optional[str]:
  """The one folder the patterns glob (e.g. `<artifact>/Split-train`), or
  None when they span several or are not `<folder>/<glob>`."""
  folders = {os.path.dirname(p) for p in file_patterns}
  if len(folders) != 1:
    return None
  folder = folders.pop()
  return None if any(c in folder for c in '*?[') else folder


def artifact_index_path(folder: str) -> Optional[str]:
  """Where OptimizedTransform writes the index of a `Split-<name>` folder."""
  split = input_pipeline.split_name(folder)
  return None if split is None else os.path.join(
      os.path.dirname(folder.rstrip('/')), INDEX_NAME.format(split=split))


def build(folder: str, files: Sequence[str], compression: str,
          known: Optional[Dict[str, int]] = None) -> ShardIndex:
  """Counts the records of `files` (all in `folder`), in parallel, unless
  `known` has their counts already; a file that does not read to its end
  (a gzip file cut where a record ends included) fails the count."""
  files = sorted(files)
  if known and all(f in known for f in files):
    counts = [known[f] for f in files]
  else:
    with concurrent.futures.ThreadPoolExecutor(_COUNTING_THREADS) as pool:
      counts = list(pool.map(
          lambda f: shard_check.count_whole(f, compression), files))
  return ShardIndex(folder, compression, tuple(
      Shard(os.path.relpath(path, folder), records,
            tf.io.gfile.stat(path).length)
      for path, records in zip(files, counts)))


def write(index: ShardIndex, path: str) -> None:
  storage.write_json(path, index.to_dict())


def read(folder: str, path: str) -> Optional[ShardIndex]:
  values = storage.read_json(path)
  return None if values is None else ShardIndex.from_dict(folder, values,
                                                          path)


def check(index: ShardIndex, files: Sequence[str], index_path: str) -> None:
  """Raises unless `files` are exactly the indexed shards, each of its size.

  Raises:
    ShardMissingError: an indexed shard is gone.
    ShardChangedError: a shard's size differs, or a file is not indexed.
  """
  present = {os.path.relpath(f, index.folder): f for f in files}
  for shard in index.shards:
    path = os.path.join(index.folder, shard.name)
    if shard.name not in present:
      raise ShardMissingError(
          f'The data file {path} is gone: the shard index {index_path} '
          f'lists it with {shard.records} records.')
    size = tf.io.gfile.stat(path).length
    if size != shard.bytes:
      raise ShardChangedError(
          f'The data file {path} has {size:,} bytes; the shard index '
          f'{index_path} recorded {shard.bytes:,} when it was written: the '
          'file was cut short (e.g. an interrupted copy) or rewritten.')
  extra = sorted(set(present) - {s.name for s in index.shards})
  if extra:
    raise ShardChangedError(
        f'The data file {present[extra[0]]} is not in the shard index '
        f'{index_path} ({len(extra)} such file(s)): files were added after '
        'it was written.')


def ensure(file_patterns: Sequence[str], files: List[str], compression: str,
           own_dir: str, build_missing: bool = True,
           counts: Optional[Dict[str, int]] = None
           ) -> Tuple[Optional[ShardIndex], str]:
  """The checked index of the split `file_patterns` glob, and where it came
  from: the artifact's (OptimizedTransform wrote it), one this training
  built before (in `own_dir`), or one built now and kept there (unless not
  `build_missing`; from `counts` where they are known). (None, why) when
  the patterns are not one split folder or there is none to read."""
  folder = split_folder(file_patterns)
  if folder is None:
    return None, 'the file patterns are not one folder'
  artifact_path = artifact_index_path(folder)
  own_path = os.path.join(own_dir, INDEX_NAME.format(
      split=input_pipeline.split_name(folder) or os.path.basename(folder)))
  for source, path in ((WRITTEN_WITH_THE_EXAMPLES, artifact_path),
                       ('built by an earlier attempt', own_path)):
    index = read(folder, path) if path else None
    if index is not None:
      check(index, files, path)
      return index, f'{source} ({path})'
  if not build_missing:
    return None, 'no index to read'
  index = build(folder, files, compression, counts)
  write(index, own_path)
  return index, f'built now ({own_path})'
