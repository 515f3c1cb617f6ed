"""The split every offload test serves, and the rows its local reader
reads (tests/support/partition_rows.py)."""

import pytest

from tests.support import partition_rows


@pytest.fixture(scope='module')
def shards(tmp_path_factory):
  return partition_rows.write_split(str(tmp_path_factory.mktemp('data')))


@pytest.fixture(scope='module')
def local_rows(shards):
  return partition_rows.update_rows(*shards)
