"""Command-line flags shared by the pipeline runners and benchmarks.

No TensorFlow import here: a runner sets up logging (pipelines/console.py)
before TensorFlow and TFX start.
"""

import argparse
import json
import os
import tempfile
import time

from pipelines import data

# Where a sample of the data goes when the pipeline root is remote (so that
# every component can read it wherever it runs).
SAMPLE_SUBDIR = '_data_sample'
# Local folder of the SQLite MLMD file for remote pipeline roots.
REMOTE_ROOT_METADATA_DIR = os.path.join('outputs', 'metadata')
# The run's log file: under a local pipeline root, else in this local folder
# (a log being written cannot live on an object store).
LOG_SUBDIR = 'logs'
REMOTE_ROOT_LOG_DIR = os.path.join('outputs', 'logs')


def add_pipeline_flags(parser: argparse.ArgumentParser) -> None:
  parser.add_argument('--pipeline-name', default='taxi_hpm')
  parser.add_argument(
      '--data-root', default=None,
      help='Folder of taxi CSV files (default: the copy inside the tfx wheel).')
  parser.add_argument(
      '--sample-rows', type=int, default=0,
      help='Use only the first N rows of each CSV (0 = all rows); the sample '
      'goes to a local temporary folder, or under <pipeline-root>/'
      f'{SAMPLE_SUBDIR} for a remote root.')
  parser.add_argument(
      '--pipeline-root', default='outputs/pipeline',
      help='Artifacts go here: a local folder or a URI such as '
      'gs://bucket/path; for a local root also MLMD (metadata.db).')
  parser.add_argument(
      '--root-check-timeout-s', type=float, default=60.0,
      help='Seconds the pipeline root may take to accept a probe object '
      'before the run fails, naming it (TF retries a missing bucket without '
      'end).')
  parser.add_argument(
      '--metadata-path', default=None,
      help='SQLite MLMD file, always local (default: '
      '<pipeline-root>/metadata.db for a local root; for a remote root such '
      'as gs://, outputs/metadata/<pipeline-name>.db).')
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
  parser.add_argument(
      '--verbose', action='store_true',
      help='Print every log record (TFX, Beam, TensorFlow INFO) on the '
      'console too; without it the console shows each component\'s start, '
      'progress and duration, and the rest goes to the log file.')


def metadata_path(args: argparse.Namespace) -> str:
  """The local SQLite MLMD file the flags describe (absolute)."""
  if args.metadata_path:
    return os.path.abspath(args.metadata_path)
  if data.is_remote(args.pipeline_root):
    return os.path.abspath(os.path.join(REMOTE_ROOT_METADATA_DIR,
                                        f'{args.pipeline_name}.db'))
  return os.path.join(os.path.abspath(args.pipeline_root), 'metadata.db')


def log_path(args: argparse.Namespace) -> str:
  """A new log file for this run: `<pipeline-root>/logs/<name>-<UTC>.log`
  for a local root, `outputs/logs/...` for a remote one (absolute)."""
  folder = (REMOTE_ROOT_LOG_DIR if data.is_remote(args.pipeline_root) else
            os.path.join(args.pipeline_root, LOG_SUBDIR))
  os.makedirs(folder, exist_ok=True)
  stamp = time.strftime('%Y%m%d-%H%M%S', time.gmtime())
  return os.path.abspath(os.path.join(folder,
                                      f'{args.pipeline_name}-{stamp}.log'))


def pipeline_from_args(args: argparse.Namespace):
  """Builds the pipeline the flags describe."""
  # pylint: disable=g-import-not-at-top
  from components import storage
  from pipelines import taxi_pipeline
  # pylint: enable=g-import-not-at-top
  pipeline_root = data.local_abspath(args.pipeline_root)
  # Before TFX writes there (its compile step stalls on a missing bucket).
  storage.check_writable(pipeline_root, 'pipeline root',
                         timeout_s=args.root_check_timeout_s)
  data_root = args.data_root or data.default_data_root()
  if args.sample_rows:
    sample_dir = (os.path.join(pipeline_root, SAMPLE_SUBDIR)
                  if data.is_remote(pipeline_root) else
                  tempfile.mkdtemp(prefix='taxi_sample_'))
    data_root = data.write_sample(data_root, sample_dir, args.sample_rows)
  mlmd_path = metadata_path(args)
  # SQLite creates the file, not its folder.
  os.makedirs(os.path.dirname(mlmd_path), exist_ok=True)
  factories = {}
  if args.gpipe_stages and args.stock:
    raise SystemExit('--gpipe-stages needs our trainer; drop --stock.')
  if not args.stock:
    distribution = json.loads(args.distribution)
    if args.gpipe_stages:
      distribution.setdefault('global_batch_size', args.gpipe_batch_size)
      factories['extra_trainer_inputs'] = taxi_pipeline.gpipe_partitioner(
          args.gpipe_stages, args.gpipe_batch_size)
    factories.update(taxi_pipeline.hpm_factories(
        distribution=distribution, train_steps=args.train_steps))
  return taxi_pipeline.create_pipeline(
      pipeline_name=args.pipeline_name,
      pipeline_root=pipeline_root,
      serving_model_dir=data.local_abspath(
          args.serving_model_dir or
          os.path.join(pipeline_root, 'serving_model')),
      data_root=data_root,
      metadata_path=mlmd_path,
      train_steps=args.train_steps,
      eval_steps=args.eval_steps,
      accuracy_threshold=args.accuracy_threshold,
      enable_cache=args.enable_cache,
      **factories)
