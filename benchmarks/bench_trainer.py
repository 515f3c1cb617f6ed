"""HighPerfTrainer benchmark: Trainer wall time, training examples/s, accuracy.

    python -m benchmarks.bench_trainer [--results-dir D] [--train-steps N]

Side by side in one run, in one taxi pipeline root (full taxi data, stock
Transform, caching on so that every variant trains on the same transformed
examples), each pipeline run in a fresh process: the stock Trainer running
the taxi module's stock `run_fn` (`model.fit` over the TFX data accessor)
and HighPerfTrainer in managed mode (the same module's `build_model`) with
one_device and with each local multi-replica strategy; same train steps,
same global batch, same model. Per variant: the Trainer component's wall
time (MLMD), training examples/s over that wall time (steps x global batch /
wall), the managed loop's own steady-state examples/s, and the Evaluator's
binary accuracy on the raw eval split. Writes benchmarks/results/trainer.md.
"""

import json
import os
import tempfile
from typing import Any, Dict, List, Optional

from benchmarks import harness
from benchmarks import report

TRAIN_STEPS = 1000
EVAL_STEPS = 150
GLOBAL_BATCH = 64
ROUNDS = 2
MODULE = 'benchmarks.bench_trainer'
STOCK = 'stock Trainer (stock run_fn)'
# (label, distribution) of the HighPerfTrainer variants; the first is the
# single-device baseline, the others compete for "best local strategy".
OURS = [
    ('HighPerfTrainer one_device', {'strategy': 'one_device'}),
    ('HighPerfTrainer mirrored (2 logical CPUs)',
     {'strategy': 'mirrored', 'logical_cpu_devices': 2}),
    ('HighPerfTrainer central_storage (2 logical CPUs)',
     {'strategy': 'central_storage', 'logical_cpu_devices': 2}),
    ('HighPerfTrainer multi_worker_mirrored (2 workers)',
     {'strategy': 'multi_worker_mirrored', 'num_workers': 2}),
    ('HighPerfTrainer parameter_server (1 ps, 2 workers)',
     {'strategy': 'parameter_server', 'num_ps': 1, 'num_workers': 2}),
]


def _run_variant(root: str, distribution: Optional[Dict[str, Any]],
                 train_steps: int, eval_steps: int,
                 round_index: int) -> Dict[str, Any]:
  """Runs the pipeline with one Trainer variant; returns its measurements.

  `round_index` goes into custom_config (unused by the module) so that each
  round trains anew instead of hitting the MLMD cache.
  """
  # pylint: disable=g-import-not-at-top
  from tfx import v1 as tfx
  from components import HighPerfTrainer
  from pipelines import summary
  from pipelines import taxi_pipeline
  # pylint: enable=g-import-not-at-top

  def make_trainer(inputs: taxi_pipeline.TrainerInputs):
    common = dict(
        module_file=inputs.module_file, examples=inputs.examples,
        custom_config={'batch_size': GLOBAL_BATCH,
                       'benchmark_round': round_index},
        transform_graph=inputs.transform_graph, schema=inputs.schema,
        train_args=tfx.proto.TrainArgs(num_steps=inputs.train_steps),
        eval_args=tfx.proto.EvalArgs(num_steps=inputs.eval_steps))
    if distribution is None:
      return tfx.components.Trainer(**common)
    return HighPerfTrainer(
        distribution={'global_batch_size': GLOBAL_BATCH, **distribution},
        fault_tolerance={'max_restarts': 0}, **common)

  pipeline = taxi_pipeline.create_pipeline(
      pipeline_name='bench_trainer', pipeline_root=root,
      serving_model_dir=os.path.join(root, 'serving_model'),
      train_steps=train_steps, eval_steps=eval_steps,
      make_trainer=make_trainer, enable_cache=True)
  tfx.orchestration.LocalDagRunner().run(pipeline)
  run = summary.read_run(os.path.join(root, 'metadata.db'))
  wall = {e.node_id: e.wall_s for e in run.executions}['Trainer']
  measured = {
      'trainer_wall_s': wall,
      'examples_per_sec': train_steps * GLOBAL_BATCH / wall,
      'accuracy': run.metrics.get('binary_accuracy', float('nan')),
      'loop_examples_per_sec': None,
  }
  if distribution is not None:
    result = harness.read_training_result(report.latest_model_run_uri(root))
    assert result.steps == train_steps, result
    assert result.global_batch_size == GLOBAL_BATCH, result
    measured['loop_examples_per_sec'] = result.loop.examples_per_sec
  return measured


def aggregate(rounds: List[Dict[str, Any]]) -> Dict[str, Any]:
  """Means over rounds (examples/s over the mean wall time), and the
  accuracy range."""
  accuracies = [r['accuracy'] for r in rounds]
  loop_rates = [r['loop_examples_per_sec'] for r in rounds
                if r['loop_examples_per_sec']]
  wall = harness.mean([r['trainer_wall_s'] for r in rounds])
  examples = rounds[0]['examples_per_sec'] * rounds[0]['trainer_wall_s']
  return {
      'trainer_wall_s': wall,
      'examples_per_sec': examples / wall,
      'accuracy': harness.mean(accuracies),
      'accuracy_range': (min(accuracies), max(accuracies)),
      'loop_examples_per_sec': harness.mean(loop_rates) if loop_rates else None,
  }


def render(results: Dict[str, Dict[str, Any]], train_steps: int,
           rounds: int, load: List[float]) -> str:
  stock = results[STOCK]
  multi = [label for label, _ in OURS[1:]]
  best = max(multi, key=lambda label: results[label]['examples_per_sec'])
  rows = []
  for label in [STOCK] + [label for label, _ in OURS]:
    r = results[label]
    loop_rate = r['loop_examples_per_sec']
    low, high = r['accuracy_range']
    rows.append([
        label + (' **(best local)**' if label == best else ''),
        f'{r["trainer_wall_s"]:.1f}',
        f'{stock["trainer_wall_s"] / r["trainer_wall_s"]:.2f}',
        f'{r["examples_per_sec"]:.0f}',
        f'{r["examples_per_sec"] / stock["examples_per_sec"]:.2f}',
        f'{loop_rate:.0f}' if loop_rate else 'n/a',
        f'{r["accuracy"]:.4f} ({low:.4f}-{high:.4f})',
        f'{r["accuracy"] - stock["accuracy"]:+.4f}',
    ])
  one_device_wall = results[OURS[0][0]]['trainer_wall_s']
  best_wall = results[best]['trainer_wall_s']
  vs_stock = stock['trainer_wall_s'] / one_device_wall
  best_vs_stock = stock['trainer_wall_s'] / best_wall
  best_vs_one = one_device_wall / best_wall
  return (
      'Full Chicago taxi data (15,000 rows), stock Transform shared by all '
      f'variants (MLMD cache), {train_steps} train steps, global batch '
      f'{GLOBAL_BATCH}, the same Keras model (`pipelines/taxi_module.py`); '
      f'{rounds} rounds, each variant trained anew per round in a fresh '
      'process (as in a real pipeline run), the order reversed every other '
      'round; means over rounds. Trainer wall time is '
      "the component's execution time in MLMD (process start, training, "
      'evaluation, export); examples/s = steps x batch / Trainer wall time; '
      "loop examples/s is the managed loop's own steady-state rate "
      '(excluding the first, tracing step). Accuracy: the Evaluator on the '
      'raw eval split, mean (min-max over rounds). Load average before/after: '
      f'{load[0]:.1f} / {load[1]:.1f} (the machine is shared).\n\n' +
      report.table(['Trainer', 'wall s', 'speed-up vs stock', 'examples/s',
                    'examples/s ratio', 'loop examples/s (steady)',
                    'eval accuracy', 'accuracy vs stock'], rows) +
      f'\n\nHighPerfTrainer one_device ran the Trainer step {vs_stock:.2f}x '
      'as fast as the stock Trainer; the best local multi-replica strategy '
      f'({best}) {best_vs_stock:.2f}x, and {best_vs_one:.2f}x as fast as '
      'one_device. The machine has no GPU and 2 CPU cores shared with other '
      'work: the replicas of the multi-replica strategies share those '
      'cores.\n')


VARIANTS = [(STOCK, None)] + OURS


def _run_variant_process(root: str, index: int, train_steps: int,
                         eval_steps: int, round_index: int) -> Dict[str, Any]:
  """`_run_variant` in a fresh Python process, as a pipeline run would be.

  In one long-lived process the stock Trainer, which trains in the
  orchestrator's process, would find TensorFlow and Keras warm from the
  previous rounds; ours always trains in fresh processes.
  """
  return harness.run_mode(MODULE, root, 'variant', {
      'variant': index, 'train_steps': train_steps, 'eval_steps': eval_steps,
      'round': round_index})


MODES = {'variant': lambda root, spec: _run_variant(
    root, VARIANTS[spec['variant']][1], spec['train_steps'],
    spec['eval_steps'], spec['round'])}


def main(results_dir: str = 'benchmarks/results',
         train_steps: int = TRAIN_STEPS, eval_steps: int = EVAL_STEPS,
         rounds: int = ROUNDS) -> str:
  root = tempfile.mkdtemp(prefix='bench_trainer_')
  load_before = os.getloadavg()[0]
  measured = {label: [] for label, _ in VARIANTS}
  for round_index, order in harness.interleaved_rounds(
      list(enumerate(VARIANTS)), rounds):
    for index, (label, _) in order:
      measured[label].append(_run_variant_process(
          root, index, train_steps, eval_steps, round_index))
      print(f'[bench_trainer] round {round_index} {label}: '
            f'{measured[label][-1]}', flush=True)
  with open(os.path.join(root, 'results.json'), 'w') as f:
    json.dump(measured, f, indent=1)
  results = {label: aggregate(rounds_) for label, rounds_ in measured.items()}
  body = render(results, train_steps, rounds,
                [load_before, os.getloadavg()[0]])
  return report.write(results_dir, 'trainer',
                      'HighPerfTrainer vs stock Trainer', body)


if __name__ == '__main__':
  parser = harness.parser(MODULE)
  parser.add_argument('--train-steps', type=int, default=TRAIN_STEPS)
  parser.add_argument('--eval-steps', type=int, default=EVAL_STEPS)
  parser.add_argument('--rounds', type=int, default=ROUNDS)
  harness.entry(parser, lambda args: main(
      args.results_dir, args.train_steps, args.eval_steps, args.rounds),
                MODES)
