"""DistributionConfig validation: every bad value fails, naming what is
allowed."""

import pytest

from components.trainer.common import membership
from components.trainer import config as config_lib
from components.trainer.config import DistributionConfig
from components.trainer.common import cpu_threads
from components.trainer import resolve as resolve_lib


def _error(**values) -> str:
  with pytest.raises(ValueError) as error:
    DistributionConfig.from_dict(values)
  return str(error.value)


def test_defaults_are_valid_and_round_trip():
  config = DistributionConfig.from_dict({})
  assert config.strategy == 'auto' and config.launcher == 'auto'
  assert DistributionConfig.from_json(config.to_json()) == config
  custom = DistributionConfig.from_dict(
      {'strategy': 'parameter_server', 'num_workers': 2, 'num_ps': 1,
       'global_batch_size': 64, 'gradient_accumulation_steps': 4})
  assert DistributionConfig.from_json(custom.to_json()) == custom


def test_unknown_strategy_names_the_allowed_ones():
  message = _error(strategy='horovod')
  assert "strategy='horovod'" in message
  for name in config_lib.strategies():
    assert repr(name) in message


@pytest.mark.parametrize('field,value', [('launcher', 'slurm'),
                                         ('mode', 'estimator'),
                                         ('precision', 'float8'),
                                         ('precision', 'bfloat16'),
                                         ('xla', True)])
def test_unknown_choices(field, value):
  message = _error(**{field: value})
  assert f'{field}={value!r}' in message and 'is not one of' in message


def test_precision_and_xla_name_every_allowed_value():
  assert all(repr(p) in _error(precision='float8')
             for p in config_lib.PRECISIONS)
  assert all(repr(x) in _error(xla='always') for x in config_lib.XLA_SETTINGS)
  for precision in config_lib.PRECISIONS:
    for xla in config_lib.XLA_SETTINGS:
      DistributionConfig.from_dict({'precision': precision, 'xla': xla})


@pytest.mark.parametrize('values', [
    {'strategy': 'central_storage'},
    {'strategy': 'parameter_server', 'num_workers': 2, 'num_ps': 1}])
def test_float16_needs_a_strategy_with_loss_scaling(values):
  message = _error(precision='mixed_float16', **values)
  assert f"strategy={values['strategy']!r}" in message
  assert 'mixed_bfloat16' in message and "'multi_worker_mirrored'" in message
  DistributionConfig.from_dict({**values, 'precision': 'mixed_bfloat16'})


def test_xla_on_needs_replicas_that_hold_their_variables():
  message = _error(xla='on', strategy='central_storage')
  assert "strategy='central_storage'" in message and "xla='off'" in message
  DistributionConfig.from_dict({'xla': 'auto', 'strategy': 'central_storage'})


def test_precision_and_xla_are_the_managed_loops():
  message = _error(mode='run_fn', precision='mixed_bfloat16')
  assert "mode='run_fn'" in message and 'jit_compile' in message
  assert "mode='run_fn'" in _error(mode='run_fn', xla='on')


def test_precision_changes_the_trajectory_xla_does_not():
  trajectory = config_lib.trajectory(DistributionConfig.from_dict({}))
  assert 'precision' in trajectory and 'xla' not in trajectory


def test_unknown_option():
  message = _error(num_gpus=2)
  assert "['num_gpus']" in message and 'per_replica_batch_size' in message


def test_num_ps_without_parameter_server():
  message = _error(strategy='mirrored', num_ps=1)
  assert 'num_ps=1' in message and "strategy='mirrored'" in message
  assert "('auto', 'parameter_server')" in message


def test_parameter_server_needs_a_ps():
  message = _error(strategy='parameter_server', num_workers=2)
  assert 'num_ps >= 1' in message and 'num_ps=0' in message


@pytest.mark.parametrize('value', [0, -1, 1.5, True])
def test_zero_or_bad_workers(value):
  message = _error(strategy='multi_worker_mirrored', num_workers=value)
  assert f'num_workers={value!r}' in message and '>= 1' in message


def test_many_workers_need_a_multi_worker_strategy():
  message = _error(strategy='one_device', num_workers=2)
  assert 'num_workers=2' in message
  assert "'multi_worker_mirrored', 'parameter_server'" in message


def test_in_process_takes_the_cluster_from_tf_config():
  message = _error(launcher='in_process', strategy='multi_worker_mirrored',
                   num_workers=2)
  assert "starts processes (('local', 'ray'))" in message
  assert 'TF_CONFIG' in message


def test_logical_cpus_only_for_local_replica_strategies():
  message = _error(strategy='multi_worker_mirrored', num_workers=2,
                   logical_cpu_devices=2)
  assert 'logical_cpu_devices=2' in message
  assert "('auto', 'mirrored', 'central_storage')" in message


def test_tpu_address_needs_tpu():
  assert 'tpu_address' in _error(strategy='mirrored', tpu_address='my-tpu')


@pytest.mark.parametrize('values,replicas', [
    ({'strategy': 'mirrored', 'logical_cpu_devices': 2}, 2),
    ({'strategy': 'central_storage', 'logical_cpu_devices': 4}, 4),
    ({'strategy': 'multi_worker_mirrored', 'num_workers': 3}, 3),
])
def test_global_batch_not_divisible(values, replicas):
  message = _error(global_batch_size=65, **values)
  assert 'global_batch_size=65' in message
  assert f'{replicas} replicas' in message


def test_batch_sizes_exclusive_and_positive():
  assert 'not both' in _error(per_replica_batch_size=8, global_batch_size=16)
  assert 'per_replica_batch_size=0' in _error(per_replica_batch_size=0)
  assert 'global_batch_size=-4' in _error(global_batch_size=-4)


@pytest.mark.parametrize('field,value', [
    ('gradient_accumulation_steps', 0), ('train_epochs', -1),
    ('logical_cpu_devices', -2), ('num_ps', -1),
    ('steps_per_execution', 0), ('steps_per_execution', 'fast'),
    ('steps_per_execution', True)])
def test_negative_or_zero_counts(field, value):
  assert f'{field}={value!r}' in _error(**{field: value})


_ELASTIC = {'strategy': 'multi_worker_mirrored', 'launcher': 'ray',
            'num_workers': 2}


@pytest.mark.parametrize('values,expected', [
    ({'min_workers': 0}, 'min_workers=0 must be an integer in [1, '
     'num_workers=2]'),
    ({'min_workers': 3}, 'min_workers=3 must be an integer in [1, '
     'num_workers=2]'),
    ({'min_workers': 1.0}, 'min_workers=1.0 must be an integer'),
    ({'min_workers': 1, 'launcher': 'local'},
     "needs a launcher on a Ray cluster ('ray',) (its nodes can be lost), "
     "not launcher='local'"),
    ({'min_workers': 1, 'strategy': 'parameter_server', 'num_ps': 1},
     "needs strategy in ('auto', 'multi_worker_mirrored') without parameter "
     "servers, not strategy='parameter_server', num_ps=1"),
    ({'min_workers': 2, 'num_workers': 3},
     'min_workers=2: with 2 of num_workers=3 workers the update batch cannot '
     'be kept: its 3 x gradient_accumulation_steps=1 per-replica batches do '
     'not divide among 2 workers'),
    ({'min_workers': 2, 'num_workers': 4, 'gradient_accumulation_steps': 3,
      'data_partitions': 4},
     'data_partitions=4 cannot be shared by 3 workers (min_workers=2, '
     'num_workers=4)'),
    ({'data_partitions': 0}, 'data_partitions=0'),
])
def test_an_elastic_config_that_cannot_keep_its_update_batch_fails(
    values, expected):
  assert expected in _error(**{**_ELASTIC, **values})


def test_elastic_configs_that_keep_the_update_batch():
  for values in ({'min_workers': 1}, {'min_workers': 2},
                 {'min_workers': 2, 'num_workers': 3,
                  'gradient_accumulation_steps': 2},
                 {'min_workers': 1, 'num_workers': 4,
                  'gradient_accumulation_steps': 3}):
    config = DistributionConfig.from_dict({**_ELASTIC, **values})
    assert config.elastic == (config.min_workers < config.num_workers)
  assert not DistributionConfig(num_workers=2,
                                strategy='multi_worker_mirrored').elastic


def test_the_data_order_has_one_partition_per_full_size_replica():
  """Unless a worker count the config allows does not divide num_workers:
  then one per micro-batch of the full-size update."""
  def partitions(**values):
    config = DistributionConfig.from_dict({**_ELASTIC, **values})
    return membership.order_partitions(config, config.num_workers)
  assert partitions() == 2
  assert partitions(min_workers=1, gradient_accumulation_steps=3) == 2
  assert partitions(min_workers=2, num_workers=3,
                    gradient_accumulation_steps=2) == 6
  assert partitions(min_workers=1, data_partitions=8) == 8


@pytest.mark.parametrize('value', [
    float('nan'), float('inf'), float('-inf'), True, '60', None, [60]])
def test_timeout_must_be_a_finite_number(value):
  """NaN passed the '< 0' check (every comparison with NaN is False)."""
  from components.trainer.checkpoint.config import FaultToleranceConfig  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError) as error:
    FaultToleranceConfig.from_dict({'timeout_s': value})
  assert f'timeout_s={value!r} must be a finite number >= 0' in str(
      error.value)


@pytest.mark.parametrize('value', [float('nan'), float('inf'), '1', None])
def test_ray_resources_must_be_finite_numbers(value):
  message = _error(launcher='ray', ray={'resources': {'cpus': value}})
  assert f"ray.resources['cpus']={value!r} must be a finite number" in message


def test_batch_arithmetic():
  config = DistributionConfig.from_dict({'per_replica_batch_size': 16})
  assert config.per_replica_batch(4) == 16 and config.global_batch(4) == 64
  config = DistributionConfig.from_dict({'global_batch_size': 64})
  assert config.per_replica_batch(4) == 16 and config.global_batch(4) == 64
  with pytest.raises(ValueError, match='3 replicas'):
    config.per_replica_batch(3)
  assert DistributionConfig().global_batch(2) == (
      2 * config_lib.DEFAULT_PER_REPLICA_BATCH_SIZE)


def test_resolve_mode():
  resolve = resolve_lib.resolve_mode
  kwargs = {'module': "module_file 'm.py'"}
  assert resolve('auto', has_build_model=True, has_run_fn=True,
                 run_fn_given=False, **kwargs) == 'managed'
  assert resolve('auto', has_build_model=True, has_run_fn=True,
                 run_fn_given=True, **kwargs) == 'run_fn'
  assert resolve('auto', has_build_model=False, has_run_fn=True,
                 run_fn_given=False, **kwargs) == 'run_fn'
  assert resolve('run_fn', has_build_model=True, has_run_fn=True,
                 run_fn_given=False, **kwargs) == 'run_fn'
  with pytest.raises(ValueError, match=r"neither build_model.*'m.py'|"
                     r"'m.py'.*neither"):
    resolve('auto', has_build_model=False, has_run_fn=False,
            run_fn_given=False, **kwargs)
  with pytest.raises(ValueError, match="mode='managed' needs build_model"):
    resolve('managed', has_build_model=False, has_run_fn=True,
            run_fn_given=False, **kwargs)
  with pytest.raises(ValueError, match="mode='run_fn' needs run_fn"):
    resolve('run_fn', has_build_model=True, has_run_fn=False,
            run_fn_given=False, **kwargs)


def test_train_length():
  resolve_lib.check_train_length('managed', 100, 0)
  resolve_lib.check_train_length('managed', 0, 2)
  resolve_lib.check_train_length('run_fn', 0, 0)
  with pytest.raises(ValueError, match='set only one'):
    resolve_lib.check_train_length('run_fn', 100, 2)
  with pytest.raises(ValueError, match='num_steps > 0 or'):
    resolve_lib.check_train_length('managed', 0, 0)


def test_seed_and_determinism_round_trip():
  assert (DistributionConfig().seed, DistributionConfig().deterministic) == (
      None, False)
  config = DistributionConfig.from_dict(
      {'seed': 0, 'deterministic': True, 'strategy': 'mirrored'})
  assert DistributionConfig.from_json(config.to_json()) == config
  assert DistributionConfig.from_dict(
      {'seed': config_lib.MAX_SEED}).seed == config_lib.MAX_SEED


@pytest.mark.parametrize('seed', [-1, 2**32, 1.5, '7', True])
def test_bad_seed_names_the_range(seed):
  message = _error(seed=seed)
  assert f'seed={seed!r}' in message and '[0, 4294967295]' in message


@pytest.mark.parametrize('value', [1, 'yes', None])
def test_deterministic_must_be_a_bool(value):
  assert f'deterministic={value!r} must be true or false' in _error(
      seed=1, deterministic=value)


def test_deterministic_needs_a_seed():
  message = _error(deterministic=True)
  assert 'deterministic=True needs a seed' in message
  assert 'set seed' in message


@pytest.mark.parametrize('values', [
    {'strategy': 'parameter_server', 'num_ps': 1, 'num_workers': 2},
    {'strategy': 'auto', 'num_ps': 1}])
def test_deterministic_refuses_parameter_servers(values):
  message = _error(seed=1, deterministic=True, **values)
  assert 'asynchronous' in message and f"num_ps={values['num_ps']}" in message
  # A seed alone is fine there: it fixes the initial weights.
  assert DistributionConfig.from_dict({'seed': 1, **values}).seed == 1


def test_auto_launcher_trains_in_process_only_for_process_local_paths():
  resolve = resolve_lib.resolve_launcher
  auto = DistributionConfig.from_dict({})
  config, reason = resolve(auto, {})
  assert config.launcher == 'local' and 'shared storage' in reason
  config, reason = resolve(auto, {'checkpoints': 'ram://root/_ckpt'})
  assert config.launcher == 'in_process'
  assert "['checkpoints'] at ['ram://root/_ckpt']" in reason
  # A cluster needs child processes: the launcher's error names the paths.
  cluster = DistributionConfig.from_dict(
      {'strategy': 'multi_worker_mirrored', 'num_workers': 2})
  config, reason = resolve(cluster, {'model': 'ram://m'})
  assert config.launcher == 'local' and 'num_workers=2' in reason
  # Asked for: kept, also on ram:// (the launcher then refuses it).
  local = DistributionConfig.from_dict({'launcher': 'local'})
  assert resolve(local, {'model': 'ram://m'}) == (local, 'requested')


def test_accumulation_keeps_the_update_batch_with_fewer_workers():
  assert [membership.accumulation_for(4, 3, w) for w in (4, 3, 2, 1)] == [
      3, 4, 6, 12]


@pytest.mark.parametrize('value', [-1, 1.5, True, 'all', None])
def test_bad_intra_op_threads_names_what_is_allowed(value):
  message = _error(intra_op_threads=value)
  assert f'intra_op_threads={value!r}' in message
  assert "'auto'" in message and 'integer >= 0' in message


def test_auto_intra_op_threads_leave_one_core_to_the_input_pipeline():
  assert cpu_threads.choose('auto', 2, has_gpu=False)[0] == 1
  assert cpu_threads.choose('auto', 16, has_gpu=False)[0] == 15
  assert cpu_threads.choose('auto', 1, has_gpu=False)[0] == 1
  # With GPUs the ops run there: TensorFlow's default stays.
  threads, reason = cpu_threads.choose('auto', 16, has_gpu=True)
  assert threads == 0 and 'GPU' in reason
  assert cpu_threads.choose(3, 16, has_gpu=False) == (3, 'set in the config')


def test_auto_intra_op_threads_give_a_compute_bound_model_every_core():
  small = cpu_threads.COMPUTE_BOUND_WEIGHTS - 1
  assert cpu_threads.choose('auto', 2, False, model_weights=small)[0] == 1
  threads, reason = cpu_threads.choose(
      'auto', 2, False, model_weights=cpu_threads.COMPUTE_BOUND_WEIGHTS)
  assert threads == 0 and 'weights' in reason and 'all 2 cores' in reason
  assert cpu_threads.choose('auto', 2, False, model_weights=None)[0] == 1


def test_intra_op_threads_once_tensorflow_runs_in_the_process():
  """'auto' leaves a started runtime's pool as it is and says so; an
  explicit count cannot be honoured: a clear error."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  float(tf.reduce_sum(tf.ones([2])))  # The runtime has started.
  current = tf.config.threading.get_intra_op_parallelism_threads()
  chosen = cpu_threads.configure('auto')
  if current == max(1, cpu_threads.usable_cores() - 1):
    # An earlier in-process training of this session set it already.
    assert chosen['threads'] == current
  else:
    assert chosen['threads'] == 0 and 'already ran' in chosen['reason']
  assert chosen['usable_cores'] == cpu_threads.usable_cores()
  wanted = current + 1
  with pytest.raises(RuntimeError, match=f'intra_op_threads={wanted} needs'):
    cpu_threads.configure(wanted)


@pytest.mark.parametrize('old,new', [
    ('save_every_seconds', 'save_every_s'),
    ('lease_timeout_seconds', 'lease_timeout_s'),
    ('lease_heartbeat_seconds', 'lease_heartbeat_s'),
    ('rescale_check_seconds', 'rescale_check_s'),
])
def test_an_old_option_name_fails_naming_the_new_one(old, new):
  from components.trainer.checkpoint.config import FaultToleranceConfig  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match=f"'{old}' is now '{new}'"):
    FaultToleranceConfig.from_dict({old: 10})
  assert FaultToleranceConfig.from_dict({new: 10})


def test_only_trajectory_options_are_in_the_fingerprint():
  config = DistributionConfig(launcher='ray', num_workers=2,
                              steps_per_execution=4)
  trajectory = config_lib.trajectory(config)
  assert trajectory['num_workers'] == 2
  assert not {'launcher', 'steps_per_execution', 'ray'} & set(trajectory)


@pytest.mark.parametrize('old,new', [
    ('ray_address', 'ray.address'), ('ray_placement', 'ray.placement'),
    ('ray_resources', 'ray.resources'),
    ('timeout_s', 'fault_tolerance.timeout_s')])
def test_a_moved_distribution_option_fails_naming_its_place(old, new):
  assert f"'{old}' is now '{new}'" in _error(**{old: 1})


@pytest.mark.parametrize('offload,expected', [
    ({'cells': -1}, "offload.cells=-1 must be an integer >= 0 or 'auto'"),
    ({'cells': 'many'}, "offload.cells='many' must be an integer"),
    ({'launcher': 'kubernetes'},
     "offload.launcher='kubernetes' is not one of ('local', 'ray')"),
    ({'lost_after_s': float('nan')}, 'offload.lost_after_s=nan must be a '
     'finite number > 0'),
    ({'cpus_per_cell': 0}, 'offload.cpus_per_cell=0 must be'),
    ({'cell': 1}, "Unknown distribution.offload option(s) ['cell']"),
])
def test_bad_offload_options_are_named(offload, expected):
  assert expected in _error(offload=offload)


def test_offload_serves_only_the_synchronous_data_order():
  assert 'cells serve the synchronous strategies\' data order' in _error(
      strategy='parameter_server', num_ps=1, num_workers=2,
      offload={'cells': 1})
  config = DistributionConfig.from_dict({'offload': {'cells': 'auto'}})
  assert config.offload.enabled and config.offload.cells == 'auto'
  # Where the rows are made does not change them: a resume may switch.
  assert 'offload' not in config_lib.trajectory(config)
