"""Compiles the taxi pipeline for Kubeflow Pipelines (KFP v2 pipeline spec 2.1).

    python -m kubeflow.runner --output outputs/kubeflow/taxi_hpm_pipeline.json \
        --image gcr.io/my-project/tfx-hpm:0.1.0 --pipeline-root gs://bucket/root

The image (`make image`, kubeflow/Dockerfile) contains this package and its
locked dependencies; the taxi module is named as an importable module, and the
data root is a path inside that image or on a shared filesystem (gs://...).

The spec is pipeline spec 2.1 (`KubeflowV2DagRunnerConfig(
use_pipeline_spec_2_1=True)`): parameters as `runtimeValue.constant`, which
open-source KFP 2.x drivers resolve (the 2.0 form, `constantValue`, fails
there), and each executor gets its inputs spec (`--json_serialized_inputs_spec_args`),
without which TFX's entrypoint reads the deprecated `inputs.parameters` that
KFP 2.x no longer fills. Every container runs `python -m kubeflow.entrypoint`,
TFX's entrypoint behind a repair of untyped input artifacts (see
kubeflow/entrypoint.py).
"""

import argparse
import dataclasses
import json
import os
import re
import sys
from typing import Dict, List, Optional, Sequence

from pipelines import console

# What `make image` builds (the Makefile's IMAGE default); tests check both.
DEFAULT_IMAGE = 'tfx-hpm:0.1.0'
# Where kubeflow/Dockerfile puts the package's data inside the image.
IMAGE_DATA_ROOT = '/tfx-hpm/data/taxi'
DEFAULT_BEAM_PIPELINE_ARGS = ('--direct_running_mode=multi_processing',
                              '--direct_num_workers=0')
# The container command of every executor (TFX's entrypoint, repaired).
ENTRYPOINT_COMMAND = ('python', '-m', 'kubeflow.entrypoint')
CHECKPOINT_SUBDIR = '_hpm_checkpoints'
PIPELINE_NAME = 'taxi-hpm'

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


def default_checkpoint_root(pipeline_root: str) -> str:
  """`<pipeline_root>/_hpm_checkpoints`: outside any run's folder
  (`<pipeline_root>/<pipeline>/<run id>/...`), so a resubmitted run finds the
  checkpoints of the one it replaces. The trainer keys its checkpoints under
  it by pipeline, node and training fingerprint (see `_trainer_env`)."""
  return '/'.join([pipeline_root.rstrip('/'), CHECKPOINT_SUBDIR])


def check_beam_pipeline_args(args: Sequence[str]) -> List[str]:
  args = list(args)
  for arg in args:
    if not isinstance(arg, str) or not arg.startswith('--') or arg == '--':
      raise ValueError(
          f'Beam pipeline arg {arg!r} must be a flag such as '
          '--runner=DataflowRunner (pass it as --beam-pipeline-arg=--flag=v).')
  return args


def _runs(node, executor_base: type) -> bool:
  """Whether the node's executor class is `executor_base` or a subclass."""
  executor_class = getattr(getattr(node, 'executor_spec', None),
                           'executor_class', None)
  return isinstance(executor_class, type) and issubclass(executor_class,
                                                          executor_base)


def _is_beam_component(node) -> bool:
  from tfx.dsl.components.base import base_beam_executor  # pylint: disable=g-import-not-at-top
  return _runs(node, base_beam_executor.BaseBeamExecutor)


def _apply_resources(pipeline, trainer_id: str, trainer: Resources,
                     beam: Resources) -> Dict[str, Resources]:
  """Sets platform_config on the Trainer and on the Beam components."""
  applied = {}
  for node in pipeline.components:
    resources = (trainer if node.id == trainer_id else
                 beam if _is_beam_component(node) else None)
    if resources:
      node.with_platform_config(resources.to_proto())
      applied[node.id] = resources
  return applied


def _trainer_env(pipeline) -> Dict[str, Dict[str, str]]:
  """Node id -> container env naming the pipeline and node, per HighPerfTrainer.

  TFX's Kubeflow V2 entrypoint builds the executor's context without the
  pipeline or the node, which the trainer keys its checkpoints by (so that
  two pipelines or trainers sharing a checkpoint root never meet).
  """
  from components.trainer import executor as trainer_executor  # pylint: disable=g-import-not-at-top
  name = pipeline.pipeline_info.pipeline_name
  return {node.id: {trainer_executor.PIPELINE_NAME_ENV: name,
                    trainer_executor.NODE_ID_ENV: node.id}
          for node in pipeline.components
          if _runs(node, trainer_executor.Executor)}


def _patch_containers(path: str, applied: Dict[str, Resources],
                      env: Dict[str, Dict[str, str]]) -> None:
  """Adds to the compiled JSON what TFX 1.16's compiler cannot express.

  Resources: it drops platform_config for FileBasedExampleGen (CsvExampleGen's
  container spec is built without it). Env: it sets none (platform_config
  takes a ResourceSpec only).
  """
  from google.protobuf import json_format  # pylint: disable=g-import-not-at-top
  with open(path) as f:
    job = json.load(f)
  executors = job['pipelineSpec']['deploymentSpec']['executors']
  changed = False
  for node_id, resources in applied.items():
    container = executors.get(f'{node_id}_executor', {}).get('container')
    if container is not None and 'resources' not in container:
      container['resources'] = json_format.MessageToDict(resources.to_proto())
      changed = True
  for node_id, variables in env.items():
    container = executors[f'{node_id}_executor']['container']
    container['env'] = container.get('env', []) + [
        {'name': name, 'value': value} for name, value in variables.items()]
    changed = True
  if changed:
    with open(path, 'w') as f:
      json.dump(job, f, sort_keys=True)


def compile_pipeline(output: str, image: str, pipeline_root: str,
                     data_root: str, module: str, serving_model_dir: str,
                     stock: bool = False, distribution=None,
                     train_steps: int = 1000, eval_steps: int = 150,
                     gpipe_stages: int = 0, gpipe_batch_size: int = 64,
                     accuracy_threshold: float = 0.6,
                     trainer_resources: Optional[Resources] = None,
                     beam_resources: Optional[Resources] = None,
                     beam_pipeline_args: Optional[Sequence[str]] = None,
                     checkpoint_root: Optional[str] = None,
                     compare_to_baseline: bool = True,
                     pipeline_name: str = PIPELINE_NAME) -> str:
  """Writes the KFP v2 PipelineJob JSON to `output` and returns its path.

  Args:
    trainer_resources: CPU, memory and GPU of the Trainer task.
    beam_resources: CPU and memory of every Beam-based task (ExampleGen,
      StatisticsGen, Transform, Evaluator, ...).
    beam_pipeline_args: Beam flags for every task (default: the multi-process
      DirectRunner inside each task's container).
    checkpoint_root: HighPerfTrainer `fault_tolerance.backup_root`; default
      `default_checkpoint_root(pipeline_root)`.
    compare_to_baseline: Keep the latest-blessed-model Resolver (compiled to
      two `resolver` tasks, which Vertex AI Pipelines runs and open-source
      KFP 2.x refuses); False judges each model on the accuracy bound alone,
      with no resolver task.
  """
  from tfx.orchestration.kubeflow.v2 import kubeflow_v2_dag_runner  # pylint: disable=g-import-not-at-top
  from pipelines import taxi_pipeline  # pylint: disable=g-import-not-at-top

  trainer_resources = trainer_resources or Resources()
  beam_resources = beam_resources or Resources()
  if beam_resources.gpu_count:
    raise ValueError('Beam components take CPU and memory only, no GPUs.')
  beam_pipeline_args = check_beam_pipeline_args(
      DEFAULT_BEAM_PIPELINE_ARGS if beam_pipeline_args is None else
      beam_pipeline_args)
  if checkpoint_root is not None and not checkpoint_root.strip():
    raise ValueError('checkpoint_root must be a non-empty path or URI.')
  name = pipeline_name + ('-stock' if stock else '')
  factories = {}
  if not stock:
    distribution = dict(distribution or {})
    if gpipe_stages:
      distribution.setdefault('global_batch_size', gpipe_batch_size)
      factories['extra_trainer_inputs'] = taxi_pipeline.gpipe_partitioner(
          gpipe_stages, gpipe_batch_size)
    factories.update(taxi_pipeline.hpm_factories(
        distribution=distribution,
        fault_tolerance={'backup_root': checkpoint_root or
                         default_checkpoint_root(pipeline_root)}))
  elif checkpoint_root:
    raise ValueError('checkpoint_root is a HighPerfTrainer setting; the stock '
                     'Trainer does not take it.')
  pipeline = taxi_pipeline.create_pipeline(
      pipeline_name=name,
      pipeline_root=pipeline_root,
      serving_model_dir=serving_model_dir,
      data_root=data_root,
      module_file=module,
      metadata_path='',  # Kubeflow provides MLMD.
      train_steps=train_steps,
      eval_steps=eval_steps,
      accuracy_threshold=accuracy_threshold,
      compare_to_baseline=compare_to_baseline,
      beam_pipeline_args=beam_pipeline_args,
      **factories)
  applied = _apply_resources(pipeline, taxi_pipeline.TRAINER_ID,
                             trainer_resources, beam_resources)
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  runner = kubeflow_v2_dag_runner.KubeflowV2DagRunner(
      config=kubeflow_v2_dag_runner.KubeflowV2DagRunnerConfig(
          default_image=image,
          default_commands=list(ENTRYPOINT_COMMAND),
          use_pipeline_spec_2_1=True),
      output_dir=os.path.dirname(os.path.abspath(output)),
      output_filename=os.path.basename(output))
  runner.run(pipeline)
  _patch_containers(output, applied, _trainer_env(pipeline))
  return output


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog='python -m kubeflow.runner', description=__doc__.splitlines()[0])
  parser.add_argument('--output',
                      default='outputs/kubeflow/taxi_hpm_pipeline.json')
  parser.add_argument(
      '--verbose', action='store_true',
      help='Also print TFX, TensorFlow and library logs and warnings (by '
      'default they go to OUTPUT with .log instead of .json).')
  parser.add_argument(
      '--image', default=DEFAULT_IMAGE,
      help='Container image with tfx-hpm installed (default: what `make '
      'image` builds; push it to a registry your cluster pulls from).')
  parser.add_argument('--pipeline-root', default='gs://my-bucket/tfx-hpm')
  parser.add_argument(
      '--data-root', default=IMAGE_DATA_ROOT,
      help='Taxi CSV folder as seen from the pipeline containers (default: '
      'the copy inside the image).')
  parser.add_argument(
      '--module', default='pipelines.taxi_module',
      help='Taxi module: an importable name (installed in the image) or a '
      'local .py file that TFX packages at compile time.')
  parser.add_argument('--serving-model-dir',
                      default='gs://my-bucket/tfx-hpm/serving_model')
  parser.add_argument('--stock', action='store_true',
                      help='Stock Transform and Trainer instead of ours.')
  parser.add_argument('--distribution', default='{}',
                      help='HighPerfTrainer distribution config as JSON.')
  parser.add_argument(
      '--ray-address', default=None,
      help="Train on this Ray cluster (distribution launcher='ray'): from a "
      'KFP pod, the KubeRay head\'s Ray Client address, e.g. '
      'ray://taxi-ray-head-svc.kubeflow.svc:10001 (kubeflow/raycluster.yaml).')
  parser.add_argument('--gpipe-stages', type=int, default=0,
                      help='Add a GPipePartitioner with this many stages.')
  parser.add_argument('--gpipe-batch-size', type=int, default=64)
  parser.add_argument('--train-steps', type=int, default=1000)
  parser.add_argument('--eval-steps', type=int, default=150)
  parser.add_argument('--accuracy-threshold', type=float, default=0.6,
                      help="Evaluator's lower bound on binary accuracy.")
  parser.add_argument(
      '--no-baseline', action='store_true',
      help='No latest-blessed-model Resolver: the Evaluator judges on the '
      'accuracy bound alone. Needed on open-source KFP 2.x, whose compiler '
      'refuses resolver tasks ("resolver executors not implemented"); '
      'Vertex AI Pipelines runs them.')
  group = parser.add_argument_group('resources (requests = limits)')
  group.add_argument('--trainer-cpu', help='Trainer CPUs, e.g. 4 or 500m.')
  group.add_argument('--trainer-memory',
                     help='Trainer memory, e.g. 16G or 512Mi (a bare number '
                     'is gigabytes).')
  group.add_argument('--trainer-gpu-count', type=int, default=0,
                     help='GPUs for the Trainer.')
  group.add_argument(
      '--trainer-gpu-type', default=None,
      help='GPU type: the Kubernetes resource name on open-source KFP '
      '(default nvidia.com/gpu), an accelerator such as NVIDIA_TESLA_T4 on '
      'Vertex AI.')
  group.add_argument('--beam-cpu', help='CPUs of each Beam-based task.')
  group.add_argument('--beam-memory', help='Memory of each Beam-based task.')
  parser.add_argument(
      '--beam-pipeline-arg', action='append', default=None, metavar='FLAG',
      help='A Beam pipeline flag for every task, repeated, written with "=": '
      '--beam-pipeline-arg=--runner=DataflowRunner. Replaces the default '
      f'({" ".join(DEFAULT_BEAM_PIPELINE_ARGS)}).')
  parser.add_argument(
      '--checkpoint-root', default=None,
      help='HighPerfTrainer checkpoint root (default: <pipeline-root>/'
      f'{CHECKPOINT_SUBDIR}, outside the run folders, so a resubmitted run '
      'resumes; the trainer keys it by <pipeline>/<node>/<fingerprint>).')
  return parser


def resources_from_args(args: argparse.Namespace):
  """(trainer, beam) Resources from the flags; ValueError names the flag."""
  gpu_type = args.trainer_gpu_type
  if args.trainer_gpu_count < 0:
    raise ValueError(f'--trainer-gpu-count={args.trainer_gpu_count}: must be '
                     '>= 0.')
  if gpu_type is not None and not args.trainer_gpu_count:
    raise ValueError('--trainer-gpu-type needs --trainer-gpu-count >= 1.')
  if args.trainer_gpu_count and gpu_type is None:
    gpu_type = 'nvidia.com/gpu'
  trainer = Resources(
      cpu=(parse_cpu(args.trainer_cpu, '--trainer-cpu')
           if args.trainer_cpu is not None else None),
      memory_gb=(parse_memory(args.trainer_memory, '--trainer-memory')
                 if args.trainer_memory is not None else None),
      gpu_type=gpu_type if args.trainer_gpu_count else None,
      gpu_count=args.trainer_gpu_count)
  beam = Resources(
      cpu=(parse_cpu(args.beam_cpu, '--beam-cpu')
           if args.beam_cpu is not None else None),
      memory_gb=(parse_memory(args.beam_memory, '--beam-memory')
                 if args.beam_memory is not None else None))
  return trainer, beam


def with_ray_address(distribution: Dict, address: str, stock: bool) -> Dict:
  """The distribution config with launcher 'ray' at `address`, validated."""
  # pylint: disable-next=g-import-not-at-top
  from components.trainer.config import DistributionConfig
  if stock:
    raise ValueError('--ray-address is a HighPerfTrainer setting; --stock '
                     'uses the stock Trainer.')
  if not address.strip():
    raise ValueError('--ray-address must be a non-empty address, e.g. '
                     'ray://head-svc:10001.')
  if distribution.get('launcher', 'ray') != 'ray':
    raise ValueError(f'--ray-address needs launcher \'ray\', but --distribution '
                     f"sets launcher={distribution['launcher']!r}.")
  distribution = {**distribution, 'launcher': 'ray', 'ray_address': address}
  DistributionConfig.from_dict(distribution)
  return distribution


def log_path(output: str) -> str:
  """The compile log, next to the spec: `<output without .json>.log`."""
  return os.path.abspath(os.path.splitext(output)[0] + '.log')


def main(argv=None, quiet_console: bool = False) -> int:
  """Compiles; `quiet_console` (the command line's) sends library output to
  the log file, the count of its warnings said at the end."""
  parser = _parser()
  args = parser.parse_args(argv)
  # Every flag is checked before the (slow) TFX import and compile.
  try:
    trainer, beam = resources_from_args(args)
    distribution = json.loads(args.distribution)
    if not isinstance(distribution, dict):
      raise ValueError(f'--distribution={args.distribution!r}: expected a '
                       'JSON object.')
    if args.ray_address is not None:
      distribution = with_ray_address(distribution, args.ray_address,
                                      args.stock)
    beam_args = (check_beam_pipeline_args(args.beam_pipeline_arg)
                 if args.beam_pipeline_arg is not None else None)
    if args.checkpoint_root is not None and args.stock:
      raise ValueError('--checkpoint-root is a HighPerfTrainer setting; '
                       '--stock uses the stock Trainer.')
    if args.checkpoint_root is not None and not args.checkpoint_root.strip():
      raise ValueError('--checkpoint-root must be a non-empty path or URI.')
    for flag in ('train_steps', 'eval_steps', 'gpipe_stages'):
      if getattr(args, flag) < 0:
        raise ValueError(f'--{flag.replace("_", "-")} must be >= 0.')
  except ValueError as e:  # json.JSONDecodeError is a ValueError too.
    parser.error(str(e))
  report = None
  if quiet_console and not args.verbose:
    # Before TensorFlow and TFX start: they log, and warn, as they import.
    log_file = log_path(args.output)
    os.makedirs(os.path.dirname(log_file), exist_ok=True)
    console.redirect_output(log_file)
    report, _ = console.configure(log_file)
  path = compile_pipeline(
      args.output, args.image, args.pipeline_root, args.data_root,
      args.module, args.serving_model_dir, stock=args.stock,
      distribution=distribution, train_steps=args.train_steps,
      eval_steps=args.eval_steps, gpipe_stages=args.gpipe_stages,
      gpipe_batch_size=args.gpipe_batch_size,
      accuracy_threshold=args.accuracy_threshold, trainer_resources=trainer,
      beam_resources=beam, beam_pipeline_args=beam_args,
      checkpoint_root=args.checkpoint_root,
      compare_to_baseline=not args.no_baseline)
  print(f'Wrote {path}')
  if report is not None:
    print(f'full log: {log_file}' + (
        f' ({report.warnings_in_file} warnings of TFX, TensorFlow and other '
        'libraries there)' if report.warnings_in_file else ''))
  return 0


if __name__ == '__main__':
  sys.exit(main(quiet_console=True))
