"""HighPerfTrainer's distribution config: one JSON-serializable exec property.

Pure Python (no TFX, no TensorFlow) so that the component constructor can
reject a bad config at pipeline-definition time and the tests run in
milliseconds. Every error names the bad value and what is allowed instead.
"""

import dataclasses
from typing import Any, Dict, Optional, Tuple, Union

from components.json_config import JsonConfig, check_int, is_int, is_number
from components.trainer.process import cpu_threads
from components.trainer.cluster import membership

STRATEGIES = ('auto', 'one_device', 'mirrored', 'multi_worker_mirrored',
              'parameter_server', 'central_storage', 'tpu')
LAUNCHERS = ('auto', 'in_process', 'local', 'ray')
# Launchers that start the cluster's processes themselves from num_workers /
# num_ps ('auto' is 'local' unless outputs live in one process).
CLUSTER_LAUNCHERS = ('auto', 'local', 'ray')
# Placement-group strategies for launcher 'ray': SPREAD puts each task on
# another node where it can, PACK fills nodes first (both are soft: a task
# lands where resources remain when nodes are short).
RAY_PLACEMENTS = ('SPREAD', 'PACK')
# Resources one Ray actor (one TF task) reserves, and their defaults.
RAY_RESOURCE_KEYS = {'cpus': 1, 'gpus': 0, 'memory_mb': 0}
MODES = ('auto', 'managed', 'run_fn')
# What `auto` resolves to.
CONCRETE_STRATEGIES = tuple(s for s in STRATEGIES if s != 'auto')

# Strategies that run in one process (one worker); only these may split the
# CPU into logical devices or run without a cluster.
SINGLE_WORKER_STRATEGIES = ('one_device', 'mirrored', 'central_storage', 'tpu')
MULTI_WORKER_STRATEGIES = ('multi_worker_mirrored', 'parameter_server')
# Strategies whose replicas can be logical CPU devices (`auto` may pick
# `mirrored` from `logical_cpu_devices`).
LOGICAL_CPU_STRATEGIES = ('auto', 'mirrored', 'central_storage')

DEFAULT_PER_REPLICA_BATCH_SIZE = 32
# Largest `seed`: NumPy's global seed is a 32-bit unsigned int.
MAX_SEED = 2**32 - 1
AUTO = 'auto'


@dataclasses.dataclass
class DistributionConfig(JsonConfig):
  """How HighPerfTrainer distributes training.

  Attributes:
    strategy: One of STRATEGIES; `auto` decides from the environment (see
      `strategy.choose_strategy`).
    mode: `managed` (the module provides `build_model`, the executor owns the
      loop), `run_fn` (the stock contract) or `auto`: managed when the module
      has `build_model` and no `run_fn` parameter was given.
    launcher: `local` starts and supervises the training processes on this
      machine (one process, or a localhost cluster for the multi-worker
      strategies); `in_process` trains inside the executor's process, for
      orchestrators that already run one pod per task and set TF_CONFIG;
      `ray` runs each task of the cluster in a Ray actor on an existing Ray
      cluster, across its nodes (see `ray_launcher`); `auto` (the default)
      is `local`, or `in_process` where an output or the checkpoint root
      lives in one process (`ram://`), which child processes cannot see
      (see `resolve_launcher`).
    num_workers: Worker processes of a cluster the launcher starts (launcher
      `local` or `ray`).
    num_ps: Parameter-server processes of a cluster the launcher starts
      (launcher `local` or `ray`, strategy `parameter_server` or `auto`).
    min_workers: Below num_workers, an elastic MultiWorkerMirrored cluster
      (launcher `ray`) that may run with fewer workers, the same update batch
      and data order (`membership`); None: num_workers.
    ray_address: The Ray cluster (launcher `ray`): `auto`, `host:port` of
      its head, or `ray://host:port`; empty: the RAY_ADDRESS environment
      variable, else `auto`.
    ray_placement: RAY_PLACEMENTS, how the tasks' placement group spreads
      them over the nodes (launcher `ray`).
    ray_resources: What each task reserves on its node (launcher `ray`):
      `cpus` (default 1), `gpus` (default 0), `memory_mb` (default 0: no
      reservation).
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
    timeout_s: Wall-clock limit of the whole training (all restarts); the
      cluster is killed and the component fails past it. 0: no limit.
    steps_per_execution: Training steps run inside one traced call (managed
      mode), so the host round trip of a call and its loss read-back are
      paid once per call: an int >= 1, or 'auto', which measures the
      per-call overhead against the time of a step and picks the length
      (`call_size`), keeping a call under about 2 s. Checkpoints,
      preemption checks and progress happen between calls; a call never
      crosses a `save_every_steps` boundary, so checkpoints stay exactly
      where they would be with 1. For parameter servers it is the
      closures scheduled between two joins ('auto': 50); for
      multi_worker_mirrored 'auto' is 1 (a multi-step call hung with
      workers reading gs:// here).
    intra_op_threads: Threads of TensorFlow's op pool in each training
      process: an int >= 1, 0 (TensorFlow's default, every core) or 'auto'
      (`cpu_threads`: one core left to the input pipeline without a GPU).
    seed: Seeds Python, NumPy and TensorFlow in every training process
      (`tf.keras.utils.set_random_seed`) before the model is built, and the
      data order; None: unseeded initializers, a fixed data order.
    deterministic: Turns on TF op determinism in every training process, so
      that two runs with the same seed end with bit-identical weights; needs
      a seed, and a synchronous strategy.
  """
  OPTIONS_NAME = 'distribution'
  strategy: str = 'auto'
  mode: str = 'auto'
  launcher: str = AUTO
  num_workers: int = 1
  num_ps: int = 0
  min_workers: Optional[int] = None
  ray_address: str = ''
  ray_placement: str = 'SPREAD'
  ray_resources: Dict[str, float] = dataclasses.field(default_factory=dict)
  logical_cpu_devices: int = 0
  per_replica_batch_size: Optional[int] = None
  global_batch_size: Optional[int] = None
  gradient_accumulation_steps: int = 1
  train_epochs: int = 0
  tpu_address: str = ''
  timeout_s: float = 0
  steps_per_execution: Union[int, str] = AUTO
  intra_op_threads: Union[int, str] = AUTO
  seed: Optional[int] = None
  deterministic: bool = False

  def validate(self) -> 'DistributionConfig':
    """Raises ValueError on the first inconsistency; returns self."""
    _check_choice('strategy', self.strategy, STRATEGIES)
    _check_choice('mode', self.mode, MODES)
    _check_choice('launcher', self.launcher, LAUNCHERS)
    for name in ('num_workers', 'gradient_accumulation_steps'):
      check_int(name, getattr(self, name), minimum=1)
    for name in ('num_ps', 'logical_cpu_devices', 'train_epochs'):
      check_int(name, getattr(self, name), minimum=0)
    if not is_number(self.timeout_s) or self.timeout_s < 0:
      raise ValueError(f'timeout_s={self.timeout_s!r} must be a finite number '
                       '>= 0 (0: no limit).')
    if self.steps_per_execution != AUTO and not is_int(
        self.steps_per_execution, minimum=1):
      raise ValueError(
          f'steps_per_execution={self.steps_per_execution!r} must be an '
          f"integer >= 1 or {AUTO!r}.")
    cpu_threads.check(self.intra_op_threads)
    if not isinstance(self.tpu_address, str):
      raise ValueError(f'tpu_address={self.tpu_address!r} must be a string.')
    self._validate_ray()
    self._validate_seed()
    self._validate_cluster()
    self._validate_batch()
    membership.check(
        num_workers=self.num_workers, min_workers=self.min_workers,
        num_ps=self.num_ps, accumulation=self.gradient_accumulation_steps,
        strategy=self.strategy, launcher=self.launcher)
    return self

  @property
  def elastic(self) -> bool:
    return membership.is_elastic(self.num_workers, self.min_workers)

  def _validate_ray(self) -> None:
    if not isinstance(self.ray_address, str):
      raise ValueError(f'ray_address={self.ray_address!r} must be a string '
                       "('auto', 'host:port' or 'ray://host:port').")
    _check_choice('ray_placement', self.ray_placement, RAY_PLACEMENTS)
    if not isinstance(self.ray_resources, dict):
      raise ValueError(f'ray_resources={self.ray_resources!r} must be a dict '
                       f'with keys from {sorted(RAY_RESOURCE_KEYS)}.')
    unknown = sorted(set(self.ray_resources) - set(RAY_RESOURCE_KEYS))
    if unknown:
      raise ValueError(f'Unknown ray_resources key(s) {unknown}; allowed: '
                       f'{sorted(RAY_RESOURCE_KEYS)}.')
    for key, value in self.ray_resources.items():
      if not is_number(value) or value < 0:
        raise ValueError(f'ray_resources[{key!r}]={value!r} must be a finite '
                         'number >= 0.')
    if not any(self.ray_task_resources().values()):
      raise ValueError(f'ray_resources={self.ray_resources!r} reserves '
                       'nothing; each task needs cpus, gpus or memory_mb > 0.')
    if self.launcher != 'ray':
      changed = {name: getattr(self, name) for name, default in (
          ('ray_address', ''), ('ray_placement', 'SPREAD'),
          ('ray_resources', {})) if getattr(self, name) != default}
      if changed:
        raise ValueError(f'{changed} need launcher=\'ray\', not '
                         f'launcher={self.launcher!r}.')

  def ray_task_resources(self) -> Dict[str, float]:
    """ray_resources with the defaults filled in."""
    return {**RAY_RESOURCE_KEYS, **self.ray_resources}

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
    if self.deterministic and (self.strategy == 'parameter_server' or
                               self.num_ps):
      raise ValueError(
          f'deterministic=True with strategy={self.strategy!r}, '
          f'num_ps={self.num_ps}: parameter-server training is asynchronous '
          '(its result depends on the order in which the workers\' updates '
          'arrive), so no run repeats another; use a synchronous strategy, '
          'or deterministic=False (a seed alone still seeds the '
          'coordinator).')

  def _validate_cluster(self) -> None:
    if self.launcher == 'in_process' and (self.num_workers != 1 or
                                          self.num_ps != 0):
      raise ValueError(
          f'num_workers={self.num_workers}, num_ps={self.num_ps} need '
          "launcher='local': with launcher='in_process' the orchestrator's "
          'TF_CONFIG defines the cluster; allowed here: num_workers=1, '
          'num_ps=0.')
    if self.num_ps and self.strategy not in ('auto', 'parameter_server'):
      raise ValueError(
          f'num_ps={self.num_ps} needs strategy parameter_server (or auto), '
          f'not strategy={self.strategy!r}; allowed with num_ps > 0: '
          "('auto', 'parameter_server').")
    if (self.strategy == 'parameter_server' and
        self.launcher in CLUSTER_LAUNCHERS and not self.num_ps):
      raise ValueError(
          f"strategy='parameter_server' with launcher={self.launcher!r} needs "
          f'num_ps >= 1, got num_ps={self.num_ps}.')
    if self.num_workers > 1 and self.strategy in SINGLE_WORKER_STRATEGIES:
      raise ValueError(
          f'num_workers={self.num_workers} needs a multi-worker strategy, not '
          f'strategy={self.strategy!r}; allowed with num_workers > 1: '
          f"{('auto',) + MULTI_WORKER_STRATEGIES}.")
    if (self.logical_cpu_devices > 1 and
        self.strategy not in LOGICAL_CPU_STRATEGIES):
      raise ValueError(
          f'logical_cpu_devices={self.logical_cpu_devices} makes replicas only '
          f'for strategies {LOGICAL_CPU_STRATEGIES}, not '
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
    if self.strategy == 'one_device':
      return 1
    if self.strategy in ('mirrored', 'central_storage'):
      return self.logical_cpu_devices or None
    if (self.strategy == 'multi_worker_mirrored' and
        self.launcher in CLUSTER_LAUNCHERS):
      return self.num_workers
    return None

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



def resolve_launcher(config: DistributionConfig,
                     process_local: Dict[str, str]
                    ) -> Tuple[DistributionConfig, str]:
  """The launcher `auto` stands for, and why.

  Args:
    config: The validated config.
    process_local: The outputs (and checkpoint root) that live in one
      process, by role ('model', 'model_run', 'checkpoints').
  """
  if config.launcher != AUTO:
    return config, 'requested'
  if not process_local:
    return (dataclasses.replace(config, launcher='local'),
            'outputs and checkpoints are shared storage: training runs in '
            'supervised child processes')
  if config.num_workers != 1 or config.num_ps:
    return (dataclasses.replace(config, launcher='local'),
            f'num_workers={config.num_workers}, num_ps={config.num_ps} need '
            f'child processes, though {process_local} live in this process')
  return (dataclasses.replace(config, launcher='in_process'),
          f'{sorted(process_local)} at {sorted(process_local.values())} '
          'live in this process (child processes cannot see them): training '
          "runs in the executor's process")


# What a partition plan's single pipeline runs under (`auto` picks
# one_device for it).
PLAN_STRATEGIES = ('auto', 'one_device')


def check_partition_plan(config: DistributionConfig,
                         plan_batch_size: Optional[int]) -> None:
  """What a partition plan needs of the trainer, checked before any run.

  The pipeline is one replica that splits the global batch into the plan's
  micro-batches itself; `plan_batch_size` is None when the plan's batch is
  not known before the run (a plan not made in this pipeline).
  """
  if config.strategy not in PLAN_STRATEGIES:
    raise ValueError(
        f'A partition plan runs one pipeline over its own stage devices; '
        f'strategy must be one of {PLAN_STRATEGIES}, got '
        f'{config.strategy!r}.')
  if config.gradient_accumulation_steps != 1:
    raise ValueError(
        f'gradient_accumulation_steps={config.gradient_accumulation_steps} '
        'with a partition plan: the pipeline already accumulates over the '
        "plan's micro-batches; use 1.")
  trainer_batch = config.global_batch(1)
  if plan_batch_size is not None and trainer_batch != plan_batch_size:
    raise ValueError(
        f"The partition plan is made for batch_size {plan_batch_size}, but "
        f'the trainer\'s global batch is {trainer_batch}; set '
        f'global_batch_size={plan_batch_size} (or the partitioner\'s '
        f'batch_size to {trainer_batch}).')


def resolve_mode(mode: str, *, has_build_model: bool, has_run_fn: bool,
                 run_fn_given: bool, module: str) -> str:
  """Managed or run_fn mode for a module with the given entry points.

  Args:
    mode: DistributionConfig.mode.
    has_build_model: The module defines `build_model`.
    has_run_fn: The module (or the `run_fn` parameter) provides `run_fn`.
    run_fn_given: The user passed the `run_fn` component parameter.
    module: How to name the module in errors.
  """
  _check_choice('mode', mode, MODES)
  if mode == 'auto':
    if has_build_model and not run_fn_given:
      return 'managed'
    if has_run_fn:
      return 'run_fn'
    raise ValueError(
        f'{module} defines neither build_model(hparams) (managed mode) nor '
        'run_fn(fn_args) (run_fn mode); one of them is required.')
  if mode == 'managed' and not has_build_model:
    raise ValueError(f"mode='managed' needs build_model(hparams) in {module}, "
                     'which does not define it; define it or use '
                     "mode='run_fn'.")
  if mode == 'run_fn' and not has_run_fn:
    raise ValueError(f"mode='run_fn' needs run_fn(fn_args) in {module}, which "
                     "does not define it; define it or use mode='managed'.")
  return mode


def _check_choice(name: str, value: Any, allowed) -> None:
  if value not in allowed:
    raise ValueError(f'{name}={value!r} is not one of {allowed}.')


def check_train_length(mode: str, train_steps: int, train_epochs: int) -> None:
  """Training length comes from exactly one of steps and epochs."""
  if train_steps and train_epochs:
    raise ValueError(
        f'train_args.num_steps={train_steps} and train_epochs={train_epochs} '
        'both set the training length; set only one.')
  if mode == 'managed' and not (train_steps or train_epochs):
    raise ValueError('Managed mode needs train_args.num_steps > 0 or '
                     'distribution train_epochs > 0; both are 0.')
