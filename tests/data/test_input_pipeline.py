"""build_dataset on small synthetic TFRecords (fast).

The shard count of the materialized examples is tested with the Beam write
that makes it (tests/transform/test_executor.py).
"""

import collections
import dataclasses
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf

from components.data import input_pipeline
from components.data.input_pipeline import InputPipelineConfig
from tests.support import transform_data

NUM_EXAMPLES = 1000
BATCH = 32


@pytest.fixture(scope='module')
def train_patterns(tmp_path_factory):
  return transform_data.write_split(str(tmp_path_factory.mktemp('data')),
                                    NUM_EXAMPLES, num_files=5)


def _ids(dataset, limit=None):
  """Per-batch lists of ids of a (features, label) dataset."""
  return [list(features['id'].numpy())
          for features, _ in dataset.take(limit or -1)]


def _raised(call):
  """What `call()` raised, or None."""
  try:
    call()
  except Exception as e:  # pylint: disable=broad-except
    return e
  return None


def _flat(batches):
  return [i for batch in batches for i in batch]


@pytest.mark.parametrize('changes', [
    {},
    {'read_ahead_shards': 3},
    {'cache': 'memory'},
    {'shuffle_buffer_batches': 4, 'shuffle_window_batches': 0},
    {'read_ahead_shards': 2, 'parse_parallel_calls': 1,
     'prefetch_batches': 2},
])
def test_one_epoch_yields_every_example_once(train_patterns, changes):
  config = dataclasses.replace(InputPipelineConfig(), **changes)
  dataset = input_pipeline.build_dataset(
      train_patterns, transform_data.FEATURE_SPEC, 'label', BATCH, config,
      num_epochs=1, drop_remainder=False)
  assert sorted(_flat(_ids(dataset))) == list(range(NUM_EXAMPLES))


def test_disk_cache_then_later_epochs_from_it(train_patterns, tmp_path):
  config = InputPipelineConfig(cache='disk', cache_dir=str(tmp_path / 'c'))
  dataset = input_pipeline.build_dataset(
      train_patterns, transform_data.FEATURE_SPEC, 'label', BATCH, config,
      num_epochs=2, drop_remainder=False)
  counts = collections.Counter(_flat(_ids(dataset)))
  assert counts == {i: 2 for i in range(NUM_EXAMPLES)}
  assert os.listdir(tmp_path / 'c')  # The cache files were written.


_KILLED_WHILE_CACHING = """
import os, signal, sys
from components.data import input_pipeline
from tests.support import transform_data
dataset = input_pipeline.build_dataset(
    [sys.argv[1]], transform_data.DENSE_SPEC, 'label', 1024,
    input_pipeline.InputPipelineConfig(cache='disk', cache_dir=sys.argv[2]))
iterator = iter(dataset)  # Alive at the kill, as in a preempted trainer.
next(iterator)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_disk_cache_survives_a_killed_run(tmp_path):
  """A run killed mid-cache (preemption) must not block the next one."""
  # Large enough that the cache is still being written at the kill.
  num_examples = 50_000
  patterns = transform_data.write_split(str(tmp_path), num_examples, 5)
  cache_dir = str(tmp_path / 'c')
  killed = subprocess.run(
      [sys.executable, '-c', _KILLED_WHILE_CACHING, patterns[0], cache_dir],
      cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
      capture_output=True, text=True, timeout=120)
  assert killed.returncode == -9, killed.stderr[-2000:]
  assert any(name.endswith('.lockfile') for name in os.listdir(cache_dir))
  config = InputPipelineConfig(cache='disk', cache_dir=cache_dir)
  dataset = input_pipeline.build_dataset(
      patterns, transform_data.DENSE_SPEC, 'label', 1024, config,
      num_epochs=2, drop_remainder=False)
  counts = collections.Counter(_flat(_ids(dataset)))
  assert counts == {i: 2 for i in range(num_examples)}
  assert any(name.endswith('.index') for name in os.listdir(cache_dir))


def test_rows_stay_consistent_through_shuffling(train_patterns):
  """Every feature of a row (dense and sparse) still belongs to its id."""
  dataset = input_pipeline.build_dataset(
      train_patterns, transform_data.FEATURE_SPEC, 'label', BATCH,
      InputPipelineConfig(shuffle_window_batches=4), num_epochs=1)
  for features, label in dataset:
    ids = features['id'].numpy()
    np.testing.assert_allclose(features['x'].numpy(), ids / 2)
    np.testing.assert_array_equal(label.numpy(), ids % 2)
    tags = tf.sparse.to_dense(features['tags'], default_value=-1).numpy()
    for row, i in zip(tags, ids):
      assert list(row[row >= 0]) == [i] * (i % 3)


@pytest.mark.parametrize('changes', [{}, {'cache': 'memory'},
                                     {'shuffle_buffer_batches': 8}])
def test_deterministic_and_skip_resumes_exactly(train_patterns, changes):
  config = dataclasses.replace(InputPipelineConfig(), **changes)

  def batches(skip):
    return _ids(input_pipeline.build_dataset(
        train_patterns, transform_data.FEATURE_SPEC, 'label', BATCH, config,
        seed=7, skip_batches=skip), limit=80 - skip)

  uninterrupted = batches(0)
  assert uninterrupted == batches(0)
  assert batches(45) == uninterrupted[45:]  # Crosses the first epoch's end.
  # Shuffled: not the file order.
  assert _flat(uninterrupted[:3]) != sorted(_flat(uninterrupted[:3]))
  assert all(len(b) == BATCH for b in uninterrupted)


@pytest.mark.parametrize('num_files,changes', [
    (5, {}), (5, {'cache': 'memory'}), (1, {}),
    (5, {'shuffle_window_batches': 0, 'read_ahead_shards': 4}),
])
def test_resume_many_epochs_in_is_exact(tmp_path, num_files, changes):
  """A position epochs deep, per input pipeline, with batches that straddle
  epoch ends (about 500 of the 1000 examples per pipeline, batches of 48)."""
  patterns = transform_data.write_split(str(tmp_path), NUM_EXAMPLES, num_files)
  config = dataclasses.replace(InputPipelineConfig(), **changes)
  batch = 48
  for pipeline_id in range(2):
    context = tf.distribute.InputContext(
        num_input_pipelines=2, input_pipeline_id=pipeline_id,
        num_replicas_in_sync=2)

    def batches(skip, limit):
      return _ids(input_pipeline.build_dataset(
          patterns, transform_data.FEATURE_SPEC, 'label', 2 * batch, config,
          seed=3, input_context=context, skip_batches=skip), limit=limit)

    uninterrupted = batches(0, 130)  # Over 10 epochs.
    for skip in (10, 52, 125):  # Straddling the first epoch end; deep.
      assert batches(skip, 5) == uninterrupted[skip:skip + 5], skip
    rows = len(set(_flat(uninterrupted)))
    epochs = [_flat(uninterrupted)[i * rows:(i + 1) * rows] for i in range(3)]
    if config.shuffle_window_batches:  # Rows reshuffled each epoch.
      assert epochs[0] != epochs[1] != epochs[2]
    assert sorted(epochs[0]) == sorted(epochs[1]) == sorted(epochs[2])


def test_memory_cache_serves_the_later_epochs(tmp_path):
  """After its first pass the pipeline no longer reads the files."""
  patterns = transform_data.write_split(str(tmp_path), NUM_EXAMPLES, 3)
  dataset = iter(input_pipeline.build_dataset(
      patterns, transform_data.FEATURE_SPEC, 'label', BATCH,
      InputPipelineConfig(cache='memory', prefetch_batches=1), seed=5))
  for _ in range(NUM_EXAMPLES // BATCH + 1):  # Past the first epoch's end.
    next(dataset)
  for path in input_pipeline.list_files(patterns):
    os.remove(path)
  later = [next(dataset)[0]['id'].numpy() for _ in range(3 * NUM_EXAMPLES //
                                                         BATCH)]
  assert set(np.concatenate(later)) == set(range(NUM_EXAMPLES))


def test_other_seed_other_order(train_patterns):
  first, second = (
      _flat(_ids(input_pipeline.build_dataset(
          train_patterns, transform_data.FEATURE_SPEC, 'label', BATCH,
          seed=seed, num_epochs=1, drop_remainder=False))) for seed in (1, 2))
  assert first != second and sorted(first) == sorted(second)


@pytest.mark.parametrize('num_files,pipelines', [(5, 2), (1, 2), (1, 3)])
def test_input_pipelines_read_disjoint_shares(tmp_path, num_files, pipelines):
  """Files are sharded per worker, or batches when there are too few files;
  every pipeline gets a share (one file of NUM_EXAMPLES rows holds fewer
  default read batches than 3 pipelines: the third had none, and looped
  over empty epochs, a hang in the cluster's first step)."""
  patterns = transform_data.write_split(str(tmp_path), NUM_EXAMPLES, num_files)
  shares = []
  for pipeline_id in range(pipelines):
    context = tf.distribute.InputContext(
        num_input_pipelines=pipelines, input_pipeline_id=pipeline_id,
        num_replicas_in_sync=2 * pipelines)
    batches = _ids(input_pipeline.build_dataset(
        patterns, transform_data.FEATURE_SPEC, 'label', 2 * pipelines * BATCH,
        input_context=context, num_epochs=1, drop_remainder=False))
    assert batches and len(batches[0]) == BATCH  # Per replica.
    shares.append(set(_flat(batches)))
  assert sum(len(share) for share in shares) == NUM_EXAMPLES  # Disjoint.
  assert set().union(*shares) == set(range(NUM_EXAMPLES))


@pytest.mark.parametrize('num_examples,pipelines', [(0, 1), (20, 3)])
def test_a_pipeline_without_rows_fails_instead_of_looping(
    tmp_path, num_examples, pipelines):
  """An empty split, or a split too small for the last of 3 pipelines
  (batches of 16 rows sharded: 16, 4, none), names what it lacks instead
  of looping over empty epochs for ever; the others train on."""
  patterns = transform_data.write_split(str(tmp_path), num_examples, 1)

  def dataset(pipeline_id):
    context = tf.distribute.InputContext(
        num_input_pipelines=pipelines, input_pipeline_id=pipeline_id,
        num_replicas_in_sync=pipelines)
    return iter(input_pipeline.build_dataset(
        patterns, transform_data.FEATURE_SPEC, 'label', 16 * pipelines,
        input_context=context))

  for pipeline_id in range(pipelines - 1):  # Epochs of 16 and 4 rows.
    batches = dataset(pipeline_id)
    assert all(len(next(batches)[0]['id']) == 16 for _ in range(3))
  outcome = []
  # In a thread: the loop it replaces never returns.
  thread = threading.Thread(target=lambda: outcome.append(
      _raised(lambda: next(dataset(pipelines - 1)))), daemon=True)
  thread.start()
  thread.join(timeout=120)
  assert outcome, 'next() still running: empty epochs looping'
  assert isinstance(outcome[0], tf.errors.InvalidArgumentError), outcome
  assert (f'No examples in {patterns[0]} for input pipeline {pipelines - 1} of '
          f'{pipelines}') in outcome[0].message


def test_label_none_yields_features_only(train_patterns):
  features = next(iter(input_pipeline.build_dataset(
      train_patterns, transform_data.DENSE_SPEC, None, BATCH)))
  assert set(features) == {'id', 'x', 'label'}


def test_bad_configs_fail_with_clear_messages(train_patterns):
  with pytest.raises(ValueError, match=r"cache='ssd' is not one of"):
    InputPipelineConfig(cache='ssd').validate()
  with pytest.raises(ValueError, match='needs cache_dir'):
    InputPipelineConfig(cache='disk').validate()
  with pytest.raises(ValueError, match='transform_placement=.*not one of'):
    InputPipelineConfig(transform_placement='gpu').validate()
  with pytest.raises(ValueError, match='needs transform_graph_uri'):
    InputPipelineConfig(transform_placement='on_the_fly').validate()
  with pytest.raises(ValueError, match=r'Unknown input pipeline option'):
    InputPipelineConfig.from_dict({'cache_mode': 'memory'})
  with pytest.raises(ValueError, match='No files match'):
    input_pipeline.build_dataset(['/nonexistent/*'], {}, None, 2)
  on_the_fly = InputPipelineConfig(
      transform_placement='on_the_fly', transform_graph_uri='/graph',
      raw_file_patterns={'train': ['/raw/Split-train/*']})
  with pytest.raises(ValueError, match="has no raw examples.*'train'"):
    input_pipeline.build_dataset(['/t/Split-eval/*'], {}, None, 2, on_the_fly)


def test_split_of_reads_tfx_split_folders():
  assert input_pipeline.split_of(['/a/5/Split-eval/*']) == 'eval'
  with pytest.raises(ValueError, match='Cannot tell the split'):
    input_pipeline.split_of(['/a/Split-eval/*', '/a/Split-train/*'])
  with pytest.raises(ValueError, match='Cannot tell the split'):
    input_pipeline.split_of(['/a/data/*'])


def test_config_json_round_trip():
  config = InputPipelineConfig(cache='memory', read_ahead_shards=3,
                               deterministic=False)
  assert InputPipelineConfig.from_json(config.to_json()) == config
  assert InputPipelineConfig.from_json('') == InputPipelineConfig()
  # The config module spells AUTOTUNE without importing TensorFlow.
  assert input_pipeline.AUTOTUNE == tf.data.AUTOTUNE


@pytest.mark.parametrize('old', ['interleave_cycle_length',
                                 'interleave_parallelism', 'batch_in_reader'])
def test_retired_reader_knobs_fail_naming_their_place_now(old):
  with pytest.raises(ValueError, match=f"'{old}' is now 'read_"):
    InputPipelineConfig.from_dict({old: 4})
  with pytest.raises(ValueError, match='read_ahead_shards=0 must be >= 1'):
    InputPipelineConfig.from_dict({'read_ahead_shards': 0})
