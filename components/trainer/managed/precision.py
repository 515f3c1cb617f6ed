"""The dtype policy a managed training computes in, and float16's loss scale.

The module's own choice wins: a global policy it sets (at import or inside
`build_model`) or a model built with a non-float32 policy. Otherwise
`distribution.precision` applies, its `auto` chosen from the hardware by
`choose` (pure). The policy is set only while the module builds the model,
so the rest of the process (evaluation copies, export) is left as it was.

float16 trains as Keras `fit` does: the model's optimizer is a
LossScaleOptimizer (`compile` wraps one under a mixed_float16 policy; a
model with float16 layers compiled otherwise gets one here), each
micro-step's loss is scaled, the summed gradients unscaled once, and a
non-finite update is skipped on every replica alike with the scale halved
(the optimizer's `apply_gradients`). Its scale is optimizer state, so every
checkpoint holds it.
"""

import contextlib
import dataclasses
from typing import Any, Dict, FrozenSet, Iterator, List, Optional, Tuple

import tensorflow as tf

from components.trainer.common.failures import TrainingConfigError
from components.trainer.common import cpu_threads

FLOAT32 = 'float32'
BFLOAT16 = 'mixed_bfloat16'
FLOAT16 = 'mixed_float16'
AUTO = 'auto'
# CPU flags (Linux /proc/cpuinfo) of native bfloat16 arithmetic.
CPU_BF16_FLAGS = frozenset({'avx512_bf16', 'amx_bf16'})
CPUINFO = '/proc/cpuinfo'


@dataclasses.dataclass(frozen=True)
class Hardware:
  """What `auto` looks at: the devices the replicas compute on."""
  tpu: bool = False
  # (major, minor) of each GPU; empty without GPUs.
  gpu_compute_capabilities: Tuple[Tuple[int, int], ...] = ()
  cpu_flags: FrozenSet[str] = frozenset()

  def describe(self) -> str:
    if self.tpu:
      return 'TPU'
    if self.gpu_compute_capabilities:
      return 'GPUs of compute capability ' + ', '.join(
          f'{major}.{minor}' for major, minor in
          sorted(set(self.gpu_compute_capabilities)))
    native = sorted(self.cpu_flags & CPU_BF16_FLAGS)
    return f"CPU with {', '.join(native)}" if native else (
        'CPU without AVX512-BF16 or AMX')


@dataclasses.dataclass(frozen=True)
class PrecisionChoice:
  """The policy trained in, who chose it and why; recorded on model_run."""
  policy: str
  source: str  # 'module', 'config' or 'auto'.
  reason: str
  loss_scaling: bool = False

  def to_dict(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)


def choose(hardware: Hardware, loss_scaling_supported: bool,
           model_weights: Optional[int] = None) -> Tuple[str, str]:
  """(policy, reason) of `precision='auto'` on `hardware`: the fastest
  policy it computes natively that the strategy can train in; on a CPU,
  float32 for a model too small for its ops to bound the step
  (`cpu_threads.compute_bound`; a model not counted gets the rule)."""
  where = hardware.describe()
  if hardware.tpu:
    return BFLOAT16, f'{where}: bfloat16 is native'
  capabilities = hardware.gpu_compute_capabilities
  if capabilities:
    if min(capabilities) >= (8, 0):
      return BFLOAT16, f'{where} (>= 8.0): bfloat16 is native'
    if min(capabilities) >= (7, 0):
      if loss_scaling_supported:
        return FLOAT16, (f'{where} (7.x): float16 tensor cores, with '
                         'dynamic loss scaling')
      return FLOAT32, (f'{where} (7.x): float16 would need loss scaling, '
                       'which this strategy does not support')
    return FLOAT32, f'{where} (< 7.0): no fast half precision'
  if hardware.cpu_flags & CPU_BF16_FLAGS:
    if model_weights is not None and not cpu_threads.compute_bound(
        model_weights):
      return FLOAT32, (f'{where}, but a model of {model_weights:,} weights '
                       'is bound by its input, not its ops: casts would cost '
                       'more than bfloat16 saves')
    return BFLOAT16, f'{where}: bfloat16 is native'
  return FLOAT32, f'{where}: no native half precision'


def cpu_flags(cpuinfo: str = CPUINFO) -> FrozenSet[str]:
  """The CPU's feature flags (empty where the file does not exist)."""
  try:
    with open(cpuinfo) as f:
      for line in f:
        if line.startswith('flags'):
          return frozenset(line.split(':', 1)[1].split())
  except OSError:
    pass
  return frozenset()


def detect_hardware(strategy: tf.distribute.Strategy) -> Hardware:
  """The hardware of this process's replicas."""
  if isinstance(strategy, tf.distribute.TPUStrategy):
    return Hardware(tpu=True)
  gpus = tf.config.list_physical_devices('GPU')
  devices = strategy.extended.worker_devices
  if gpus and any('GPU' in d.upper() for d in devices):
    return Hardware(gpu_compute_capabilities=tuple(
        tuple(tf.config.experimental.get_device_details(gpu).get(
            'compute_capability', (0, 0))) for gpu in gpus))
  return Hardware(cpu_flags=cpu_flags())


def decide(option: str, hardware_fn, loss_scaling_supported: bool,
           agree, model_weights: Optional[int] = None) -> PrecisionChoice:
  """The policy the config asks for, before the module builds; `agree(flag)`
  is every worker's vote (lockstep workers), so a cluster trains in one
  policy."""
  if option != AUTO:
    return PrecisionChoice(option, 'config',
                           f'distribution.precision={option!r}')
  policy, reason = choose(hardware_fn(), loss_scaling_supported,
                          model_weights)
  # One vote per half precision, on every worker alike.
  unanimous = {half: agree(policy == half) for half in (BFLOAT16, FLOAT16)}
  if policy != FLOAT32 and not unanimous[policy]:
    return PrecisionChoice(FLOAT32, AUTO,
                           f'{reason}; but not on every worker: float32')
  return PrecisionChoice(policy, AUTO, reason)


def _global_policy() -> str:
  return tf.keras.mixed_precision.global_policy().name


@contextlib.contextmanager
def building(policy: str) -> Iterator[Dict[str, str]]:
  """Sets the global policy to `policy` while the module builds its model,
  unless the module set one already (at import); yields a dict whose
  'module' entry is the policy the module set, if it did."""
  before = _global_policy()
  chosen: Dict[str, str] = {}
  if before != FLOAT32:
    chosen['module'] = before
  else:
    tf.keras.mixed_precision.set_global_policy(policy)
  try:
    yield chosen
    after = _global_policy()
    if 'module' not in chosen and after != policy:
      chosen['module'] = after
  finally:
    tf.keras.mixed_precision.set_global_policy(before)


def _layers(model: tf.keras.Model) -> List[tf.keras.layers.Layer]:
  return [module for module in (model, *model.submodules)
          if hasattr(module, 'dtype_policy')]


def model_policy(model: tf.keras.Model) -> str:
  """The policy the model computes in: float16 if any layer does, else
  bfloat16 if any does, else float32."""
  dtypes = {layer.dtype_policy.compute_dtype for layer in _layers(model)}
  if 'float16' in dtypes:
    return FLOAT16
  return BFLOAT16 if 'bfloat16' in dtypes else FLOAT32


def resolve(model: tf.keras.Model, requested: PrecisionChoice,
            module_set: Optional[str], loss_scaling_supported: bool,
            strategy_name: str) -> PrecisionChoice:
  """What the built model trains in (`requested`, unless the module chose);
  wraps its optimizer in a LossScaleOptimizer where float16 needs one and
  the module did not."""
  source, reason = requested.source, requested.reason
  built = model_policy(model)
  if module_set or built != requested.policy:
    source = 'module'
    reason = (f'the module set the policy {module_set!r}' if module_set else
              f'the module built the model in {built!r}')
    if requested.policy != built:
      reason += f' (distribution.precision={requested.policy!r} not applied)'
  if built != FLOAT16:
    return PrecisionChoice(built, source, reason)
  if not loss_scaling_supported:
    raise TrainingConfigError(
        f'The model computes in float16 ({reason}), which needs loss '
        f"scaling, and Keras' LossScaleOptimizer does not support strategy="
        f"{strategy_name!r}: build it in 'mixed_bfloat16' (no loss scaling "
        'needed), or use a strategy with loss scaling (one_device, mirrored, '
        'multi_worker_mirrored).')
  if loss_scaler(model.optimizer) is None:
    model.optimizer = tf.keras.mixed_precision.LossScaleOptimizer(
        model.optimizer)
  return PrecisionChoice(built, source, reason, loss_scaling=True)


def loss_scaler(optimizer) -> Optional[Any]:
  """The optimizer where it scales the loss (a LossScaleOptimizer), else
  None."""
  if isinstance(optimizer, tf.keras.mixed_precision.LossScaleOptimizer):
    return optimizer
  return None
