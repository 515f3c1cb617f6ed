"""Shared fixtures: a small real slice of the taxi data, tf-keras everywhere."""

import os

# Must be set before TensorFlow is imported anywhere in the test process.
os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')

import pytest  # pylint: disable=g-import-not-at-top

from pipelines import data  # pylint: disable=g-import-not-at-top

SAMPLE_ROWS = 2000


@pytest.fixture(scope='session')
def taxi_sample_dir(tmp_path_factory) -> str:
  """The first SAMPLE_ROWS rows of the taxi CSV shipped with tfx."""
  return data.write_sample(data.default_data_root(),
                           str(tmp_path_factory.mktemp('taxi_sample')),
                           SAMPLE_ROWS)
