"""Compiles the taxi pipeline for Kubeflow Pipelines (KFP v2 pipeline spec 2.1).

The image (`make image`, kubeflow/Dockerfile) contains this package and its
locked dependencies; the taxi module is named as an importable module, and the
data root is a path inside that image or on a shared filesystem (gs://...).

The spec is pipeline spec 2.1 (`KubeflowV2DagRunnerConfig(
use_pipeline_spec_2_1=True)`): parameters as `runtimeValue.constant`, which
open-source KFP 2.x drivers resolve (the 2.0 form, `constantValue`, fails
there), and each executor gets its inputs spec
(`--json_serialized_inputs_spec_args`), without which TFX's entrypoint reads the
deprecated `inputs.parameters` that KFP 2.x no longer fills. Every container
runs `python -m kubeflow.entrypoint`, TFX's entrypoint behind a repair of
untyped input artifacts (see kubeflow/entrypoint.py). The command line is
`kubeflow.runner`.
"""

import json
import os
from typing import Dict, List, Optional, Sequence

from components.trainer.checkpoint import location
from kubeflow.resources import Resources

# What `make image` builds (the Makefile's IMAGE default); tests check both.
DEFAULT_IMAGE = 'tfx-hpm:0.1.0'
# Where kubeflow/Dockerfile puts the package's data inside the image.
IMAGE_DATA_ROOT = '/tfx-hpm/data/taxi'
DEFAULT_BEAM_PIPELINE_ARGS = ('--direct_running_mode=multi_processing',
                              '--direct_num_workers=0')
# The container command of every executor (TFX's entrypoint, repaired).
ENTRYPOINT_COMMAND = ('python', '-m', 'kubeflow.entrypoint')
PIPELINE_NAME = 'taxi-hpm'


def check_beam_pipeline_args(args: Sequence[str]) -> List[str]:
  args = list(args)
  for arg in args:
    if not isinstance(arg, str) or not arg.startswith('--') or arg == '--':
      raise ValueError(
          f'Beam pipeline arg {arg!r} must be a flag such as '
          '--runner=DataflowRunner (pass it as --beam-pipeline-arg=--flag=v).')
  return args


def check_options(stock: bool, checkpoint_root: Optional[str],
                  beam_pipeline_args: Optional[Sequence[str]],
                  beam_resources: Optional[Resources] = None) -> List[str]:
  """What compile_pipeline can check without TFX (the CLI checks its flags
  with it before the slow import); returns the Beam args to use."""
  if beam_resources is not None and beam_resources.gpu_count:
    raise ValueError('Beam components take CPU and memory only, no GPUs.')
  if checkpoint_root is not None and not checkpoint_root.strip():
    raise ValueError('checkpoint_root (--checkpoint-root) must be a '
                     'non-empty path or URI.')
  if checkpoint_root is not None and stock:
    raise ValueError('checkpoint_root (--checkpoint-root) is a '
                     'HighPerfTrainer setting; the stock Trainer (--stock) '
                     'does not take it.')
  return check_beam_pipeline_args(
      DEFAULT_BEAM_PIPELINE_ARGS if beam_pipeline_args is None else
      beam_pipeline_args)


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
      `<pipeline_root>/_hpm_checkpoints` (`location.checkpoint_root`).
    compare_to_baseline: Keep the latest-blessed-model Resolver (compiled to
      two `resolver` tasks, which Vertex AI Pipelines runs and open-source
      KFP 2.x refuses); False judges each model on the accuracy bound alone,
      with no resolver task.
  """
  from tfx.orchestration.kubeflow.v2 import kubeflow_v2_dag_runner  # pylint: disable=g-import-not-at-top
  from pipelines import taxi_pipeline  # pylint: disable=g-import-not-at-top

  trainer_resources = trainer_resources or Resources()
  beam_resources = beam_resources or Resources()
  beam_pipeline_args = check_options(stock, checkpoint_root,
                                     beam_pipeline_args, beam_resources)
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
        fault_tolerance={'backup_root': location.checkpoint_root(
            checkpoint_root, pipeline_root)}))
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
