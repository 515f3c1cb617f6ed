"""HighPerfTrainer's distribution config: one JSON-serializable exec property.

Pure Python (no TFX, no TensorFlow) so that the component constructor can
reject a bad config at pipeline-definition time and the tests run in
milliseconds. Every error names the bad value and what is allowed instead.
"""

import dataclasses
from typing import Any, Dict, Optional, Tuple, Union

from components.json_config import JsonConfig, check_choice, check_int
from components.json_config import is_int, is_number
from components.offload.config import OffloadConfig
from components.trainer.common import membership
from components.trainer.common import cpu_threads
from components.trainer.launchers import registry as launchers
from components.trainer.strategies import registry

# Placement-group strategies on a Ray cluster: SPREAD puts each task on
# another node where it can, PACK fills nodes first (both are soft: a task
# lands where resources remain when nodes are short).
RAY_PLACEMENTS = ('SPREAD', 'PACK')
# Resources one Ray actor (one TF task) reserves, and their defaults.
RAY_RESOURCE_KEYS = {'cpus': 1, 'gpus': 0, 'memory_mb': 0}
MODES = ('auto', 'managed', 'run_fn')
# Keras dtype policies a managed training may run in (`precision`), and
# `auto` (opt-in: the hardware's fast policy, see `managed.precision`).
PRECISIONS = ('float32', 'mixed_bfloat16', 'mixed_float16', 'auto')
# Whether the per-replica step is compiled with XLA (`xla`); `auto` measures.
XLA_SETTINGS = ('off', 'on', 'auto')

DEFAULT_PER_REPLICA_BATCH_SIZE = 32
# Largest `seed`: NumPy's global seed is a 32-bit unsigned int.
MAX_SEED = 2**32 - 1
AUTO = 'auto'
# Field metadata of the options that do not change the training trajectory
# (where and how fast it runs: the same updates on the same batches); they
# are left out of the checkpoint fingerprint, so changing them resumes.
TRAJECTORY_NEUTRAL = {'trajectory_neutral': True}


def strategies() -> Tuple[str, ...]:
  """What `strategy` may be: `auto` or a registered strategy."""
  return (AUTO,) + registry.names()


@dataclasses.dataclass
class RayConfig(JsonConfig):
  """Where and how a cluster's tasks run on Ray (launcher `ray`).

  Attributes:
    address: The Ray cluster: `auto`, `host:port` of its head, or
      `ray://host:port`; empty: the RAY_ADDRESS environment variable, else
      `auto`.
    placement: RAY_PLACEMENTS, how the tasks' placement group spreads them
      over the nodes.
    resources: What each task reserves on its node: `cpus` (default 1),
      `gpus` (default 0), `memory_mb` (default 0: no reservation).
  """
  OPTIONS_NAME = 'distribution.ray'
  address: str = ''
  placement: str = 'SPREAD'
  resources: Dict[str, float] = dataclasses.field(default_factory=dict)

  def validate(self) -> 'RayConfig':
    if not isinstance(self.address, str):
      raise ValueError(f'ray.address={self.address!r} must be a string '
                       "('auto', 'host:port' or 'ray://host:port').")
    check_choice('ray.placement', self.placement, RAY_PLACEMENTS)
    if not isinstance(self.resources, dict):
      raise ValueError(f'ray.resources={self.resources!r} must be a dict '
                       f'with keys from {sorted(RAY_RESOURCE_KEYS)}.')
    unknown = sorted(set(self.resources) - set(RAY_RESOURCE_KEYS))
    if unknown:
      raise ValueError(f'Unknown ray.resources key(s) {unknown}; allowed: '
                       f'{sorted(RAY_RESOURCE_KEYS)}.')
    for key, value in self.resources.items():
      if not is_number(value) or value < 0:
        raise ValueError(f'ray.resources[{key!r}]={value!r} must be a finite '
                         'number >= 0.')
    if not any(self.task_resources().values()):
      raise ValueError(f'ray.resources={self.resources!r} reserves '
                       'nothing; each task needs cpus, gpus or memory_mb > 0.')
    return self

  def task_resources(self) -> Dict[str, float]:
    """resources with the defaults filled in."""
    return {**RAY_RESOURCE_KEYS, **self.resources}


@dataclasses.dataclass
class DistributionConfig(JsonConfig):
  """How HighPerfTrainer distributes training.

  Attributes:
    strategy: One of `strategies()`; `auto` decides from the environment (see
      `strategies.choice.choose_strategy`).
    mode: `managed` (the module provides `build_model`, the executor owns the
      loop), `run_fn` (the stock contract) or `auto`: managed when the module
      has `build_model` and no `run_fn` parameter was given.
    launcher: `local` starts and supervises the training processes on this
      machine (one process, or a localhost cluster for the multi-worker
      strategies); `in_process` trains inside the executor's process, for
      orchestrators that already run one pod per task and set TF_CONFIG;
      `ray` runs each task of the cluster in a Ray actor on an existing Ray
      cluster, across its nodes (`cluster.ray_backend`); `auto` (the default)
      is `local`, or `in_process` where an output or the checkpoint root
      lives in one process (`ram://`), which child processes cannot see
      (see `resolve.resolve_launcher`).
    num_workers: Worker processes of a cluster the launcher starts (launcher
      `local` or `ray`).
    num_ps: Parameter-server processes of a cluster the launcher starts
      (launcher `local` or `ray`, strategy `parameter_server` or `auto`).
    min_workers: Below num_workers, an elastic MultiWorkerMirrored cluster
      (launcher `ray`) that may run with fewer workers, the same update batch
      and data order (`membership`); None: num_workers.
    ray: Where and how the tasks run on Ray (launcher `ray`): `RayConfig`.
    logical_cpu_devices: Where there is no GPU, split the CPU into this many
      logical devices so that `mirrored` / `central_storage` run that many
      replicas; 0 leaves the CPU as one device.
    per_replica_batch_size: Examples per replica per step; the global batch is
      this times the number of replicas. Default 32 when neither batch size
      is set.
    global_batch_size: Alternatively, the examples per step over all
      replicas; must divide evenly by the number of replicas.
    gradient_accumulation_steps: Micro-steps whose gradients are summed
      before one optimizer update (same result as a k-times larger batch).
    train_epochs: Train for this many passes over the train split instead of
      `train_args.num_steps` (0: use the steps).
    tpu_address: TPU name or grpc address for the TPU cluster resolver.
    steps_per_execution: Training steps run inside one traced call (managed
      mode), so the host round trip of a call and its loss read-back are
      paid once per call: an int >= 1, or 'auto', which measures the
      per-call overhead against the time of a step and picks the length
      (`call_size`), keeping a call under about 2 s. Checkpoints,
      preemption checks and progress happen between calls; a call never
      crosses a `save_every_steps` boundary, so checkpoints stay exactly
      where they would be with 1. For parameter servers it is the
      closures scheduled between two joins. A strategy's registry entry may
      fix what 'auto' means for it (`auto_steps_per_call`: 50 for
      parameter servers, 1 for multi_worker_mirrored's lockstep workers).
    intra_op_threads: Threads of TensorFlow's op pool in each training
      process: an int >= 1, 0 (TensorFlow's default, every core) or 'auto'
      (`cpu_threads`: one core left to the input pipeline without a GPU).
    precision: The Keras dtype policy of the model when the module sets
      none (a policy the module sets, at import or in `build_model`, wins):
      one of PRECISIONS. `mixed_float16` trains with dynamic loss scaling
      as `fit` does; `auto` (opt-in, as it changes numerics) picks bfloat16
      where the hardware computes it natively (CPUs with AVX512-BF16 or
      AMX, TPUs, GPUs of compute capability >= 8.0), float16 on GPUs of
      7.x, float32 elsewhere (`managed.precision.choose`).
    xla: Whether the per-replica step is compiled with XLA when the module's
      `compile` says nothing (its `jit_compile` wins): `off`, `on`, or
      `auto`, which times a few steps each way at the start, keeps the
      faster and falls back where XLA cannot compile the model; a resume
      keeps the choice saved with the checkpoints (`managed.xla`).
    data_partitions: Partitions of the data order (`data.data_order`):
      update j trains batch j of each, and each worker reads only its own.
      None: one per replica of the full-size cluster (one per micro-batch
      of its update where an elastic worker count does not divide
      num_workers). Set it to keep one data order across cluster sizes; a
      multiple of every replica count the training runs with.
    seed: Seeds Python, NumPy and TensorFlow in every training process
      (`tf.keras.utils.set_random_seed`) before the model is built, and the
      data order; None: unseeded initializers, a fixed data order.
    offload: Where the train split's partitions are produced: by the
      training process itself (the default), or by tf.data service cells on
      other hosts or cores (`OffloadConfig`, `components/offload`); the
      same rows every update either way.
    deterministic: Turns on TF op determinism in every training process, so
      that two runs with the same seed end with bit-identical weights; needs
      a seed, and a synchronous strategy.
  """
  OPTIONS_NAME = 'distribution'
  RENAMED = {'ray_address': 'ray.address', 'ray_placement': 'ray.placement',
             'ray_resources': 'ray.resources',
             'timeout_s': 'fault_tolerance.timeout_s'}
  strategy: str = 'auto'
  mode: str = 'auto'
  launcher: str = dataclasses.field(
      default=AUTO, metadata=TRAJECTORY_NEUTRAL)
  num_workers: int = 1
  num_ps: int = 0
  min_workers: Optional[int] = None
  ray: RayConfig = dataclasses.field(default_factory=lambda: RayConfig(),
                                     metadata=TRAJECTORY_NEUTRAL)
  logical_cpu_devices: int = 0
  per_replica_batch_size: Optional[int] = None
  global_batch_size: Optional[int] = None
  gradient_accumulation_steps: int = 1
  train_epochs: int = 0
  tpu_address: str = ''
  steps_per_execution: Union[int, str] = dataclasses.field(
      default=AUTO, metadata=TRAJECTORY_NEUTRAL)
  intra_op_threads: Union[int, str] = AUTO
  precision: str = 'float32'
  xla: str = dataclasses.field(default='off', metadata=TRAJECTORY_NEUTRAL)
  data_partitions: Optional[int] = None
  seed: Optional[int] = None
  deterministic: bool = False
  offload: OffloadConfig = dataclasses.field(
      default_factory=lambda: OffloadConfig(), metadata=TRAJECTORY_NEUTRAL)

  def validate(self) -> 'DistributionConfig':
    """Raises ValueError on the first inconsistency; returns self."""
    check_choice('strategy', self.strategy, strategies())
    check_choice('mode', self.mode, MODES)
    check_choice('launcher', self.launcher, (AUTO,) + launchers.names())
    for name in ('num_workers', 'gradient_accumulation_steps'):
      check_int(name, getattr(self, name), minimum=1)
    for name in ('num_ps', 'logical_cpu_devices', 'train_epochs'):
      check_int(name, getattr(self, name), minimum=0)
    if self.data_partitions is not None:
      check_int('data_partitions', self.data_partitions, minimum=1)
    if self.steps_per_execution != AUTO and not is_int(
        self.steps_per_execution, minimum=1):
      raise ValueError(
          f'steps_per_execution={self.steps_per_execution!r} must be an '
          f"integer >= 1 or {AUTO!r}.")
    cpu_threads.check(self.intra_op_threads)
    self._validate_compute()
    if not isinstance(self.tpu_address, str):
      raise ValueError(f'tpu_address={self.tpu_address!r} must be a string.')
    self._validate_ray()
    self._validate_offload()
    self._validate_seed()
    self._validate_cluster()
    self._validate_batch()
    membership.check(
        num_workers=self.num_workers, min_workers=self.min_workers,
        num_ps=self.num_ps, accumulation=self.gradient_accumulation_steps,
        strategy=self.strategy, launcher=self.launcher,
        data_partitions=self.data_partitions)
    return self

  @property
  def elastic(self) -> bool:
    return membership.is_elastic(self.num_workers, self.min_workers)

  @property
  def asks_for_parameter_servers(self) -> bool:
    """The config asks for asynchronous training: parameter-server
    processes, or an asynchronous strategy. (`auto` may still find ps tasks
    in an orchestrator's TF_CONFIG, known only when a process starts.)"""
    return bool(self.num_ps) or (
        self.strategy != AUTO and registry.get(self.strategy).asynchronous)

  def _validate_ray(self) -> None:
    if not isinstance(self.ray, RayConfig):
      raise ValueError(f'ray={self.ray!r} must be an object with keys from '
                       f'{[f.name for f in dataclasses.fields(RayConfig)]}.')
    self.ray.validate()
    if not launchers.on_ray_cluster(self.launcher) and (
        self.ray != RayConfig()):
      raise ValueError(
          f'ray={self.ray.to_dict()} needs a launcher on a Ray cluster '
          f'({launchers.names(ray_cluster=True)}), not '
          f'launcher={self.launcher!r}.')

  def _validate_offload(self) -> None:
    if not isinstance(self.offload, OffloadConfig):
      raise ValueError(
          f'offload={self.offload!r} must be an object with keys from '
          f'{[f.name for f in dataclasses.fields(OffloadConfig)]}.')
    self.offload.validate()
    if self.offload.enabled and self.asks_for_parameter_servers:
      raise ValueError(
          f'offload.cells={self.offload.cells!r} with strategy='
          f'{self.strategy!r}, num_ps={self.num_ps}: cells serve the '
          "synchronous strategies' data order, which parameter-server "
          'workers do not read; use offload.cells=0 or a synchronous '
          'strategy.')

  def _validate_compute(self) -> None:
    check_choice('precision', self.precision, PRECISIONS)
    check_choice('xla', self.xla, XLA_SETTINGS)
    if self.xla == 'on' and self.strategy != AUTO and (
        not registry.get(self.strategy).xla):
      raise ValueError(
          f"xla='on' with strategy={self.strategy!r}: its variables live on "
          'other devices than the replicas\' (parameter servers, central '
          "storage), which XLA cannot read; use xla='off' or a strategy "
          f'from {registry.names(xla=True)}.')
    if self.mode == 'run_fn' and (self.precision, self.xla) != (
        'float32', 'off'):
      raise ValueError(
          f'precision={self.precision!r}, xla={self.xla!r} apply to the '
          "managed loop, not mode='run_fn': a run_fn sets its own dtype "
          "policy and compile(jit_compile=...); leave them 'float32' and "
          "'off'.")
    if self.precision == 'mixed_float16' and self.strategy != AUTO and (
        not registry.get(self.strategy).loss_scaling):
      raise ValueError(
          f"precision='mixed_float16' needs loss scaling, which Keras' "
          f'LossScaleOptimizer does not support under strategy='
          f'{self.strategy!r}; use precision=\'mixed_bfloat16\' (no loss '
          'scaling needed) or one of the strategies '
          f'{registry.names(loss_scaling=True)}.')

  def _validate_seed(self) -> None:
    if self.seed is not None and not (is_int(self.seed, minimum=0) and
                                      self.seed <= MAX_SEED):
      raise ValueError(f'seed={self.seed!r} must be None or an integer in '
                       f'[0, {MAX_SEED}] (what NumPy accepts).')
    if not isinstance(self.deterministic, bool):
      raise ValueError(f'deterministic={self.deterministic!r} must be true '
                       'or false.')
    if self.deterministic and self.seed is None:
      raise ValueError(
          'deterministic=True needs a seed: with op determinism on, an '
          'unseeded random op fails, and unseeded initializers differ per '
          'run anyway; set seed (e.g. 0).')
    if self.deterministic and self.asks_for_parameter_servers:
      raise ValueError(
          f'deterministic=True with strategy={self.strategy!r}, '
          f'num_ps={self.num_ps}: parameter-server training is asynchronous '
          '(its result depends on the order in which the workers\' updates '
          'arrive), so no run repeats another; use a synchronous strategy, '
          'or deterministic=False (a seed alone still seeds the '
          'coordinator).')

  def _validate_cluster(self) -> None:
    if not launchers.starts_processes(self.launcher) and (
        self.num_workers != 1 or self.num_ps != 0):
      raise ValueError(
          f'num_workers={self.num_workers}, num_ps={self.num_ps} need a '
          f'launcher that starts processes '
          f'({launchers.names(starts_processes=True)}): with '
          f'launcher={self.launcher!r} the orchestrator\'s TF_CONFIG defines '
          'the cluster; allowed here: num_workers=1, num_ps=0.')
    spec = None if self.strategy == AUTO else registry.get(self.strategy)
    mismatch = spec and spec.mismatch(self.num_workers, self.num_ps)
    if mismatch:
      raise ValueError(f'{mismatch}.')
    if (spec and spec.cluster == registry.PARAMETER_SERVERS and
        launchers.starts_processes(self.launcher) and not self.num_ps):
      raise ValueError(
          f'strategy={self.strategy!r} with launcher={self.launcher!r} needs '
          f'num_ps >= 1, got num_ps={self.num_ps}.')
    if self.logical_cpu_devices > 1 and spec and not spec.logical_cpu_replicas:
      raise ValueError(
          f'logical_cpu_devices={self.logical_cpu_devices} makes replicas only '
          f'for strategies {strategies_with_logical_cpus()}, not '
          f'strategy={self.strategy!r}.')
    if self.tpu_address and self.strategy not in ('auto', 'tpu'):
      raise ValueError(f'tpu_address={self.tpu_address!r} needs strategy tpu '
                       f'(or auto), not strategy={self.strategy!r}.')

  def _validate_batch(self) -> None:
    if (self.per_replica_batch_size is not None and
        self.global_batch_size is not None):
      raise ValueError(
          f'Set per_replica_batch_size ({self.per_replica_batch_size}) or '
          f'global_batch_size ({self.global_batch_size}), not both.')
    for name in ('per_replica_batch_size', 'global_batch_size'):
      if getattr(self, name) is not None:
        check_int(name, getattr(self, name), minimum=1)
    replicas = self.expected_replicas()
    if replicas is not None:
      self.per_replica_batch(replicas)

  def expected_replicas(self) -> Optional[int]:
    """Replica count known from the config alone (CPU case), else None."""
    if self.strategy == AUTO:
      return None
    spec = registry.get(self.strategy)
    if spec.cluster == registry.WORKERS and launchers.starts_processes(
        self.launcher):
      return self.num_workers
    if spec.logical_cpu_replicas:
      return self.logical_cpu_devices or None
    return spec.fixed_replicas

  def per_replica_batch(self, num_replicas: int) -> int:
    """Per-replica batch for `num_replicas` replicas in sync."""
    if self.global_batch_size is None:
      return self.per_replica_batch_size or DEFAULT_PER_REPLICA_BATCH_SIZE
    if self.global_batch_size % num_replicas:
      raise ValueError(
          f'global_batch_size={self.global_batch_size} does not divide evenly '
          f'by the {num_replicas} replicas of strategy {self.strategy!r}; '
          f'use a multiple of {num_replicas} or set per_replica_batch_size.')
    return self.global_batch_size // num_replicas

  def global_batch(self, num_replicas: int) -> int:
    """Examples per (micro-)step over all `num_replicas` replicas."""
    return self.per_replica_batch(num_replicas) * num_replicas


def strategies_with_logical_cpus() -> Tuple[str, ...]:
  return (AUTO,) + registry.names(logical_cpu_replicas=True)


def trajectory(config: DistributionConfig) -> Dict[str, Any]:
  """The options that define the training's trajectory (the checkpoint
  fingerprint's part of the config)."""
  return {field.name: getattr(config, field.name)
          for field in dataclasses.fields(config)
          if not field.metadata.get('trajectory_neutral')}


# What a partition plan's single pipeline runs under (`auto` picks
# one_device for it).
PLAN_STRATEGIES = (AUTO, 'one_device')


def check_partition_plan(strategy: str, replicas: int, accumulation: int,
                         trainer_batch: int,
                         plan_batch_size: Optional[int]) -> None:
  """What a partition plan needs of the trainer: checked at construction
  (from the config) and again in the training process (with the replicas and
  accumulation it found).

  The pipeline is one replica that splits the global batch into the plan's
  micro-batches itself; `plan_batch_size` is None when the plan's batch is
  not known before the run (a plan not made in this pipeline).
  """
  if strategy not in PLAN_STRATEGIES:
    raise ValueError(
        f'A partition plan runs one pipeline over its own stage devices; '
        f'strategy must be one of {PLAN_STRATEGIES}, got {strategy!r}.')
  if replicas != 1:
    raise ValueError(
        f'A partition plan runs one pipeline over its own stage devices; it '
        f'needs one replica, got {replicas}.')
  if accumulation != 1:
    raise ValueError(
        f'gradient_accumulation_steps={accumulation} with a partition plan: '
        "the pipeline already accumulates over the plan's micro-batches; "
        'use 1.')
  if plan_batch_size is not None and trainer_batch != plan_batch_size:
    raise ValueError(
        f"The partition plan is made for batch_size {plan_batch_size}, but "
        f'the trainer\'s global batch is {trainer_batch}; set '
        f'global_batch_size={plan_batch_size} (or the partitioner\'s '
        f'batch_size to {trainer_batch}).')
