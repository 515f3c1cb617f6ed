"""Compiles the taxi pipeline for Kubeflow Pipelines (KFP v2 pipeline spec).

    python -m kubeflow.runner --output outputs/kubeflow/taxi_hpm_pipeline.json \
        --image gcr.io/my-project/tfx-hpm:latest --pipeline-root gs://bucket/root

The image must contain this package (tfx-hpm) and its locked dependencies;
the taxi module is named as an importable module, and the data root is a path
inside that image or on a shared filesystem.
"""

import argparse
import json
import os
import sys

_IMAGE_PACKAGE_ROOT = '/tfx-hpm'


def compile_pipeline(output: str, image: str, pipeline_root: str,
                     data_root: str, module: str, serving_model_dir: str,
                     stock: bool = False, distribution=None,
                     train_steps: int = 1000, eval_steps: int = 150,
                     gpipe_stages: int = 0, gpipe_batch_size: int = 64) -> str:
  """Writes the KFP v2 PipelineJob JSON to `output` and returns its path."""
  from tfx.orchestration.kubeflow.v2 import kubeflow_v2_dag_runner  # pylint: disable=g-import-not-at-top
  from pipelines import taxi_pipeline  # pylint: disable=g-import-not-at-top

  factories = {}
  if not stock:
    distribution = dict(distribution or {})
    if gpipe_stages:
      distribution.setdefault('global_batch_size', gpipe_batch_size)
      factories['extra_trainer_inputs'] = taxi_pipeline.gpipe_partitioner(
          gpipe_stages, gpipe_batch_size)
    factories.update(taxi_pipeline.hpm_factories(distribution=distribution))
  pipeline = taxi_pipeline.create_pipeline(
      pipeline_name='taxi-hpm' + ('-stock' if stock else ''),
      pipeline_root=pipeline_root,
      serving_model_dir=serving_model_dir,
      data_root=data_root,
      module_file=module,
      metadata_path='',  # Kubeflow provides MLMD.
      train_steps=train_steps,
      eval_steps=eval_steps,
      beam_pipeline_args=['--direct_running_mode=multi_processing',
                          '--direct_num_workers=0'],
      **factories)
  os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
  runner = kubeflow_v2_dag_runner.KubeflowV2DagRunner(
      config=kubeflow_v2_dag_runner.KubeflowV2DagRunnerConfig(
          default_image=image),
      output_dir=os.path.dirname(os.path.abspath(output)),
      output_filename=os.path.basename(output))
  runner.run(pipeline)
  return output


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog='python -m kubeflow.runner', description=__doc__.splitlines()[0])
  parser.add_argument('--output',
                      default='outputs/kubeflow/taxi_hpm_pipeline.json')
  parser.add_argument('--image', default='gcr.io/my-project/tfx-hpm:0.1.0',
                      help='Container image with tfx-hpm installed.')
  parser.add_argument('--pipeline-root', default='gs://my-bucket/tfx-hpm')
  parser.add_argument(
      '--data-root', default=f'{_IMAGE_PACKAGE_ROOT}/data/taxi',
      help='Taxi CSV folder as seen from the pipeline containers.')
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
  parser.add_argument('--gpipe-stages', type=int, default=0,
                      help='Add a GPipePartitioner with this many stages.')
  parser.add_argument('--gpipe-batch-size', type=int, default=64)
  args = parser.parse_args(argv)
  path = compile_pipeline(
      args.output, args.image, args.pipeline_root, args.data_root,
      args.module, args.serving_model_dir, stock=args.stock,
      distribution=json.loads(args.distribution),
      gpipe_stages=args.gpipe_stages, gpipe_batch_size=args.gpipe_batch_size)
  print(f'Wrote {path}')
  return 0


if __name__ == '__main__':
  sys.exit(main())
