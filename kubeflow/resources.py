"""Kubernetes resources of a pipeline task: parsing CPU and memory
quantities, and a task's request = limit as KFP's ResourceSpec."""

import dataclasses
import re
from typing import Optional

_CPU = re.compile(r'^(\d+(\.\d+)?|\.\d+)(m?)$')
_MEMORY = re.compile(r'^(\d+(\.\d+)?|\.\d+)([KMGTPE]i?)?$')
_MEMORY_UNITS = {None: 1e9, 'K': 1e3, 'M': 1e6, 'G': 1e9, 'T': 1e12,
                 'P': 1e15, 'E': 1e18, 'Ki': 2**10, 'Mi': 2**20, 'Gi': 2**30,
                 'Ti': 2**40, 'Pi': 2**50, 'Ei': 2**60}


def parse_cpu(value: str, flag: str) -> float:
  """'2', '0.5' or '500m' -> CPUs (float > 0)."""
  match = _CPU.match(str(value).strip())
  if not match:
    raise ValueError(f'{flag}={value!r}: expected CPUs like 2, 0.5 or 500m.')
  cpus = float(match.group(1)) / (1000 if match.group(3) else 1)
  if cpus <= 0:
    raise ValueError(f'{flag}={value!r}: must be more than 0 CPUs.')
  return cpus


def parse_memory(value: str, flag: str) -> float:
  """'16', '16G', '512Mi' -> gigabytes (10^9 bytes, KFP's unit; float > 0)."""
  match = _MEMORY.match(str(value).strip())
  if not match:
    raise ValueError(f'{flag}={value!r}: expected a size like 16G, 512Mi or '
                     '8 (gigabytes).')
  gigabytes = float(match.group(1)) * _MEMORY_UNITS[match.group(3)] / 1e9
  if gigabytes <= 0:
    raise ValueError(f'{flag}={value!r}: must be more than 0 bytes.')
  return gigabytes


@dataclasses.dataclass(frozen=True)
class Resources:
  """One task's container resources. Requests and limits get the same value:
  OSS KFP puts both on the pod, Vertex AI reads the limits."""
  cpu: Optional[float] = None
  memory_gb: Optional[float] = None
  gpu_type: Optional[str] = None
  gpu_count: int = 0

  def __post_init__(self):
    if self.cpu is not None and not self.cpu > 0:
      raise ValueError(f'cpu={self.cpu!r} must be > 0.')
    if self.memory_gb is not None and not self.memory_gb > 0:
      raise ValueError(f'memory_gb={self.memory_gb!r} must be > 0.')
    if isinstance(self.gpu_count, bool) or not isinstance(
        self.gpu_count, int) or self.gpu_count < 0:
      raise ValueError(f'gpu_count={self.gpu_count!r} must be an integer '
                       '>= 0.')
    if self.gpu_count and not (self.gpu_type or '').strip():
      raise ValueError('A GPU count needs a GPU type (e.g. nvidia.com/gpu on '
                       'open-source KFP, NVIDIA_TESLA_T4 on Vertex AI).')
    if self.gpu_type and not self.gpu_count:
      raise ValueError(f'GPU type {self.gpu_type!r} given without a GPU '
                       'count >= 1.')

  def __bool__(self):
    return bool(self.cpu or self.memory_gb or self.gpu_count)

  def to_proto(self):
    """The PipelineContainerSpec.ResourceSpec TFX's compiler copies."""
    from kfp.pipeline_spec import pipeline_spec_pb2  # pylint: disable=g-import-not-at-top
    spec = (pipeline_spec_pb2.PipelineDeploymentConfig.PipelineContainerSpec
            .ResourceSpec())
    if self.cpu:
      spec.cpu_request = spec.cpu_limit = self.cpu
    if self.memory_gb:
      spec.memory_request = spec.memory_limit = self.memory_gb
    if self.gpu_count:
      spec.accelerator.type = self.gpu_type
      spec.accelerator.count = self.gpu_count
    return spec

