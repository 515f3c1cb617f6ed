"""Command-line flags shared by the pipeline runners and benchmarks."""

import argparse
import json
import os
import tempfile

from pipelines import data


def add_pipeline_flags(parser: argparse.ArgumentParser) -> None:
  parser.add_argument('--pipeline-name', default='taxi_hpm')
  parser.add_argument(
      '--data-root', default=None,
      help='Folder of taxi CSV files (default: the copy inside the tfx wheel).')
  parser.add_argument(
      '--sample-rows', type=int, default=0,
      help='Use only the first N rows of each CSV (0 = all rows).')
  parser.add_argument('--pipeline-root', default='outputs/pipeline',
                      help='Artifacts and MLMD (metadata.db) go here.')
  parser.add_argument('--serving-model-dir', default=None,
                      help='Pusher destination (default: '
                      '<pipeline-root>/serving_model).')
  parser.add_argument('--train-steps', type=int, default=1000)
  parser.add_argument('--eval-steps', type=int, default=150)
  parser.add_argument('--accuracy-threshold', type=float, default=0.6,
                      help="Evaluator's lower bound on binary accuracy.")
  parser.add_argument(
      '--stock', action='store_true',
      help='Use the stock TFX Transform and Trainer instead of ours.')
  parser.add_argument(
      '--distribution', default='{}',
      help='HighPerfTrainer distribution config as JSON, e.g. '
      '\'{"strategy": "mirrored", "logical_cpu_devices": 2}\'.')
  parser.add_argument(
      '--gpipe-stages', type=int, default=0,
      help='Add a GPipePartitioner with this many stages (0: none); the '
      'trainer then runs the GPipe schedule with --gpipe-batch-size.')
  parser.add_argument('--gpipe-batch-size', type=int, default=64)
  parser.add_argument('--enable-cache', action='store_true')


def pipeline_from_args(args: argparse.Namespace):
  """Builds the pipeline the flags describe."""
  from pipelines import taxi_pipeline  # pylint: disable=g-import-not-at-top
  data_root = args.data_root or data.default_data_root()
  if args.sample_rows:
    data_root = data.write_sample(
        data_root, tempfile.mkdtemp(prefix='taxi_sample_'), args.sample_rows)
  pipeline_root = os.path.abspath(args.pipeline_root)
  factories = {}
  if args.gpipe_stages and args.stock:
    raise SystemExit('--gpipe-stages needs our trainer; drop --stock.')
  if not args.stock:
    distribution = json.loads(args.distribution)
    if args.gpipe_stages:
      distribution.setdefault('global_batch_size', args.gpipe_batch_size)
      factories['extra_trainer_inputs'] = taxi_pipeline.gpipe_partitioner(
          args.gpipe_stages, args.gpipe_batch_size)
    factories.update(taxi_pipeline.hpm_factories(distribution=distribution))
  return taxi_pipeline.create_pipeline(
      pipeline_name=args.pipeline_name,
      pipeline_root=pipeline_root,
      serving_model_dir=os.path.abspath(
          args.serving_model_dir or
          os.path.join(pipeline_root, 'serving_model')),
      data_root=data_root,
      train_steps=args.train_steps,
      eval_steps=args.eval_steps,
      accuracy_threshold=args.accuracy_threshold,
      enable_cache=args.enable_cache,
      **factories)
