"""One entry per launcher: what the rest of the trainer must know of it.

A new launcher is one `register` call here and one `backends.Backend`
subclass naming it. Pure Python: no TFX, no TensorFlow, no Ray.
"""

import dataclasses
from typing import Dict, Tuple

AUTO = 'auto'


@dataclasses.dataclass(frozen=True)
class LauncherSpec:
  """What differs from one launcher to another.

  Attributes:
    name: The `distribution.launcher` value.
    starts_processes: It starts the cluster's processes itself, from
      num_workers and num_ps, as processes that see only storage they share
      with the executor. Otherwise training runs in the executor's own
      process, and an orchestrator's TF_CONFIG defines the cluster.
    ray_cluster: Its processes run on a Ray cluster: contacted when the
      environment is detected (an unreachable address fails there), its
      nodes counted (`auto` puts a worker on each), its address recorded on
      model_run; its nodes may be lost, so it alone can train elastically
      (`min_workers`).
  """
  name: str
  starts_processes: bool
  ray_cluster: bool = False


_REGISTRY: Dict[str, LauncherSpec] = {}


def register(spec: LauncherSpec) -> LauncherSpec:
  if spec.name in _REGISTRY or spec.name == AUTO:
    raise ValueError(f'A launcher named {spec.name!r} is registered already.')
  _REGISTRY[spec.name] = spec
  return spec


def get(name: str) -> LauncherSpec:
  if name not in _REGISTRY:
    raise ValueError(f'launcher={name!r} is not one of {names()} (or '
                     f'{AUTO!r}).')
  return _REGISTRY[name]


def names(**capabilities: bool) -> Tuple[str, ...]:
  """The registered launchers, those with the given capabilities."""
  return tuple(name for name, spec in _REGISTRY.items()
               if all(getattr(spec, capability) == value
                      for capability, value in capabilities.items()))


def starts_processes(name: str) -> bool:
  """`name` (or `auto`, which starts them unless outputs live in this
  process, `resolve.resolve_launcher`) starts the cluster's processes."""
  return name == AUTO or get(name).starts_processes


def on_ray_cluster(name: str) -> bool:
  return name != AUTO and get(name).ray_cluster


IN_PROCESS = register(LauncherSpec('in_process', starts_processes=False))
LOCAL = register(LauncherSpec('local', starts_processes=True))
RAY = register(LauncherSpec('ray', starts_processes=True, ray_cluster=True))
