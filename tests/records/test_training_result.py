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
  assert (result['steps'], result['mode'], result['strategy']) == (
      3, 'run_fn', 'one_device')
  assert result['timing'] == {'worker_imports_s': 2.0, 'worker_setup_s': 0.1}
  assert training_result.read(str(tmp_path / 'none')) is None


def test_the_loop_report_is_in_the_file_beside_the_process_facts(tmp_path):
  result = _result(mode='managed', loop=_loop_report())
  assert not result.preempted
  training_result.write(str(tmp_path), result)
  written = training_result.read(str(tmp_path))
  assert written['examples_per_sec'] == 40.0
  assert written['train_loss'] == 0.5 and written['eval'] == {'loss': 0.25}
  assert written['strategy'] == 'one_device'
  assert written['timing'] == {'worker_imports_s': 2.0, 'worker_setup_s': 0.1,
                               'train_s': 1.0, 'first_call_s': 0.2}
  # 'auto''s measurements only where steps_per_execution was 'auto'.
  assert 'steps_per_execution_auto' not in written
  assert 'loop' not in written
  auto = _loop_report(steps_per_execution_auto=[])
  assert auto.to_dict()['steps_per_execution_auto'] == []
  assert _result(loop=_loop_report(preempted=True)).preempted


def test_a_result_without_a_version_is_version_1(tmp_path):
  """What the trainer wrote before the version was recorded."""
  (tmp_path / training_result.FILE_NAME).write_text('{"steps": 3}')
  assert training_result.read(str(tmp_path)) == {'steps': 3}


@pytest.mark.parametrize('content, found', [
    ({'steps': 3, 'format_version': 2}, 'format_version=2'),
    ([1, 2], 'format_version=None'),
])
def test_another_format_is_a_clear_error(tmp_path, content, found):
  (tmp_path / training_result.FILE_NAME).write_text(json.dumps(content))
  with pytest.raises(training_result.FormatError) as error:
    training_result.read(str(tmp_path))
  assert found in str(error.value) and 'format version 1' in str(error.value)


def test_the_newest_published_rate_is_read_and_a_result_without_one_keeps_it(
    tmp_path):
  root = str(tmp_path)
  assert training_result.newest_steady_rate(root) is None
  training_result.publish_steady_rate(
      root, {'examples_per_sec': 100.0, 'global_batch_size': 32}, 'run/1')
  # run_fn mode: no steady rate of the managed loop.
  training_result.publish_steady_rate(root, {'mode': 'run_fn'}, 'run/2')
  assert training_result.newest_steady_rate(root) == (
      training_result.SteadyRate(100.0, 32, 'run/1'))
  training_result.publish_steady_rate(
      root, {'examples_per_sec': 50.0, 'global_batch_size': 64,
             'num_replicas': 2}, 'run/3')
  assert training_result.newest_steady_rate(root) == (
      training_result.SteadyRate(50.0, 32, 'run/3'))
