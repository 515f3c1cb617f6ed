"""Which tf.distribute strategy to use, and building it.

`choose_strategy` is a pure rules function over a small `Environment`, so the
`auto` decision is testable without TensorFlow; `detect_environment` fills the
environment in; `make_strategy` (TensorFlow, imported lazily) builds the
strategy inside a training process.
"""

import dataclasses
import glob
import json
import os
from typing import Any, Dict, Tuple

from components import devices
from components.trainer.config import CONCRETE_STRATEGIES
from components.trainer.config import DistributionConfig
from components.trainer.config import LOGICAL_CPU_STRATEGIES

# Environment variables a TPU cluster resolver reads.
TPU_ENV_VARS = ('TPU_NAME', 'COLAB_TPU_ADDR', 'KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS')
# Device files of the TPU chips on a Cloud TPU VM.
TPU_DEVICE_GLOB = '/dev/accel*'


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
    return len(self.tf_config.get('cluster', {}).get(task_type, []))


def tf_config_from_env() -> Dict[str, Any]:
  """This process's TF_CONFIG (cluster and task), {} if unset."""
  return json.loads(os.environ.get('TF_CONFIG') or '{}')


def detect_environment(config: DistributionConfig,
                       has_partition_plan: bool = False) -> Environment:
  """Looks for a TPU, an orchestrator's TF_CONFIG and GPUs.

  TF_CONFIG only counts for launcher `in_process`: with `local` the launcher
  builds its own localhost cluster from num_workers / num_ps. With `ray` the
  Ray cluster is contacted (the first place an unreachable address fails)
  and its nodes that can hold a task counted.
  """
  tf_config = tf_config_from_env() if config.launcher == 'in_process' else {}
  ray_nodes = 0
  if config.launcher == 'ray':
    from components.trainer.cluster import ray_backend  # pylint: disable=g-import-not-at-top
    ray_backend.connect(config.ray_address)
    ray_nodes = len(ray_backend.task_nodes(config.ray_task_resources()))
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # Listing physical devices does not initialize the runtime, so logical
  # devices can still be configured afterwards.
  num_gpus = len(tf.config.list_physical_devices('GPU'))
  return Environment(tpu_available=tpu_available(config), tf_config=tf_config,
                     num_gpus=num_gpus, ray_nodes=ray_nodes,
                     has_partition_plan=has_partition_plan)


def tpu_available(config: DistributionConfig) -> bool:
  """True where a TPU resolver has something to resolve.

  Checked without contacting any service: an explicit address, the resolver's
  environment variables, or TPU device files of a TPU VM.
  """
  return bool(config.tpu_address or
              any(os.environ.get(name) for name in TPU_ENV_VARS) or
              glob.glob(TPU_DEVICE_GLOB))


def choose_strategy(config: DistributionConfig,
                    env: Environment) -> Tuple[str, str]:
  """Returns (strategy name, reason) for the config in the environment.

  Rules for `auto`, first match wins: a partition plan (one_device: the
  pipeline puts each stage on its own device); a TPU; TF_CONFIG with ps tasks
  (parameter_server); TF_CONFIG with more than one worker/chief
  (multi_worker_mirrored); num_ps > 0 (parameter_server); num_workers > 1
  (multi_worker_mirrored); launcher `ray` on a Ray cluster of several nodes
  (multi_worker_mirrored, one worker per node: `resolve` sets num_workers);
  more than one GPU (mirrored); no GPU and
  logical_cpu_devices > 1 (mirrored over logical CPUs); else one_device.
  """
  if config.strategy != 'auto':
    return config.strategy, f'strategy={config.strategy!r} was requested.'
  if env.has_partition_plan:
    return ('one_device', 'A partition plan: one pipeline, which places each '
            'stage on its own device (GPUs, else logical CPUs).')
  ps_tasks = env.cluster_size('ps')
  cluster_workers = env.cluster_size('worker') + env.cluster_size('chief')
  if env.tpu_available:
    return 'tpu', 'A TPU was found (tpu_address, TPU_NAME or /dev/accel*).'
  if ps_tasks:
    return 'parameter_server', f'TF_CONFIG lists {ps_tasks} ps task(s).'
  if cluster_workers > 1:
    return ('multi_worker_mirrored',
            f'TF_CONFIG lists {cluster_workers} worker/chief tasks and no ps.')
  if config.num_ps:
    return 'parameter_server', f'num_ps={config.num_ps} was requested.'
  if config.num_workers > 1:
    return ('multi_worker_mirrored',
            f'num_workers={config.num_workers} was requested and num_ps=0.')
  if config.launcher == 'ray' and env.ray_nodes > 1:
    return ('multi_worker_mirrored',
            f"launcher='ray' on a Ray cluster of {env.ray_nodes} nodes and no "
            f'TF_CONFIG: one worker per node ({env.ray_nodes} workers).')
  if env.num_gpus > 1:
    return 'mirrored', f'{env.num_gpus} GPUs on one worker.'
  if not env.num_gpus and config.logical_cpu_devices > 1:
    return ('mirrored', f'No GPU; logical_cpu_devices='
            f'{config.logical_cpu_devices} gives that many CPU replicas.')
  device = 'one GPU' if env.num_gpus else 'no GPU'
  return 'one_device', f'One worker with {device}: nothing to distribute.'


def check_available(name: str, config: DistributionConfig,
                    env: Environment) -> None:
  """Fails before any training starts if `name` cannot run here."""
  if name == 'tpu' and not env.tpu_available:
    raise StrategyUnavailableError(
        "strategy='tpu' needs a TPU, and none was found: no tpu_address in "
        f'the distribution config, none of {TPU_ENV_VARS} set, no '
        f'{TPU_DEVICE_GLOB} devices. Use a TPU VM, set tpu_address, or choose '
        f'one of {tuple(s for s in CONCRETE_STRATEGIES if s != "tpu")}.')
  if (name == 'parameter_server' and config.launcher == 'in_process' and
      not (env.cluster_size('ps') and env.cluster_size('worker'))):
    raise StrategyUnavailableError(
        "strategy='parameter_server' with launcher='in_process' needs a "
        'TF_CONFIG with ps and worker tasks from the orchestrator; found '
        f'cluster {env.tf_config.get("cluster", {})}. Use launcher=\'local\' '
        'to start a local cluster.')


def resolve(config: DistributionConfig,
            env: Environment) -> Tuple[DistributionConfig, str]:
  """The config with `auto` replaced by a concrete, runnable strategy.

  Logical CPU devices are dropped where they make no replicas (GPUs present,
  or a strategy that does not replicate over local CPUs).
  """
  name, reason = choose_strategy(config, env)
  check_available(name, config, env)
  logical = (config.logical_cpu_devices
             if name in LOGICAL_CPU_STRATEGIES and not env.num_gpus else 0)
  workers = config.num_workers
  if (config.strategy == 'auto' and name == 'multi_worker_mirrored' and
      config.launcher == 'ray' and workers == 1):
    workers = env.ray_nodes
  return dataclasses.replace(config, strategy=name, num_workers=workers,
                             logical_cpu_devices=logical).validate(), reason


def is_chief(tf_config: Dict[str, Any]) -> bool:
  """Whether this process writes the shared outputs (model, results).

  No cluster, a `chief` task, or worker 0 of a cluster without a chief.
  """
  cluster = tf_config.get('cluster') or {}
  if not cluster:
    return True
  task = tf_config.get('task', {})
  if task.get('type') == 'chief':
    return True
  return (task.get('type') == 'worker' and task.get('index') == 0 and
          'chief' not in cluster)


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


def _replica_devices(config: DistributionConfig):
  """GPUs where there are any, else `logical_cpu_devices` CPU devices.

  The process may hold more logical CPUs than replicas (GPipe stages need a
  device each); the replicas take the first ones.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  gpus = tf.config.list_logical_devices('GPU')
  if gpus:
    return [d.name for d in gpus]
  cpus = [d.name for d in tf.config.list_logical_devices('CPU')]
  if config.logical_cpu_devices > 1 and len(cpus) < config.logical_cpu_devices:
    raise RuntimeError(
        f'logical_cpu_devices={config.logical_cpu_devices} but only '
        f'{len(cpus)} CPU device(s) exist; configure_logical_cpus() must run '
        'before TensorFlow initializes.')
  return cpus[:max(1, config.logical_cpu_devices)]


def make_strategy(name: str, config: DistributionConfig):
  """Builds the tf.distribute strategy `name` for this process.

  Multi-worker strategies read the cluster from TF_CONFIG (set by the local
  launcher or the orchestrator).
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  if name == 'one_device':
    gpus = tf.config.list_logical_devices('GPU')
    return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else
                                           '/cpu:0')
  if name == 'mirrored':
    return tf.distribute.MirroredStrategy(devices=_replica_devices(config))
  if name == 'central_storage':
    devices = _replica_devices(config)
    return tf.distribute.experimental.CentralStorageStrategy(
        compute_devices=devices, parameter_device='/cpu:0')
  if name == 'multi_worker_mirrored':
    return tf.distribute.MultiWorkerMirroredStrategy()
  if name == 'parameter_server':
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    return tf.distribute.experimental.ParameterServerStrategy(resolver)
  if name == 'tpu':
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
        tpu=config.tpu_address or None)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)
  raise ValueError(f'strategy={name!r} is not one of {CONCRETE_STRATEGIES}.')
