"""Training throughput at a small batch: steps per call vs the stock Trainer.

    python -m benchmarks.bench_throughput [--train-steps N] [--rounds R]

Side by side in one run, in one taxi pipeline root (full taxi data, stock
Transform, caching on, so every variant trains on the same transformed
examples), batch 32, one device, the same model and train steps, each
pipeline run in a fresh process:
- (a) the stock Trainer with the taxi module's stock `run_fn` (`model.fit`,
  one step per call; `benchmarks/fit_run_fn.py` adds only a timer);
- (b) the best a stock user can do by hand: the same `run_fn` compiled with
  `steps_per_execution=N`, N tuned first on shorter runs;
- HighPerfTrainer, managed mode, `steps_per_execution='auto'`.
Steady examples/s excludes the first call (tracing); the Trainer wall time is
the component's execution in MLMD. Writes benchmarks/results/throughput.md.
"""

import json
import os
import tempfile
from typing import Any, Dict

from benchmarks import harness
from benchmarks import report

TRAIN_STEPS = 20000
TUNING_STEPS = 4000
TUNING_CANDIDATES = (10, 100, 1000)
EVAL_STEPS = 50
BATCH = 32
ROUNDS = 1
FIT_RUN_FN = 'benchmarks.fit_run_fn.run_fn'
MODULE = 'benchmarks.bench_throughput'


def _run_variant(root: str, variant: Dict[str, Any], train_steps: int,
                 round_index: int) -> Dict[str, Any]:
  """Runs the pipeline with one Trainer variant; returns its measurements."""
  # pylint: disable=g-import-not-at-top
  from tfx import v1 as tfx
  from components import HighPerfTrainer
  from pipelines import summary
  from pipelines import taxi_pipeline
  from benchmarks import fit_run_fn
  # pylint: enable=g-import-not-at-top

  def make_trainer(inputs: taxi_pipeline.TrainerInputs):
    common = dict(
        examples=inputs.examples, transform_graph=inputs.transform_graph,
        schema=inputs.schema,
        train_args=tfx.proto.TrainArgs(num_steps=inputs.train_steps),
        eval_args=tfx.proto.EvalArgs(num_steps=inputs.eval_steps))
    if variant['kind'] == 'stock':
      return tfx.components.Trainer(
          run_fn=FIT_RUN_FN, custom_config={
              'batch_size': BATCH, 'benchmark_round': round_index,
              'steps_per_execution': variant['steps_per_execution']},
          **common)
    return HighPerfTrainer(
        module_file=inputs.module_file,
        custom_config={'benchmark_round': round_index},
        distribution={'strategy': 'one_device', 'global_batch_size': BATCH,
                      'steps_per_execution': 'auto'},
        # Checkpoints by time: every 100 steps would cost 40% at this speed.
        fault_tolerance={'max_restarts': 0, 'save_every_steps': None,
                         'save_every_s': 60}, **common)

  pipeline = taxi_pipeline.create_pipeline(
      pipeline_name='bench_throughput', pipeline_root=root,
      serving_model_dir=os.path.join(root, 'serving_model'),
      train_steps=train_steps, eval_steps=EVAL_STEPS,
      make_trainer=make_trainer, enable_cache=True,
      compare_to_baseline=False)
  tfx.orchestration.LocalDagRunner().run(pipeline)
  run = summary.read_run(os.path.join(root, 'metadata.db'))
  model_run = report.latest_model_run_uri(root)
  if variant['kind'] == 'stock':
    with open(os.path.join(model_run, fit_run_fn.TIMING_FILE)) as f:
      steady = json.load(f)['steady_steps_per_sec'] * BATCH
    chosen = variant['steps_per_execution']
  else:
    result = harness.read_training_result(model_run)
    assert result.steps == train_steps, result
    steady = result.loop.examples_per_sec
    # None where training ended before 'auto' chose a length.
    chosen = result.loop.steps_per_execution or 'none yet'
  return {'steady_examples_per_sec': steady,
          'trainer_wall_s': {e.node_id: e.wall_s
                             for e in run.executions}['Trainer'],
          'accuracy': run.metrics.get('binary_accuracy', float('nan')),
          'steps_per_execution': chosen}


def _in_process(root: str, variant: Dict[str, Any], train_steps: int,
                round_index: int) -> Dict[str, Any]:
  """`_run_variant` in a fresh Python process, as a pipeline run would be."""
  return harness.run_mode(MODULE, root, 'variant', {
      'variant': variant, 'train_steps': train_steps, 'round': round_index})


MODES = {'variant': lambda root, spec: _run_variant(
    root, spec['variant'], spec['train_steps'], spec['round'])}


def main(results_dir: str = 'benchmarks/results',
         train_steps: int = TRAIN_STEPS, rounds: int = ROUNDS) -> str:
  root = tempfile.mkdtemp(prefix='bench_throughput_')
  load_before = os.getloadavg()[0]
  tuning = {}
  for n in TUNING_CANDIDATES:
    tuning[n] = _in_process(root, {'label': f'fit-N{n}', 'kind': 'stock',
                                   'steps_per_execution': n},
                            TUNING_STEPS, 0)['steady_examples_per_sec']
    print(f'[bench_throughput] tuning N={n}: {tuning[n]:.0f} ex/s', flush=True)
  best_n = max(tuning, key=tuning.get)
  variants = [
      {'label': '(a) stock Trainer, stock run_fn', 'kind': 'stock',
       'steps_per_execution': 1},
      {'label': f'(b) stock Trainer, model.fit steps_per_execution={best_n}',
       'kind': 'stock', 'steps_per_execution': best_n},
      {'label': 'HighPerfTrainer, steps_per_execution=auto', 'kind': 'ours'},
  ]
  measured = {v['label']: [] for v in variants}
  for round_index, order in harness.interleaved_rounds(variants, rounds):
    for variant in order:
      measured[variant['label']].append(
          _in_process(root, variant, train_steps, round_index))
      print(f'[bench_throughput] {variant["label"]}: '
            f'{measured[variant["label"]][-1]}', flush=True)
  with open(os.path.join(root, 'results.json'), 'w') as f:
    json.dump({'tuning': tuning, 'measured': measured}, f, indent=1)
  rate = {v['label']: harness.mean(r['steady_examples_per_sec']
                                   for r in measured[v['label']])
          for v in variants}
  rows = [[v['label'], f'{rate[v["label"]]:.0f}',
           f'{rate[v["label"]] / rate[variants[0]["label"]]:.2f}',
           f'{harness.mean(r["trainer_wall_s"] for r in runs):.1f}',
           ', '.join(str(r['steps_per_execution']) for r in runs),
           f'{harness.mean(r["accuracy"] for r in runs):.4f}']
          for v in variants for runs in [measured[v['label']]]]
  ours_rate = rate[variants[2]['label']]
  body = (
      f'Full Chicago taxi data, stock Transform shared by all variants (MLMD '
      f'cache), batch {BATCH}, one device, {train_steps} train steps, the '
      f'same Keras model (`pipelines/taxi_module.py`); {rounds} round(s), '
      'each variant in a fresh process. HighPerfTrainer checkpoints every 60 '
      's (time-based). Steady examples/s excludes the '
      'first call (tracing). N for (b) was tuned first on '
      f'{TUNING_STEPS}-step runs: ' +
      ', '.join(f'N={n}: {v:.0f} ex/s' for n, v in tuning.items()) +
      f'. Load average before/after: {load_before:.1f} / '
      f'{os.getloadavg()[0]:.1f} (the machine is shared).\n\n' +
      report.table(['Trainer', 'steady examples/s', 'vs (a)',
                    'Trainer wall s', 'steps per call', 'eval accuracy'],
                   rows) +
      f'\n\nHighPerfTrainer: {ours_rate / rate[variants[0]["label"]]:.2f}x '
      f'the stock Trainer (goal >= 3x) and '
      f'{ours_rate / rate[variants[1]["label"]]:.2f}x the best by hand '
      '(goal >= 1x).\n')
  return report.write(results_dir, 'throughput',
                      'Training throughput: steps per call', body)


if __name__ == '__main__':
  parser = harness.parser(MODULE)
  parser.add_argument('--train-steps', type=int, default=TRAIN_STEPS)
  parser.add_argument('--rounds', type=int, default=ROUNDS)
  harness.entry(parser, lambda args: main(
      args.results_dir, args.train_steps, args.rounds), MODES)
