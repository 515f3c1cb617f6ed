"""The command line that compiles the taxi pipeline for Kubeflow Pipelines.

    python -m kubeflow.runner --output outputs/kubeflow/taxi_hpm_pipeline.json \
        --image gcr.io/my-project/tfx-hpm:0.1.0 --pipeline-root gs://bucket/root

Every flag is checked before TFX is imported; `compiler` compiles, with the
task resources of `resources`.
"""

import os

# TFX 1.16 needs tf.keras to be Keras 2 (tf-keras); set before anything
# imports TensorFlow, so the command works in a plain shell (`kubeflow` is a
# namespace package: no __init__ of ours runs first). A value already set wins.
os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')

# pylint: disable=g-import-not-at-top,wrong-import-position
import argparse
import json
import sys
from typing import Dict

from components.trainer.checkpoint import location
from kubeflow import compiler
from kubeflow import resources
from pipelines import console
# pylint: enable=g-import-not-at-top,wrong-import-position

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
      '--image', default=compiler.DEFAULT_IMAGE,
      help='Container image with tfx-hpm installed (default: what `make '
      'image` builds; push it to a registry your cluster pulls from).')
  parser.add_argument('--pipeline-root', default='gs://my-bucket/tfx-hpm')
  parser.add_argument(
      '--data-root', default=compiler.IMAGE_DATA_ROOT,
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
  _add_resource_arguments(parser)
  parser.add_argument(
      '--beam-pipeline-arg', action='append', default=None, metavar='FLAG',
      help='A Beam pipeline flag for every task, repeated, written with "=": '
      '--beam-pipeline-arg=--runner=DataflowRunner. Replaces the default '
      f'({" ".join(compiler.DEFAULT_BEAM_PIPELINE_ARGS)}).')
  parser.add_argument(
      '--checkpoint-root', default=None,
      help='HighPerfTrainer checkpoint root (default: '
      f'{location.checkpoint_root(None, "<pipeline-root>")}, outside the run '
      'folders, so a resubmitted run resumes; the trainer keys it by '
      '<pipeline>/<node>/<fingerprint>).')
  return parser


def _add_resource_arguments(parser: argparse.ArgumentParser) -> None:
  """The Trainer's and the Beam tasks' CPU, memory and GPU flags."""
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
  trainer = resources.Resources(
      cpu=(resources.parse_cpu(args.trainer_cpu, '--trainer-cpu')
           if args.trainer_cpu is not None else None),
      memory_gb=(resources.parse_memory(args.trainer_memory, '--trainer-memory')
                 if args.trainer_memory is not None else None),
      gpu_type=gpu_type if args.trainer_gpu_count else None,
      gpu_count=args.trainer_gpu_count)
  beam = resources.Resources(
      cpu=(resources.parse_cpu(args.beam_cpu, '--beam-cpu')
           if args.beam_cpu is not None else None),
      memory_gb=(resources.parse_memory(args.beam_memory, '--beam-memory')
                 if args.beam_memory is not None else None))
  return trainer, beam


def with_ray_address(distribution: Dict, address: str, stock: bool) -> Dict:
  """The distribution config with launcher 'ray' at `address`."""
  if stock:
    raise ValueError('--ray-address is a HighPerfTrainer setting; --stock '
                     'uses the stock Trainer.')
  if not address.strip():
    raise ValueError('--ray-address must be a non-empty address, e.g. '
                     'ray://head-svc:10001.')
  if distribution.get('launcher', 'ray') != 'ray':
    raise ValueError("--ray-address needs launcher 'ray', but --distribution "
                     f"sets launcher={distribution['launcher']!r}.")
  return {**distribution, 'launcher': 'ray',
          'ray': {**distribution.get('ray', {}), 'address': address}}


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
    if not args.stock:
      # What HighPerfTrainer's construction checks, before the TFX import.
      # pylint: disable-next=g-import-not-at-top
      from components.trainer.config import DistributionConfig
      DistributionConfig.from_dict(distribution)
    beam_args = args.beam_pipeline_arg
    compiler.check_options(args.stock, args.checkpoint_root, beam_args, beam)
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
  path = compiler.compile_pipeline(
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
