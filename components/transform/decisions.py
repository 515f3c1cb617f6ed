"""The tuner's decisions from measured numbers: cache, placement, whether
training is input-bound, the search space and its order; and the shard
count of a materialized split. No measurement."""

import math
from typing import Any, Dict, List, Optional, Tuple

from components.data import input_pipeline
from components.data.input_pipeline import InputPipelineConfig
from components.transform.config import TuningConfig
from components.transform.results import ConsumerRate, Measurement

# A knob value replaces the best one only when it is this much faster in a
# second, interleaved measurement of both, so that noise on a shared machine
# does not flip choices.
MIN_GAIN = 1.05
# Budget left that 'auto' needs to try the on-the-fly path: loading the
# transform graph into a tf.data function takes seconds the first time.
ON_THE_FLY_MIN_LEFT_S = 12.0
# Default reader rate / consumer rate below which training is input-bound.
# The reader and the training step share the CPU cores here: at a ratio k the
# reader takes at most 1/(k+1) of the CPU time per example (none of it
# overlapped), and the search gains the reader 1.0-1.3x over the defaults on
# this data (benchmarks/results/transform.md), so at k = 4 the best a search
# could save is 0.2 * (1 - 1/1.3) ~ 5% of the step time, the noise level
# MIN_GAIN already ignores. With an accelerator the reader overlaps the step
# entirely, and k = 4 is the margin for a busier host than the one measured.
INPUT_BOUND_RATIO = 4.0
# InputPipelineConfig fields the search sets (what a reused config carries
# over); placement, cache and budgets are decided anew.
SEARCH_KNOBS = ('read_ahead_shards', 'read_batch_size', 'parse_parallel_calls',
                'read_buffer_bytes', 'prefetch_batches',
                'map_parallelization', 'private_threadpool_size',
                'deterministic')
# Shards read ahead that the search tries: streams of object storage need
# several; local files gain from parallel decompression.
READ_AHEAD_CANDIDATES = (2, 4, 8, 16)


def max_read_ahead(largest_shard_bytes: float, ram_budget: int) -> int:
  """The most shards a stream may read ahead: K + 1 of the largest shard's
  records held in at most half the input pipeline's RAM budget."""
  return max(1, int(ram_budget / 2 // max(largest_shard_bytes, 1.0)) - 1)


def search_space(num_files: int, cores: int, read_ahead_limit: int
                ) -> List[Tuple[str, Dict[str, Any]]]:
  """(knob, alternative) trials, the knobs in the order they matter most:
  read-ahead first (a stream-bound reader gains most there), up to
  `read_ahead_limit` shards and the files there are."""
  knobs = [
      ('read-ahead', [{'read_ahead_shards': k} for k in READ_AHEAD_CANDIDATES
                      if k <= min(read_ahead_limit, num_files)]),
      ('read batch size',
       [{'read_batch_size': 4 * input_pipeline.MIN_READ_BATCH}]),
      ('parse parallel calls', [{'parse_parallel_calls': n}
                                for n in sorted({1, cores})]),
      ('read buffer', [{'read_buffer_bytes': 64 * 1024},
                       {'read_buffer_bytes': 4 * 1024 * 1024}]),
      ('prefetch', [{'prefetch_batches': 2}, {'prefetch_batches': 8}]),
      ('map parallelization', [{'map_parallelization': False}]),
      ('private threadpool', [{'private_threadpool_size': cores}]),
      ('deterministic', [{'deterministic': False}]),
  ]
  return [(knob, changes) for knob, alternatives in knobs
          for changes in alternatives]


_SHORT_NAMES = {
    'read_ahead_shards': 'read_ahead',
    'parse_parallel_calls': 'parse_par',
    'read_buffer_bytes': 'buffer',
    'prefetch_batches': 'prefetch',
    'read_batch_size': 'read_batch',
    'private_threadpool_size': 'threads',
}


def describe(changes: Dict[str, Any]) -> str:
  """A short label of a candidate's knobs, for the report and chart."""
  if not changes:
    return 'default'
  return ', '.join(f'{_SHORT_NAMES.get(k, k)}={v}'
                   for k, v in sorted(changes.items()))


def choose_cache(tuning: TuningConfig, cache_bytes: int, ram_budget: int
                 ) -> Tuple[str, str]:
  """(cache mode, reason) from the dataset's cached size and the budgets."""
  fits = cache_bytes <= ram_budget
  sizes = (f'cached tensors ~{cache_bytes / 2**20:,.1f} MiB, RAM budget '
           f'{ram_budget / 2**20:,.1f} MiB')
  if tuning.cache == 'memory':
    if not fits:
      raise ValueError(f"cache='memory' was requested but the {sizes}: the "
                       'data does not fit; raise ram_budget_bytes or use '
                       "cache='disk'/'auto'/'none'.")
    return 'memory', f'memory (requested; {sizes})'
  if tuning.cache in ('disk', 'none'):
    return tuning.cache, f'{tuning.cache} (requested; {sizes})'
  if fits:
    return 'memory', f'memory: fits ({sizes})'
  if tuning.cache_dir:
    return 'disk', (f'disk at {tuning.cache_dir}: does not fit in memory '
                    f'({sizes})')
  return 'none', (f'none: does not fit in memory ({sizes}) and no cache_dir '
                  'was given for a disk cache')


def input_bound(tuning: TuningConfig, default: Measurement,
                 consumer: Optional[ConsumerRate]) -> Tuple[Optional[bool],
                                                            str]:
  """(input-bound?, why) from the default reader's and the consumer's rate."""
  if consumer is None:
    return None, 'consumer not measured'
  ratio = default.examples_per_sec / max(consumer.examples_per_sec, 1e-9)
  rates = (f'default reader {default.examples_per_sec:,.0f} examples/s = '
           f'{ratio:.1f}x the consumer\'s {consumer.examples_per_sec:,.0f} '
           f'({consumer.source})')
  if ratio >= tuning.input_bound_ratio:
    return False, f'{rates} >= {tuning.input_bound_ratio:g}x'
  return True, f'{rates} < {tuning.input_bound_ratio:g}x'


def knob_changes(config: InputPipelineConfig) -> Dict[str, Any]:
  """The search knobs of `config` that differ from the defaults."""
  default = InputPipelineConfig()
  return {k: getattr(config, k) for k in SEARCH_KNOBS
          if getattr(config, k) != getattr(default, k)}


def choose_placement(tuning: TuningConfig, defaults: Dict[str, Measurement],
                     available) -> Tuple[str, str]:
  """(placement, reason) from the measured default pipelines."""
  rates = ', '.join(f'{p} {m.examples_per_sec:,.0f} examples/s'
                    for p, m in defaults.items())
  if 'materialized' not in available:
    return 'on_the_fly', f'on the fly: Transform did not materialize ({rates})'
  if tuning.materialize == 'on_the_fly':
    return 'on_the_fly', f"on the fly: requested ({rates})"
  if tuning.materialize == 'always':
    return 'materialized', f"materialized: requested ({rates})"
  if 'on_the_fly' not in defaults:
    return 'materialized', (
        'materialized: the default' + (
            '; no raw tf.Examples to transform on the fly'
            if 'on_the_fly' not in available else
            '; on the fly not measured (time budget)') + f' ({rates})')
  if (defaults['on_the_fly'].examples_per_sec >
      defaults['materialized'].examples_per_sec):
    return 'on_the_fly', ('on the fly: transforming raw examples beats '
                          f'reading materialized ones ({rates})')
  return 'materialized', ('materialized: reading transformed examples beats '
                          f'transforming on the fly ({rates})')


def shard_count(raw_bytes: int, num_output_shards: int,
                max_shard_mb: float) -> int:
  """Files for a materialized split of `raw_bytes` of raw examples:
  `num_output_shards`, or more where a shard would exceed `max_shard_mb`
  (0 for either: no bound; 0 shards lets the runner decide)."""
  if not num_output_shards or not max_shard_mb:
    return num_output_shards
  return max(num_output_shards,
             math.ceil(raw_bytes / (max_shard_mb * 2**20)))
