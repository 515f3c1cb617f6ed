"""Strategy selection (`auto` rules) and construction."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

from components.trainer.config import DistributionConfig
from components.trainer.process import context
from components.trainer.strategies import choice as strategy_lib
from components.trainer.strategies.choice import Environment
from components.trainer.strategies import registry


def _cluster(**tasks):
  return {'cluster': {k: [f'host{i}:{2222 + i}' for i in range(n)]
                      for k, n in tasks.items()},
          'task': {'type': 'worker', 'index': 0}}


@pytest.mark.parametrize('config,env,expected', [
    ({}, Environment(), 'one_device'),
    ({}, Environment(num_gpus=1), 'one_device'),
    ({}, Environment(num_gpus=4), 'mirrored'),
    ({'logical_cpu_devices': 2}, Environment(), 'mirrored'),
    ({'logical_cpu_devices': 2}, Environment(num_gpus=1), 'one_device'),
    ({'num_workers': 2}, Environment(num_gpus=4), 'multi_worker_mirrored'),
    ({'num_workers': 2, 'num_ps': 1}, Environment(), 'parameter_server'),
    ({'num_ps': 1}, Environment(num_gpus=2), 'parameter_server'),
    ({}, Environment(tf_config=_cluster(worker=3)), 'multi_worker_mirrored'),
    ({}, Environment(tf_config=_cluster(chief=1, worker=1)),
     'multi_worker_mirrored'),
    ({}, Environment(tf_config=_cluster(worker=1)), 'one_device'),
    ({}, Environment(tf_config=_cluster(chief=1, worker=2, ps=2)),
     'parameter_server'),
    # auto only chooses what the config accepts: tpu is one process.
    ({'num_workers': 2}, Environment(tpu_available=True),
     'multi_worker_mirrored'),
    ({}, Environment(tpu_available=True,
                     tf_config=_cluster(worker=2, ps=1)), 'tpu'),
    # A plan's pipeline places its stages itself, even over 4 GPUs.
    ({}, Environment(num_gpus=4, has_partition_plan=True), 'one_device'),
    ({'logical_cpu_devices': 4}, Environment(has_partition_plan=True),
     'one_device'),
])
def test_auto_rules(config, env, expected):
  name, reason = strategy_lib.choose_strategy(
      DistributionConfig.from_dict(config), env)
  assert name == expected
  assert reason.endswith('.')  # What it says: the next test.


def test_auto_reasons_name_the_evidence():
  _, reason = strategy_lib.choose_strategy(
      DistributionConfig(), Environment(num_gpus=4))
  assert '4 GPUs' in reason
  _, reason = strategy_lib.choose_strategy(
      DistributionConfig(), Environment(tf_config=_cluster(worker=2, ps=3)))
  assert '3 ps' in reason


def test_explicit_strategy_wins():
  name, reason = strategy_lib.choose_strategy(
      DistributionConfig(strategy='central_storage'), Environment(num_gpus=8))
  assert name == 'central_storage' and 'requested' in reason


def test_tpu_without_tpu_fails_clearly():
  with pytest.raises(strategy_lib.StrategyUnavailableError) as error:
    strategy_lib.resolve(DistributionConfig(strategy='tpu'), Environment())
  message = str(error.value)
  assert "strategy='tpu' needs a TPU" in message
  assert 'TPU_NAME' in message and "'mirrored'" in message
  config, _ = strategy_lib.resolve(DistributionConfig(strategy='tpu'),
                                   Environment(tpu_available=True))
  assert config.strategy == 'tpu'


def test_tpu_detection_reads_address_and_environment(monkeypatch):
  for name in registry.TPU_ENV_VARS:
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setattr(registry, 'TPU_DEVICE_GLOB', '/nonexistent/accel*')
  assert not registry.tpu_available(DistributionConfig())
  assert registry.tpu_available(DistributionConfig(tpu_address='t1'))
  monkeypatch.setenv('TPU_NAME', 'my-tpu')
  assert registry.tpu_available(DistributionConfig())


def test_in_process_parameter_server_needs_a_cluster():
  config = DistributionConfig(strategy='parameter_server',
                              launcher='in_process')
  with pytest.raises(strategy_lib.StrategyUnavailableError,
                     match='TF_CONFIG with ps and worker'):
    strategy_lib.resolve(config, Environment())
  resolved, _ = strategy_lib.resolve(
      config, Environment(tf_config=_cluster(chief=1, worker=1, ps=1)))
  assert resolved.strategy == 'parameter_server'


def test_resolve_replaces_auto_and_drops_useless_logical_cpus():
  config = DistributionConfig(logical_cpu_devices=2)
  resolved, _ = strategy_lib.resolve(config, Environment())
  assert (resolved.strategy, resolved.logical_cpu_devices) == ('mirrored', 2)
  resolved, _ = strategy_lib.resolve(config, Environment(num_gpus=2))
  assert (resolved.strategy, resolved.logical_cpu_devices) == ('mirrored', 0)
  resolved.validate()


def test_detect_environment_reads_tf_config_only_in_process(monkeypatch):
  monkeypatch.setenv('TF_CONFIG', json.dumps(_cluster(worker=2)))
  local = strategy_lib.detect_environment(DistributionConfig())
  assert local.tf_config == {}
  # What TensorFlow sees, on any machine.
  assert local.num_gpus == len(tf.config.list_physical_devices('GPU'))
  in_process = strategy_lib.detect_environment(
      DistributionConfig(launcher='in_process'))
  assert in_process.cluster_size('worker') == 2


def _run_python(code: str) -> subprocess.CompletedProcess:
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return subprocess.run([sys.executable, '-c', textwrap.dedent(code)],
                        cwd=root, capture_output=True, text=True, timeout=120,
                        env={**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '2'})


def test_logical_cpu_strategies_build_real_replicas():
  """Fresh process: logical CPUs give Mirrored/CentralStorage N replicas.

  GPUs are hidden there: where there are any, the replicas are the GPUs
  (the next test).
  """
  proc = _run_python("""
      import tensorflow as tf
      tf.config.set_visible_devices([], 'GPU')
      from components.trainer.strategies import choice as s
      from components.trainer.strategies import registry
      from components.trainer.config import DistributionConfig
      config = DistributionConfig(strategy='mirrored', logical_cpu_devices=3)
      s.configure_logical_cpus(4)  # One more, as GPipe stages may need.
      replicas = [registry.get(name).build(config).num_replicas_in_sync
                  for name in ('mirrored', 'central_storage', 'one_device')]
      print('REPLICAS', replicas)
      """)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'REPLICAS [3, 3, 1]' in proc.stdout


@pytest.mark.skipif(not tf.config.list_physical_devices('GPU'),
                    reason='needs a GPU: replicas on GPUs')
def test_replicas_are_the_gpus_where_there_are_any():
  proc = _run_python("""
      import tensorflow as tf
      from components.trainer.strategies import choice as s
      from components.trainer.strategies import registry
      from components.trainer.config import DistributionConfig
      config = DistributionConfig(strategy='mirrored', logical_cpu_devices=3)
      s.configure_logical_cpus(3)
      replicas = [registry.get(name).build(config).num_replicas_in_sync
                  for name in ('mirrored', 'central_storage', 'one_device')]
      print('REPLICAS', replicas)
      print('ONE_DEVICE', registry.get('one_device').build(config).extended
            .worker_devices)
      """)
  assert proc.returncode == 0, proc.stderr[-3000:]
  gpus = len(tf.config.list_physical_devices('GPU'))
  assert f'REPLICAS [{gpus}, {gpus}, 1]' in proc.stdout
  assert 'GPU:0' in proc.stdout.split('ONE_DEVICE', 1)[1]


def test_logical_cpus_after_tf_started_fail_clearly():
  proc = _run_python("""
      import tensorflow as tf
      tf.constant(1.0) + 1.0  # Initializes the runtime with one CPU.
      from components.trainer.strategies import choice as s
      s.configure_logical_cpus(1)  # Nothing to do.
      try:
        s.configure_logical_cpus(2)
      except RuntimeError as e:
        print('ERROR', e)
      """)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert 'ERROR logical_cpu_devices=2 needs a TensorFlow runtime' in proc.stdout
  assert "launcher='local'" in proc.stdout


def _task(tmp_path, distribution, mode='managed', train_steps=0,
          eval_steps=0):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from components.trainer.common.task import TrainingTask  # pylint: disable=g-import-not-at-top
  pattern = str(tmp_path / 'data-*.gz')
  for index, count in enumerate((300, 340)):  # 640 records in 2 files.
    options = tf.io.TFRecordOptions(compression_type='GZIP')
    with tf.io.TFRecordWriter(str(tmp_path / f'data-{index}.gz'),
                              options) as writer:
      for _ in range(count):
        writer.write(b'record')
  return TrainingTask(
      module_file=None, module_path='m', mode=mode, train_files=[pattern],
      eval_files=[pattern], transform_output=None, schema_path=None,
      serving_model_dir='', model_run_dir='', train_steps=train_steps,
      eval_steps=eval_steps, hparams={}, custom_config={},
      distribution=DistributionConfig.from_dict(distribution).to_dict(),
      fault_tolerance={}, checkpoint_dir='')


def test_lengths_and_batch_resolved_for_the_replicas(tmp_path):
  task = _task(tmp_path, {'global_batch_size': 64, 'train_epochs': 2,
                          'gradient_accumulation_steps': 2})
  resolved, config = _resolve_lengths(task, num_replicas=4)
  assert DistributionConfig.from_dict(resolved.distribution) == config
  assert (config.per_replica_batch_size, config.global_batch_size) == (16, None)
  assert config.train_epochs == 0
  # 2 epochs x 640 examples / (64 examples x 2 micro-steps per update).
  assert resolved.train_steps == 10
  assert resolved.eval_steps == 640 // 64  # One pass in managed mode.

  run_fn_task = _task(tmp_path, {'per_replica_batch_size': 8}, mode='run_fn',
                      train_steps=7)
  resolved, _ = _resolve_lengths(run_fn_task, num_replicas=2)
  assert (resolved.train_steps, resolved.eval_steps) == (7, 0)
  with pytest.raises(ValueError, match='3 replicas'):
    _resolve_lengths(task, num_replicas=3)


def _resolve_lengths(task, num_replicas, workers=1):
  return context.resolve_lengths(
      task, DistributionConfig.from_dict(task.distribution), num_replicas,
      workers)


def test_an_elastic_cluster_below_full_size_keeps_its_update_batch(tmp_path):
  """3 workers x 2 accumulated batches of 4 at full size; on 2 workers the
  same 24 examples per update: 3 accumulated batches of 4 each."""
  from components.trainer.common import membership  # pylint: disable=g-import-not-at-top
  task = _task(tmp_path, {
      'strategy': 'multi_worker_mirrored', 'launcher': 'ray',
      'num_workers': 3, 'min_workers': 2, 'per_replica_batch_size': 4,
      'gradient_accumulation_steps': 2, 'train_epochs': 3})
  full, _ = _resolve_lengths(task, num_replicas=3, workers=3)
  smaller, _ = _resolve_lengths(task, num_replicas=2, workers=2)
  # The same updates: 3 epochs x 640 examples / 24 per update.
  assert full.train_steps == smaller.train_steps == 80
  for resolved in (full, smaller):
    # Still a valid elastic config (its full size's accumulation).
    config = DistributionConfig.from_dict(resolved.distribution)
    assert (config.per_replica_batch_size,
            config.gradient_accumulation_steps) == (4, 2)
  assert [membership.accumulation_at(config, w) for w in (3, 2)] == [2, 3]


def test_a_new_strategy_is_one_registry_entry(tmp_path, data, monkeypatch):
  """A toy strategy registered in one entry is accepted by the config, gets
  its cluster from the launchers' description, trains through the process
  entry, and that process validates its config once."""
  from components.trainer.cluster import tf_cluster  # pylint: disable=g-import-not-at-top
  from components.trainer.process import entry  # pylint: disable=g-import-not-at-top
  from components.testing import trainer_testing as tt  # pylint: disable=g-import-not-at-top
  toy = registry.StrategySpec(
      'toy_cpu', registry.ONE_PROCESS,
      lambda config: tf.distribute.OneDeviceStrategy('/cpu:0'),
      fixed_replicas=1)
  with pytest.raises(ValueError, match="strategy='toy_cpu' is not one of"):
    DistributionConfig(strategy='toy_cpu').validate()
  with registry.registered(toy):
    assert DistributionConfig(strategy='toy_cpu').validate()
    with pytest.raises(ValueError, match='num_workers=2 needs a multi-worker'):
      DistributionConfig(strategy='toy_cpu', num_workers=2).validate()
    assert tf_cluster.cluster_shape('toy_cpu', 1, 0) == {}
    validations = []
    validate = DistributionConfig.validate
    monkeypatch.setattr(DistributionConfig, 'validate', lambda config: (
        validations.append(config.strategy), validate(config))[1])
    result = entry.train(tt.make_task(str(tmp_path), data, strategy='toy_cpu',
                                      train_steps=3))
  assert (result.strategy, result.steps, result.num_replicas) == (
      'toy_cpu', 3, 1)
  assert validations == ['toy_cpu']
  with pytest.raises(ValueError, match="strategy='toy_cpu' is not one of"):
    DistributionConfig(strategy='toy_cpu').validate()
