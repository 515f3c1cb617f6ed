"""OptimizedTransform benchmark: Transform step wall time and reader examples/s.

    python -m benchmarks.bench_transform [--results-dir D] [--work-dir W]
        [--with-trainer]

Side by side, in one run, on the Chicago taxi data shipped with tfx:
1. Transform step wall time: the stock Transform and OptimizedTransform as
   the default job configures it (`hpm_factories`: tuning at the trainer's
   batch, TRAINER_BATCH), plus OptimizedTransform with early_stop off (the
   full search) and that one's second run in the same root (the previous
   tuning reused); each step in a fresh process over the same imported
   ExampleGen and SchemaGen outputs, the variants interleaved per round; the
   step's execution time from MLMD, what OptimizedTransform decided and the
   seconds it spent after its stock Transform.
2. Reader examples/s on the transformed train split copied to >= 1M
   examples (as in shared/reference/README.md): the stock TFX
   `data_accessor.tf_dataset_factory` reader, ours (`build_dataset` with the
   config the default job's OptimizedTransform chose) for the first and for
   later epochs, and the in-memory ceiling (the same parsed tensors, already
   cached); at batch 256 and at the trainer's batch; rounds alternate and
   the medians are reported.
3. With --with-trainer, HighPerfTrainer end to end: the real component
   (managed loop, one_device) trains the taxi model on OptimizedTransform's
   output, once with the tuned artifact wired in, once without
   (InputPipelineConfig defaults), once with a sequential config (one
   reader, one parse call, no cache: the shape of the stock reader); on the
   taxi train split (many epochs, so the cache counts) and on the >= 1M copy
   (the first epoch); each run a fresh process.
Writes benchmarks/results/transform.md and copies the default job's tuning
report next to it (transform_tuning_report.md, transform_candidates.png;
on the other lane transform-tfx1.21_...).
"""

import glob
import json
import os
import shutil
import tempfile
from typing import Dict, List

from benchmarks import bench_transform_report as transform_report
from benchmarks import bench_transform_runs as transform_runs
from benchmarks import harness
from benchmarks import report
from benchmarks.bench_transform_runs import (
    READER_BATCHES, SCALE_EXAMPLES, TRAINER_INPUTS, TRAINER_ROUNDS,
    TRANSFORM_ROUNDS, TRANSFORM_VARIANTS, TUNING_CHART, TUNING_REPORT)

MODULE = 'benchmarks.bench_transform'


def _run_worker(work: str, mode: str, spec: Dict[str, str]) -> None:
  """`mode` (a pipeline step) in a fresh process, its output kept off the
  console; its tail if it fails."""
  harness.run_mode(MODULE, work, mode, spec, capture=True)


def time_transforms(upstream: Dict[str, str], work: str) -> Dict[str, Dict]:
  """Per variant and round: step seconds and what ours did, interleaved."""
  steps = {v: [] for v in TRANSFORM_VARIANTS}
  roots = {}
  for round_index in range(TRANSFORM_ROUNDS):
    for variant in TRANSFORM_VARIANTS:
      # 'reused' runs again in the root 'searching' just ran in.
      root = os.path.join(work, f'transform_'
                          f'{"searching" if variant == "reused" else variant}'
                          f'_{round_index}')
      _run_worker(work, 'transform', {
          'variant': 'searching' if variant == 'reused' else variant,
          'examples': upstream['examples'], 'schema': upstream['schema'],
          'root': root})
      steps[variant].append(transform_runs.step_seconds(
          os.path.join(root, 'metadata.db')))
      roots[variant] = root
      print(f'[bench_transform] {variant} Transform: '
            f'{json.dumps(steps[variant][-1])}', flush=True)
  return {'steps': steps, 'roots': roots}


def measure_trainer(datasets: Dict[str, str], graph_uri: str,
                    tuned_uri: str, work: str) -> Dict[str, Dict[str, List]]:
  """HighPerfTrainer per (dataset, input): loop examples/s, wall seconds.

  `datasets` maps a label to an Examples folder (Split-train, Split-eval).
  """
  artifacts = {'tuned': tuned_uri, 'defaults': '',
               'sequential': transform_runs.sequential_artifact(tuned_uri,
                                                                work)}
  results = {d: {i: {'loop': [], 'wall': []} for i in TRAINER_INPUTS}
             for d in datasets}
  for round_index, order in harness.interleaved_rounds(list(TRAINER_INPUTS),
                                                       TRAINER_ROUNDS):
    for dataset, examples_uri in datasets.items():
      for name in order:
        root = os.path.join(work, f'trainer_{dataset}_{name}_{round_index}')
        _run_worker(work, 'trainer', {
            'examples': examples_uri, 'graph': graph_uri,
            'tuned': artifacts[name], 'root': root})
        for key, value in transform_runs.trainer_result(root).items():
          results[dataset][name][key].append(value)
        print(f'[bench_transform] HighPerfTrainer {dataset} {name}: '
              f'{results[dataset][name]["loop"][-1]:,.0f} examples/s, '
              f'{results[dataset][name]["wall"][-1]:.1f} s', flush=True)
  return results


def main(results_dir: str = 'benchmarks/results',
         work_dir: str = None, with_trainer: bool = False) -> str:
  from components.data import input_pipeline  # pylint: disable=g-import-not-at-top
  from components.records import tuned_input_pipeline  # pylint: disable=g-import-not-at-top
  work = work_dir or tempfile.mkdtemp(prefix='bench_transform_')
  load_before = os.getloadavg()[0]
  upstream = transform_runs.run_upstream(os.path.join(work, 'upstream'))
  transforms = time_transforms(upstream, work)
  stock_root = transforms['roots']['stock']
  ours_root = transforms['roots']['optimized']
  tuned_uri = transform_runs.output(ours_root, 'tuned_input_pipeline')
  tuned_config = tuned_input_pipeline.read(tuned_uri)
  tuned_decision = transforms['steps']['optimized'][-1]['decision']
  scaled_dir = os.path.join(work, 'scaled', 'Split-train')
  num_examples = transform_runs.scale_split(
      os.path.join(transform_runs.output(stock_root, 'transformed_examples'),
                   'Split-train'),
      scaled_dir, SCALE_EXAMPLES)
  pattern = os.path.join(scaled_dir, '*')
  stock_graph = transform_runs.output(stock_root, 'transform_graph')
  readers = {(batch, mode): transform_runs.measure_readers(
      pattern, num_examples, stock_graph, tuned_config, batch, mode)
             for batch, mode in READER_BATCHES}
  trainer, trainer_data = {}, {}
  if with_trainer:
    ours_examples = transform_runs.output(ours_root, 'transformed_examples')
    trainer = measure_trainer(
        {'taxi': ours_examples,
         'scaled': transform_runs.scaled_examples(ours_examples, scaled_dir)},
        transform_runs.output(ours_root, 'transform_graph'), tuned_uri, work)
    trainer_data = {'taxi': input_pipeline.count_records(glob.glob(
        os.path.join(ours_examples, 'Split-train', '*')), 'GZIP'),
                    'scaled': num_examples}
  with open(os.path.join(work, 'measurements.json'), 'w') as f:
    json.dump({'transforms': transforms,
               'readers': {f'{b} {m}': r for (b, m), r in readers.items()},
               'trainer': trainer, 'trainer_data': trainer_data}, f,
              indent=1)
  body = transform_report.render(
      transforms, readers, trainer, trainer_data, num_examples, tuned_config,
      tuned_decision, load_before, os.getloadavg()[0])
  os.makedirs(results_dir, exist_ok=True)
  shutil.copy(os.path.join(tuned_uri, 'report.md'),
              os.path.join(results_dir, TUNING_REPORT))
  shutil.copy(os.path.join(tuned_uri, 'candidates.png'),
              os.path.join(results_dir, TUNING_CHART))
  return report.write(results_dir, 'transform',
                      'OptimizedTransform vs stock Transform', body)


MODES = {
    'transform': lambda work, spec: transform_runs.transform_worker(
        spec['variant'], spec['examples'], spec['schema'], spec['root']),
    'trainer': lambda work, spec: transform_runs.trainer_worker(
        spec['examples'], spec['graph'], spec['tuned'], spec['root']),
}


if __name__ == '__main__':
  parser = harness.parser(MODULE)
  parser.add_argument('--work-dir', default=None)
  parser.add_argument('--with-trainer', action='store_true',
                      help='also run the HighPerfTrainer end-to-end rows')
  harness.entry(parser, lambda args: main(args.results_dir, args.work_dir,
                                          args.with_trainer), MODES)
