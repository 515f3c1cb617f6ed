"""The trainer's own check of a memory cache against its machine (small
synthetic shards)."""

import os

from components.data import input_pipeline
from components.data.config import InputPipelineConfig
from components.trainer.common import split_source
from components.trainer.managed import datasets
from components.testing import trainer_testing as tt
from tests.support import transform_data


def _data(tmp_path, **config):
  patterns = transform_data.write_split(str(tmp_path), 600, num_files=3)
  files = input_pipeline.list_files(patterns)
  check = datasets.DataCheck(train_records={f: 200 for f in files})
  data = datasets.TrainingData(
      feature_spec=transform_data.FEATURE_SPEC, label_key='label',
      raw_label_key=None, config=InputPipelineConfig(**config),
      tf_transform_output=None)
  return data, check


def test_a_memory_cache_that_does_not_fit_the_trainer_falls_back(tmp_path):
  """Measured from the parsed rows of the real split and this process's
  share of it: over the budget, the cache goes to disk (with a cache_dir)
  or none, saying why; within it, it stays."""
  data, check = _data(tmp_path, cache='memory')
  kept, why = datasets.fit_cache(data, check, 1.0, budget_bytes=2**30)
  assert kept.config.cache == 'memory' and why is None
  fallen, why = datasets.fit_cache(data, check, 0.5, budget_bytes=4096)
  assert fallen.config.cache == 'none'
  assert "cache='memory' would hold 300 rows" in why
  assert "cache='none' instead" in why
  on_disk, _ = datasets.fit_cache(
      _data(tmp_path / 'd', cache='memory',
            cache_dir=os.path.join(tmp_path, 'c'))[0], check, 1.0,
      budget_bytes=4096)
  assert on_disk.config.cache == 'disk'
  # Without a memory cache nothing is measured or changed.
  plain, why = datasets.fit_cache(_data(tmp_path / 'p')[0], check, 1.0, 1)
  assert plain.config.cache == 'none' and why is None


def test_on_the_fly_the_raw_examples_read_are_indexed(tmp_path):
  """The data order is over the files the pipeline reads: on the fly, the
  raw examples of the split, indexed once beside the checkpoints."""
  transformed = transform_data.write_split(str(tmp_path / 't'), 60, 2)
  raw = transform_data.write_split(str(tmp_path / 'raw'), 90, 3)
  data, _ = _data(tmp_path / 'unused', transform_placement='on_the_fly',
                  transform_graph_uri='/graph',
                  raw_file_patterns={'train': raw, 'eval': raw})
  task = tt.make_task(str(tmp_path / 'run'), {
      'pattern': transformed[0], 'schema_path': None})
  found = datasets.check_data(task, data, True, lambda _: True)
  raw_files = input_pipeline.list_files(raw)
  assert sorted(found.train_records) == raw_files
  assert sum(found.train_records.values()) == 90
  assert found.indexes['train']['source'].startswith('built now')
  # Apart from an index of the transformed examples of the same split.
  assert os.listdir(task.checkpoint_dir) == [split_source.RAW_INDEX_DIR]
  assert os.path.exists(os.path.join(
      task.checkpoint_dir, split_source.RAW_INDEX_DIR,
      'shard_index-train.json'))
