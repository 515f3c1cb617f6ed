"""The shard index: counted once, checked at every start, never counted
again (fast; real files)."""

import os
import shutil

import pytest

from components.data import shard_index
from tests.support import gzip_cuts
from components.testing import trainer_testing as tt


@pytest.fixture
def split(tmp_path):
  """Three shards of the id dataset in a `Split-train` folder."""
  data = tt.write_id_dataset(str(tmp_path / 'examples' / 'Split-train'), 30,
                             num_files=3)
  folder = os.path.dirname(data['pattern'])
  files = sorted(shard_index.tf.io.gfile.glob(data['pattern']))
  return folder, files, data['pattern']


def test_counts_each_shard_and_reads_back(tmp_path, split):
  folder, files, _ = split
  index = shard_index.build(folder, files, 'GZIP')
  assert [s.name for s in index.shards] == [os.path.basename(f)
                                            for f in files]
  assert [s.records for s in index.shards] == [10, 10, 10]
  assert [s.bytes for s in index.shards] == [os.path.getsize(f)
                                             for f in files]
  path = shard_index.artifact_index_path(folder)
  assert path == str(tmp_path / 'examples' / 'shard_index-train.json')
  shard_index.write(index, path)
  assert shard_index.read(folder, path) == index


def test_the_index_travels_with_a_copied_artifact(tmp_path, split):
  folder, files, _ = split
  shard_index.write(shard_index.build(folder, files, 'GZIP'),
                    shard_index.artifact_index_path(folder))
  copy = tmp_path / 'copy'
  shutil.copytree(tmp_path / 'examples', copy)
  copied_folder = str(copy / 'Split-train')
  copied = shard_index.read(copied_folder,
                            shard_index.artifact_index_path(copied_folder))
  shard_index.check(copied, sorted(str(p) for p in (
      copy / 'Split-train').glob('*.gz')), 'the copy')


def test_a_changed_missing_or_added_shard_fails_naming_it(tmp_path, split):
  folder, files, _ = split
  index = shard_index.build(folder, files, 'GZIP')
  size = os.path.getsize(files[1])
  with open(files[1], 'rb') as f:
    good = f.read()
  with open(files[1], 'r+b') as f:
    f.truncate(size // 2)
  with pytest.raises(shard_index.ShardChangedError,
                     match=f'The data file {files[1]} has {size // 2:,} '
                     f'bytes; the shard index idx recorded {size:,}'):
    shard_index.check(index, files, 'idx')
  with open(files[1], 'wb') as f:
    f.write(good)
  with pytest.raises(shard_index.ShardMissingError,
                     match=f'The data file {files[2]} is gone: the shard '
                     'index idx lists it with 10 records'):
    shard_index.check(index, files[:1] + files[1:2], 'idx')
  index = shard_index.build(folder, files[:2], 'GZIP')
  with pytest.raises(shard_index.ShardChangedError,
                     match=f'{files[2]} is not in the shard index idx'):
    shard_index.check(index, files, 'idx')


def test_built_once_then_only_checked(tmp_path, split, monkeypatch):
  folder, files, pattern = split
  own = str(tmp_path / 'checkpoints')
  index, source = shard_index.ensure([pattern], files, 'GZIP', own)
  assert index.records == 30 and source.startswith('built now (')
  assert os.path.exists(os.path.join(own, 'shard_index-train.json'))

  def no_counting(*_):
    raise AssertionError('counted again')
  monkeypatch.setattr(shard_index.input_pipeline, 'count_records',
                      no_counting)
  again, source = shard_index.ensure([pattern], files, 'GZIP', own)
  assert again == index and source.startswith('built by an earlier attempt')
  # The artifact's own index comes first.
  shard_index.write(index, shard_index.artifact_index_path(folder))
  _, source = shard_index.ensure([pattern], files, 'GZIP', own)
  assert source.startswith('written with the examples')
  # Not one split folder: nothing to index.
  assert shard_index.ensure([pattern, '/other/*'], files, 'GZIP', own) == (
      None, 'the file patterns are not one folder')


def test_a_gzip_shard_cut_where_a_record_ends_is_not_indexed(tmp_path):
  """TF reads such a file without an error, only fewer records: the count
  checks the gzip trailer's size against the records read, and fails naming
  the file instead of indexing it short."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / 'part.gz')
  gzip_cuts.write_records(path)
  assert shard_index.build(str(tmp_path), [path], 'GZIP').records == 32
  silent_cuts = 0
  for _ in gzip_cuts.silent_cuts(path):
    silent_cuts += 1  # In the trailer, or where a record ends.
    with pytest.raises(tf.errors.DataLossError,
                       match=f'{path}: the gzip stream ends before'):
      shard_index.build(str(tmp_path), [path], 'GZIP')
    if silent_cuts == 12:
      break
  assert silent_cuts
