"""One entry per tf.distribute strategy: everything the trainer must know of it.

Config validation, `auto`, the launchers, the process bootstrap and the
managed loop read a strategy's `StrategySpec` instead of naming strategies,
so adding one is one `register` call (plus its tests). No TensorFlow import:
an entry's `build` imports it when a training process calls it.
"""

import contextlib
import dataclasses
import glob
import os
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

from components.trainer.launchers import registry as launchers

# The processes of a strategy's cluster.
ONE_PROCESS = 'one_process'  # No TF cluster: one process holds every replica.
WORKERS = 'workers'  # Identical workers that all-reduce.
PARAMETER_SERVERS = 'parameter_servers'  # A chief, workers and ps tasks.
CLUSTERS = (ONE_PROCESS, WORKERS, PARAMETER_SERVERS)

# Environment variables a TPU cluster resolver reads.
TPU_ENV_VARS = ('TPU_NAME', 'COLAB_TPU_ADDR', 'KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS')
# Device files of the TPU chips on a Cloud TPU VM.
TPU_DEVICE_GLOB = '/dev/accel*'


@dataclasses.dataclass(frozen=True)
class StrategySpec:
  """What differs from one strategy to another.

  Attributes:
    name: The `distribution.strategy` value.
    cluster: One of CLUSTERS.
    build: (DistributionConfig) -> tf.distribute.Strategy, in the training
      process, after its logical devices are configured.
    fixed_replicas: Its replica count where the config alone fixes it
      (one_device: 1); None: it depends on the devices or the cluster.
    logical_cpu_replicas: Its replicas may be logical CPU devices of one
      process (`logical_cpu_devices`).
    host_iterator_input: Where its replicas are on the host CPU, they can
      take consecutive batches of one plain dataset iterator, without the
      distributed iterator's per-batch cost.
    lockstep_workers: Its workers run the same calls and collectives, so a
      decision one worker takes from its own clock (a save, a preemption
      notice) is voted on, every worker saves, a preemption is coordinated by
      TF's handler, and calls stay one step long (multi-step calls of a
      collective cluster hung reading gs://).
    asynchronous: Workers apply updates as they arrive (parameter servers):
      the coordinator schedules closures, each worker reads its own shuffled
      stream, the result depends on arrival order (no `deterministic`), and
      evaluation runs on a local copy.
    auto_steps_per_call: What `steps_per_execution='auto'` means for it;
      None: measured per training (`call_size`).
    elastic: It may run with fewer workers than `num_workers` (`membership`).
    loss_scaling: Keras' LossScaleOptimizer runs under it, so it can train
      `mixed_float16` (tf-keras supports one variable copy per replica only).
    xla: Each replica's variables live on its own device, so XLA can compile
      its step (XLA cannot read a variable on another device or task).
    unavailable: (config, environment) -> why it cannot run here, or None.
  """
  name: str
  cluster: str
  build: Callable[[Any], Any]
  fixed_replicas: Optional[int] = None
  logical_cpu_replicas: bool = False
  host_iterator_input: bool = False
  lockstep_workers: bool = False
  asynchronous: bool = False
  auto_steps_per_call: Optional[int] = None
  elastic: bool = False
  loss_scaling: bool = True
  xla: bool = True
  unavailable: Callable[[Any, Any], Optional[str]] = (
      lambda config, environment: None)

  @property
  def multi_worker(self) -> bool:
    return self.cluster != ONE_PROCESS

  def cluster_shape(self, num_workers: int, num_ps: int) -> Dict[str, int]:
    """TF task type -> task count ({}: no TF cluster)."""
    if self.cluster == WORKERS:
      return {'worker': num_workers}
    if self.cluster == PARAMETER_SERVERS:
      return {'chief': 1, 'worker': num_workers, 'ps': num_ps}
    return {}

  def mismatch(self, num_workers: int, num_ps: int) -> Optional[str]:
    """Why a cluster of `num_workers` workers and `num_ps` ps tasks is not
    this strategy's (None: it fits)."""
    if num_ps and self.cluster != PARAMETER_SERVERS:
      return (f'num_ps={num_ps} needs a strategy with parameter servers, not '
              f'strategy={self.name!r}; allowed with num_ps > 0: '
              f"{('auto',) + names(cluster=PARAMETER_SERVERS)}")
    if num_workers > 1 and not self.multi_worker:
      return (f'num_workers={num_workers} needs a multi-worker strategy, not '
              f'strategy={self.name!r}; allowed with num_workers > 1: '
              f"{('auto',) + names(multi_worker=True)}")
    return None


_REGISTRY: Dict[str, StrategySpec] = {}


def register(spec: StrategySpec) -> StrategySpec:
  if spec.cluster not in CLUSTERS:
    raise ValueError(f'cluster={spec.cluster!r} of strategy {spec.name!r} is '
                     f'not one of {CLUSTERS}.')
  if spec.name in _REGISTRY or spec.name == 'auto':
    raise ValueError(f'A strategy named {spec.name!r} is registered already.')
  _REGISTRY[spec.name] = spec
  return spec


@contextlib.contextmanager
def registered(spec: StrategySpec) -> Iterator[StrategySpec]:
  """`spec` registered for the duration (tests of a new strategy)."""
  register(spec)
  try:
    yield spec
  finally:
    del _REGISTRY[spec.name]


def get(name: str) -> StrategySpec:
  if name not in _REGISTRY:
    raise ValueError(f'strategy={name!r} is not one of {names()}.')
  return _REGISTRY[name]


def names(**fields) -> Tuple[str, ...]:
  """The registered strategies whose spec has the given field values (the
  `multi_worker` property included)."""
  return tuple(name for name, spec in _REGISTRY.items()
               if all(getattr(spec, key) == value
                      for key, value in fields.items()))


# --- The built-in strategies.


def tpu_available(config) -> bool:
  """True where a TPU resolver has something to resolve, checked without
  contacting any service: an explicit address, the resolver's environment
  variables, or the device files of a TPU VM."""
  return bool(config.tpu_address or
              any(os.environ.get(name) for name in TPU_ENV_VARS) or
              glob.glob(TPU_DEVICE_GLOB))


def _replica_devices(config):
  """GPUs where there are any, else `logical_cpu_devices` CPU devices (the
  process may hold more, GPipe stages need a device each; the replicas take
  the first ones)."""
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


def _one_device(config):
  del config  # One device: the first GPU, else the CPU.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  gpus = tf.config.list_logical_devices('GPU')
  return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else '/cpu:0')


def _mirrored(config):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.distribute.MirroredStrategy(devices=_replica_devices(config))


def _central_storage(config):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.distribute.experimental.CentralStorageStrategy(
      compute_devices=_replica_devices(config), parameter_device='/cpu:0')


def _multi_worker_mirrored(config):
  del config  # The cluster comes from TF_CONFIG.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.distribute.MultiWorkerMirroredStrategy()


def _parameter_server(config):
  del config  # The cluster comes from TF_CONFIG.
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  return tf.distribute.experimental.ParameterServerStrategy(resolver)


def _tpu(config):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
      tpu=config.tpu_address or None)
  tf.config.experimental_connect_to_cluster(resolver)
  tf.tpu.experimental.initialize_tpu_system(resolver)
  return tf.distribute.TPUStrategy(resolver)


def _tpu_unavailable(config, environment) -> Optional[str]:
  if environment.tpu_available:
    return None
  return ("strategy='tpu' needs a TPU, and none was found: no tpu_address in "
          f'the distribution config, none of {TPU_ENV_VARS} set, no '
          f'{TPU_DEVICE_GLOB} devices. Use a TPU VM, set tpu_address, or '
          f'choose one of {tuple(n for n in names() if n != "tpu")}.')


def _parameter_server_unavailable(config, environment) -> Optional[str]:
  if launchers.starts_processes(config.launcher) or (
      environment.cluster_size('ps') and environment.cluster_size('worker')):
    return None
  return (f"strategy='parameter_server' with launcher={config.launcher!r} "
          'needs a TF_CONFIG with ps and worker tasks from the orchestrator; '
          f'found cluster {environment.tf_config.get("cluster", {})}. Use '
          f'launcher={launchers.LOCAL.name!r} to start a local cluster.')


register(StrategySpec('one_device', ONE_PROCESS, _one_device,
                      fixed_replicas=1, host_iterator_input=True))
register(StrategySpec('mirrored', ONE_PROCESS, _mirrored,
                      logical_cpu_replicas=True, host_iterator_input=True))
register(StrategySpec('multi_worker_mirrored', WORKERS, _multi_worker_mirrored,
                      lockstep_workers=True, auto_steps_per_call=1,
                      elastic=True))
# steps_per_execution for parameter servers is the closures scheduled
# between two joins; checkpoints and preemption checks happen at joins, and
# closures run asynchronously, so no per-step round trip is there to size.
register(StrategySpec('parameter_server', PARAMETER_SERVERS,
                      _parameter_server, asynchronous=True,
                      auto_steps_per_call=50, loss_scaling=False, xla=False,
                      unavailable=_parameter_server_unavailable))
register(StrategySpec('central_storage', ONE_PROCESS, _central_storage,
                      logical_cpu_replicas=True, loss_scaling=False,
                      xla=False))
# TPUs compute in bfloat16, which needs no loss scaling.
register(StrategySpec('tpu', ONE_PROCESS, _tpu, loss_scaling=False,
                      unavailable=_tpu_unavailable))
