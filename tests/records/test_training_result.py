"""training_result.json: one writer, one reader that checks the version."""

import dataclasses
import json

import numpy as np
import pytest

from components.records import training_result


def _result(**changes) -> training_result.TrainingResult:
  """A run_fn training's result, with `changes`."""
  return dataclasses.replace(training_result.TrainingResult(
      mode='run_fn', strategy='one_device', steps=3, num_replicas=1,
      num_workers=1, per_replica_batch_size=4, global_batch_size=4,
      train_steps=3, eval_steps=2, seed=None, deterministic=False,
      intra_op_threads={'threads': 0}, train_wall_s=1.5,
      worker_imports_s=2.0, worker_setup_s=0.1), **changes)


def _loop_report(**changes) -> training_result.LoopReport:
  summary = {'steps': 3, 'start_step': 0, 'steps_this_attempt': 3,
             'train_loss': np.float32(0.5), 'first_step_s': 0.2,
             'first_step_time': 1e9, 'steps_per_sec': 10.0,
             'rate_includes_first_step': False,
             'steps_by_call_length': {'1': 3}, 'preempted': False}
  return dataclasses.replace(training_result.LoopReport.of_steps(
      summary, {'steps_per_execution': 1}, examples_per_step=4,
      timing={'train_s': 1.0}, gradient_accumulation_steps=1,
      precision={'policy': 'float32'}, xla={'enabled': False},
      eval={'loss': 0.25}, exported=True, serving_model_dir='model',
      checkpoint_dir='checkpoints', checkpoints_saved=1, checkpoint_s=0.01,
      resume_events=[], warm_start=None, shard_index={}, data_order=None,
      input_pipeline={'read_ahead_shards': 1}, cache_fallback=None,
      unreadable_records=[], pipeline_parallel=None, offload=None,
      wall_s=2.0), **changes)


def test_written_with_its_version_and_read_back(tmp_path):
  training_result.write(str(tmp_path), _result())
  with open(tmp_path / training_result.FILE_NAME) as f:
    assert json.load(f)[training_result.VERSION_KEY] == (
        training_result.FORMAT_VERSION)
  result = training_result.read(str(tmp_path))
  assert result == _result()
  assert result.timing == {'worker_imports_s': 2.0, 'worker_setup_s': 0.1}
  assert result.loop is None and result.resume_events == []
  assert training_result.read(str(tmp_path / 'none')) is None


def test_the_loop_report_is_in_the_file_beside_the_process_facts(tmp_path):
  result = _result(mode='managed', loop=_loop_report())
  assert not result.preempted
  training_result.write(str(tmp_path), result)
  with open(tmp_path / training_result.FILE_NAME) as f:
    keys = json.load(f)
  # One flat object: the loop's keys beside the process's.
  assert keys['examples_per_sec'] == 40.0 and keys['strategy'] == 'one_device'
  assert 'loop' not in keys
  # 'auto''s measurements only where steps_per_execution was 'auto'.
  assert 'steps_per_execution_auto' not in keys
  written = training_result.read(str(tmp_path))
  assert written.loop.train_loss == 0.5 and written.loop.eval == {
      'loss': 0.25}
  assert written.timing == {'worker_imports_s': 2.0, 'worker_setup_s': 0.1,
                            'train_s': 1.0, 'first_call_s': 0.2}
  assert written.to_dict() == result.to_dict()
  auto = _loop_report(steps_per_execution_auto=[])
  assert auto.to_dict()['steps_per_execution_auto'] == []
  assert _result(loop=_loop_report(preempted=True)).preempted


def test_the_fields_marked_for_mlmd_are_its_properties():
  """Ints and finite floats as they are, JSON values where not empty, the
  mode under its property's name; a NaN loss (no step run) is left out."""
  properties = dict(_result(mode='managed', loop=_loop_report(
      train_loss=float('nan'), warm_start={'weights': 2},
      steps_per_execution_auto=[])).mlmd_properties())
  assert properties == {
      'training_mode': 'managed', 'num_replicas': 1, 'num_workers': 1,
      'global_batch_size': 4, 'train_steps': 3, 'train_wall_s': 1.5,
      'intra_op_threads': '{"threads": 0}', 'examples_per_sec': 40.0,
      'steps_per_execution': 1, 'steps_by_call_length': '{"1": 3}',
      'precision': '{"policy": "float32"}', 'xla': '{"enabled": false}',
      'warm_start': '{"weights": 2}'}
  assert dict(_result().mlmd_properties())['training_mode'] == 'run_fn'


def test_a_result_without_a_version_is_version_1(tmp_path):
  """What the trainer wrote before the version was recorded."""
  keys = _result().to_dict()
  (tmp_path / training_result.FILE_NAME).write_text(json.dumps(keys))
  assert training_result.read(str(tmp_path)) == _result()


@pytest.mark.parametrize('content, found', [
    ({'steps': 3, 'format_version': 2}, 'format_version=2'),
    ([1, 2], 'format_version=None'),
    ({'steps': 3}, "without ['mode', 'strategy'"),
    ({**_result().to_dict(), 'launch': {}}, "with keys ['launch']"),
])
def test_another_format_is_a_clear_error(tmp_path, content, found):
  (tmp_path / training_result.FILE_NAME).write_text(json.dumps(content))
  with pytest.raises(training_result.FormatError) as error:
    training_result.read(str(tmp_path))
  assert found in str(error.value) and 'format version 1' in str(error.value)


def test_a_managed_trainings_rate_is_published_and_read_back(tmp_path):
  root = str(tmp_path)
  assert training_result.newest_steady_rate(root) is None
  # run_fn mode: no steady rate of the managed loop.
  assert training_result.steady_rate(_result(), 'run/1') is None
  two_replicas = _result(mode='managed', num_replicas=2,
                         loop=_loop_report(examples_per_sec=50.0,
                                           examples_per_step=64))
  rate = training_result.steady_rate(two_replicas, 'run/2')
  # Each replica's reader reads half of an update's examples.
  assert rate == training_result.SteadyRate(50.0, 32, 'run/2')
  training_result.publish_steady_rate(root, rate)
  assert training_result.newest_steady_rate(root) == rate
  newer = training_result.SteadyRate(70.0, 16, 'run/3')
  training_result.publish_steady_rate(root, newer)
  assert training_result.newest_steady_rate(root) == newer
