"""Which strategy `auto` stands for, and whether a strategy can run here.

`choose_strategy` is a pure rules function over a small `Environment`, so the
decision is testable without TensorFlow; `detect_environment` fills the
environment in. `auto` only ever chooses a strategy whose cluster fits the
config (`StrategySpec.mismatch`).
"""

import dataclasses
from typing import Any, Dict, Tuple

from components import devices
from components.trainer.common import tf_config as tf_config_lib
from components.trainer.config import DistributionConfig
from components.trainer.launchers import registry as launchers
from components.trainer.strategies import registry


class StrategyUnavailableError(RuntimeError):
  """The chosen strategy cannot run here (e.g. `tpu` without a TPU)."""


@dataclasses.dataclass(frozen=True)
class Environment:
  """What `auto` looks at."""
  tpu_available: bool = False
  # Parsed TF_CONFIG the orchestrator set for this process ({} if none).
  tf_config: Dict[str, Any] = dataclasses.field(default_factory=dict)
  num_gpus: int = 0
  # Alive nodes of the Ray cluster (launcher `ray`; 0 otherwise).
  ray_nodes: int = 0
  # A partition plan is wired in: its pipeline places the stages itself.
  has_partition_plan: bool = False

  def cluster_size(self, task_type: str) -> int:
    return tf_config_lib.tasks_of(self.tf_config, task_type)


def detect_environment(config: DistributionConfig,
                       has_partition_plan: bool = False) -> Environment:
  """Looks for a TPU, an orchestrator's TF_CONFIG and GPUs.

  TF_CONFIG only counts for launcher `in_process`: with `local` the launcher
  builds its own localhost cluster from num_workers / num_ps. With `ray` the
  Ray cluster is contacted (the first place an unreachable address fails)
  and its nodes that can hold a task counted.
  """
  tf_config = ({} if launchers.starts_processes(config.launcher)
               else tf_config_lib.from_env())
  ray_nodes = 0
  if launchers.on_ray_cluster(config.launcher):
    from components.trainer.cluster import ray_backend  # pylint: disable=g-import-not-at-top
    ray_backend.connect(config.ray.address)
    ray_nodes = len(ray_backend.task_nodes(config.ray.task_resources()))
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # Listing physical devices does not initialize the runtime, so logical
  # devices can still be configured afterwards.
  num_gpus = len(tf.config.list_physical_devices('GPU'))
  return Environment(tpu_available=registry.tpu_available(config),
                     tf_config=tf_config,
                     num_gpus=num_gpus, ray_nodes=ray_nodes,
                     has_partition_plan=has_partition_plan)


def choose_strategy(config: DistributionConfig,
                    env: Environment) -> Tuple[str, str]:
  """Returns (strategy name, reason) for the config in the environment.

  For `auto`, the first of `_candidates` whose cluster fits the config's
  num_workers and num_ps.
  """
  if config.strategy != 'auto':
    return config.strategy, f'strategy={config.strategy!r} was requested.'
  for name, reason in _candidates(config, env):
    if not registry.get(name).mismatch(config.num_workers, config.num_ps):
      return name, reason
  raise AssertionError('one_device fits every config auto accepts')


def _candidates(config: DistributionConfig, env: Environment):
  """`auto`'s rules, in order: a partition plan (one_device: the pipeline
  puts each stage on its own device); a TPU; TF_CONFIG with ps tasks
  (parameter_server); TF_CONFIG with more than one worker/chief
  (multi_worker_mirrored); num_ps > 0 (parameter_server); num_workers > 1
  (multi_worker_mirrored); launcher `ray` on a Ray cluster of several nodes
  (multi_worker_mirrored, one worker per node: `resolve` sets num_workers);
  more than one GPU (mirrored); no GPU and logical_cpu_devices > 1
  (mirrored over logical CPUs); else one_device."""
  if env.has_partition_plan:
    yield ('one_device', 'A partition plan: one pipeline, which places each '
           'stage on its own device (GPUs, else logical CPUs).')
  ps_tasks = env.cluster_size('ps')
  cluster_workers = tf_config_lib.worker_count(env.tf_config)
  if env.tpu_available:
    yield 'tpu', 'A TPU was found (tpu_address, TPU_NAME or /dev/accel*).'
  if ps_tasks:
    yield 'parameter_server', f'TF_CONFIG lists {ps_tasks} ps task(s).'
  if cluster_workers > 1:
    yield ('multi_worker_mirrored',
           f'TF_CONFIG lists {cluster_workers} worker/chief tasks and no ps.')
  if config.num_ps:
    yield 'parameter_server', f'num_ps={config.num_ps} was requested.'
  if config.num_workers > 1:
    yield ('multi_worker_mirrored',
           f'num_workers={config.num_workers} was requested and num_ps=0.')
  if launchers.on_ray_cluster(config.launcher) and env.ray_nodes > 1:
    yield ('multi_worker_mirrored',
           f'launcher={config.launcher!r} on a Ray cluster of '
           f'{env.ray_nodes} nodes and no '
           f'TF_CONFIG: one worker per node ({env.ray_nodes} workers).')
  if env.num_gpus > 1:
    yield 'mirrored', f'{env.num_gpus} GPUs on one worker.'
  if not env.num_gpus and config.logical_cpu_devices > 1:
    yield ('mirrored', f'No GPU; logical_cpu_devices='
           f'{config.logical_cpu_devices} gives that many CPU replicas.')
  device = 'one GPU' if env.num_gpus else 'no GPU'
  yield 'one_device', f'One worker with {device}: nothing to distribute.'


def check_available(name: str, config: DistributionConfig,
                    env: Environment) -> None:
  """Fails before any training starts if `name` cannot run here."""
  why = registry.get(name).unavailable(config, env)
  if why:
    raise StrategyUnavailableError(why)


def resolve(config: DistributionConfig,
            env: Environment) -> Tuple[DistributionConfig, str]:
  """The config with `auto` replaced by a concrete, runnable strategy.

  Logical CPU devices are dropped where they make no replicas (GPUs present,
  or a strategy that does not replicate over local CPUs).
  """
  name, reason = choose_strategy(config, env)
  check_available(name, config, env)
  logical = (config.logical_cpu_devices
             if registry.get(name).logical_cpu_replicas and not env.num_gpus
             else 0)
  workers = config.num_workers
  if (config.strategy == 'auto' and workers == 1 and
      launchers.on_ray_cluster(config.launcher) and
      registry.get(name).cluster == registry.WORKERS):
    workers = env.ray_nodes
  resolved = dataclasses.replace(config, strategy=name, num_workers=workers,
                                 logical_cpu_devices=logical)
  # The config was validated; what the choice adds is the replica count
  # the global batch must divide by (`auto` picks only fitting clusters).
  replicas = resolved.expected_replicas()
  if replicas is not None:
    resolved.per_replica_batch(replicas)
  return resolved, reason


def configure_logical_cpus(num_devices: int) -> None:
  """Splits the CPU into `num_devices` logical devices; call before TF runs.

  The error names the trainer settings to change where TensorFlow already
  started in this process (launcher `in_process` inside a pipeline run).
  """
  try:
    devices.configure_logical_cpus(num_devices)
  except RuntimeError as e:
    raise RuntimeError(
        f'logical_cpu_devices={num_devices} needs a TensorFlow runtime that '
        f'has not started yet: {e} Use launcher=\'local\' (a fresh training '
        'process) or set logical_cpu_devices=0.') from e
