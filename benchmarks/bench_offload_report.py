"""bench_offload's report: the trainer with and without a cell, the
consumer's cost of the service path, where the time goes, image-sized
records and the cells on paper."""

from typing import Any, Dict, List

from benchmarks import harness
from benchmarks import report
from benchmarks.bench_offload_runs import (
    ACCELERATORS, ASSUMED_RATES, BATCH, CONSUMER_BOUND, GOAL, HOST_CORES,
    IMAGE_BATCH, IMAGE_HW, IMAGE_OUT, IMAGES, LARGE_BATCH, PAIRS, SETUP_LABELS,
    SETUPS, STEPS_PER_CALL)


def _rate(runs: List[Dict[str, Any]]) -> float:
  """The median of the runs' steady examples/s."""
  return harness.median_of(runs, 'examples_per_sec')


def _trainer_section(trainer: Dict[str, List[Dict[str, Any]]],
                     train_steps: int, cores: List[int]) -> str:
  rows = [[SETUP_LABELS[setup], SETUPS[setup][2],
           f'{_rate(r):,.0f}',
           f'{_rate(r) / SETUPS[setup][2]:,.0f}',
           f'{harness.median_of(r, "train_wall_s"):.1f}',
           ' / '.join(f'{x["examples_per_sec"]:,.0f}' for x in r),
           ' / '.join(f'{x["other_cores"]["busy"]:.0%}' for x in r),
           ' / '.join(f'{x["trainer_core"]["steal"]:.0%}' for x in r),
           ' / '.join(f'{x["train_loss"]:.6f}' for x in r)]
          for setup, r in trainer.items()]
  same = [len({x['train_loss'] for setup in pair for x in trainer[setup]})
          == 1 for pair in PAIRS.values()]
  materialized = {x['train_loss'] for x in trainer['materialized']}
  ratios = {batch: _ratio(trainer, batch) for batch in PAIRS}
  return '\n\n'.join([
      'The taxi model trained by the managed loop (one_device, '
      f'{train_steps} steps at global batch {BATCH} and {LARGE_BATCH}, '
      f'{STEPS_PER_CALL} steps a call, seeded), its process '
      f'pinned to core {cores[-1]} of {cores}; the reader transforms the raw '
      'taxi examples on the fly (the stock Transform\'s graph in the '
      'reader) or, to see where the time goes, parses the examples '
      'Transform materialized. With one cell, the cell is a local process '
      'on the other core(s). Steady examples/s from training_result.json '
      f'(after the first call); {len(trainer["local"])} interleaved rounds, '
      'medians. The train wall time includes starting the cell. Busy and '
      'stolen (by the hypervisor): shares of the cores\' time over the whole '
      'training process (/proc/stat); without a cell the other core\'s '
      'busy time is the machine\'s other work, with one it is the cell\'s '
      'and that work.',
      report.table(['setup', 'batch', 'examples/s (median)', 'steps/s',
                    'train wall s', 'every round',
                    'other core(s) busy, every round',
                    'trainer\'s core stolen, every round',
                    'final train loss, every round'], rows),
      report.table(['goal', 'batch', 'wanted', 'measured', 'per round', ''],
                   [['one cell / without offload, the trainer on one core',
                     batch, f'>= {GOAL}x', f'{ratio:.2f}x', ' / '.join(
                         f'{c["examples_per_sec"] / w["examples_per_sec"]:.2f}x'
                         for c, w in zip(trainer[PAIRS[batch][1]],
                                         trainer[PAIRS[batch][0]])),
                     'met' if ratio >= GOAL else '**not met**']
                    for batch, ratio in ratios.items()]),
      'The same rows each update with and without the cell, end to end: '
      + ('at each batch size every on-the-fly run ended on the same '
         'training loss, bit for bit' + (
             ' (and so did the materialized runs: the on-the-fly reader '
             'yields the tensors Transform wrote).'
             if materialized == {x['train_loss'] for x in trainer['local']}
             else '.')
         if all(same)
         else '**the runs ended on different training losses** (the '
         'rows are compared update by update below).')])


def _ratio(trainer: Dict[str, List[Dict[str, Any]]], batch: int) -> float:
  without, cell = PAIRS[batch]
  return _rate(trainer[cell]) / _rate(trainer[without])


def _cost_section(costs: Dict[int, Any]) -> str:
  rows = []
  for batch, c in costs.items():
    service = c['served']['cpu_ms'] - c['memory']['cpu_ms']
    reading = c['local']['cpu_ms'] - c['memory']['cpu_ms']
    rows.append([
        batch, f"{c['local']['cpu_ms']:.3f}", f"{c['memory']['cpu_ms']:.3f}",
        f"{c['served']['cpu_ms']:.3f}", f'{service:.3f}',
        f'{service / reading:.2f}', f"{c['local']['rows_per_s']:,.0f}",
        f"{c['served']['rows_per_s']:,.0f}" + (
            ' (consumer-bound)' if c['served']['cpu_ms'] >= CONSUMER_BOUND
            * c['served']['wall_ms'] else ''),
        f"{c['updates_compared']}: " + (
            'equal' if c['rows_equal'] else
            f"**differ** from update {c['first_difference']}")])
  at = costs[BATCH]
  client = at['client_alone']['cpu_ms']
  return '\n\n'.join([
      '## The consumer\'s cost of the service path\n\n'
      'CPU ms per batch of the consumer, a process on one core, pulling the '
      'batches of one partition through `build_ordered_dataset` by a traced '
      'loop as the trainer\'s steps pull theirs (about ten epochs, the first '
      'fifth not timed: start-up), medians of the rounds: from the local '
      'on-the-fly reader, from an in-memory stream of the same batches (the '
      'cost of consuming at all) and from a cell (`served.Offload.serve`). '
      'Service path: served - in-memory; the reader\'s work: local - '
      'in-memory. The served wall rate is what the cell makes where the '
      'consumer waits on it (consumer-bound: its CPU is at least '
      f'{CONSUMER_BOUND:.0%} of the wall time). Updates compared: the '
      'sha256 of every update\'s '
      'features and label, served against local.',
      report.table(['batch', 'local reader CPU ms', 'in-memory CPU ms',
                    'served CPU ms', 'service path ms',
                    'service path / reader\'s work',
                    'local reader rows/s (one core)',
                    'cell rows/s (served wall)', 'updates compared'], rows),
      f'At batch {BATCH} the tf.data service client alone (the cell\'s '
      'dataset read directly: no pump thread, no queue) costs the '
      f'consumer {client:.3f} ms a batch; the pump thread and the queue the '
      f'consumer\'s pipeline dequeues from add '
      f'{at["served"]["cpu_ms"] - client:.3f} ms.'])


def _time_section(trainer: Dict[str, List[Dict[str, Any]]],
                  costs: Dict[int, Any]) -> str:
  ms = {setup: 1e3 * BATCH / _rate(trainer[setup])
        for setup in ('local', 'cell', 'materialized')}
  at = costs[BATCH]
  memory = at['memory']['cpu_ms']
  reading = at['local']['cpu_ms'] - memory
  service = at['served']['cpu_ms'] - memory
  client = at['client_alone']['cpu_ms'] - memory
  rest = ms['local'] - reading
  ratio = _ratio(trainer, BATCH)

  def gain(path: float) -> str:
    return f'{ms["local"]:.2f} / ({rest:.2f} + {path:.2f}) = ' + (
        f'{ms["local"] / (rest + path):.2f}x')

  text = (
      '## Where the time goes\n\n'
      f'Milliseconds per batch of {BATCH} on the trainer\'s core (medians '
      f'above): {ms["local"]:.2f} reading on the fly, {ms["cell"]:.2f} with '
      f'the cell, {ms["materialized"]:.2f} reading materialized examples '
      '(with the cell the trainer runs at '
      f'{ms["materialized"] / ms["cell"]:.2f} of that rate). The reader\'s '
      f'work is {reading:.2f} ms (measured alone, above), the rest, '
      f'{rest:.2f} ms, the step and the managed loop, which stay on the '
      'core. Moving the reader to a cell gains at most '
      f'{ms["local"]:.2f} / {rest:.2f} = {ms["local"] / rest:.2f}x, less '
      f'the service path, which costs the consumer {service:.2f} ms a batch '
      f'({service / reading:.0%} of the reader\'s work it moves): '
      f'{gain(service)} (measured {ratio:.2f}x; the parts come from other '
      'processes on a shared VM). Of the service path, the tf.data service '
      f'client takes {client:.2f} ms and the pump and its queue '
      f'{service - client:.2f} ms; with the client alone it would be '
      f'{gain(client)}.')
  if ratio >= GOAL:
    return text + f' The goal is met at batch {BATCH}.'
  if ms['local'] / rest < GOAL:
    why = ('even a free service path would not reach it: the reader is too '
           'small a part of the trainer\'s time on one core')
  elif ms['local'] / (rest + client) < GOAL:
    why = ('the tf.data service client alone costs the consumer too much '
           'of what the cell takes off the core')
  else:
    why = ('the consumer\'s cost of the service path keeps the gain under '
           'it')
  return text + (
      f' At batch {BATCH} the goal is not met: {why}. The service path '
      'costs per batch and '
      'the reader per row, so its share falls as batches grow (the table '
      'above); a step cheaper than the reader (an accelerator taking the '
      'step) leaves the reader more of the core\'s time, and the cell more '
      'to gain.')


def _image_section(images: Dict[str, Any]) -> str:
  local, served_ = images['local'], images['served']
  return (
      '## Image-sized records\n\n'
      f'{IMAGES} JPEGs of {IMAGE_HW[1]}x{IMAGE_HW[0]} (mean '
      f'{images["jpeg_bytes"] / 1e3:.0f} KB) decoded, cropped, resized to '
      f'{IMAGE_OUT}x{IMAGE_OUT}x3 uint8 and flipped, batches of '
      f'{IMAGE_BATCH}: one core reads {local["rows_per_s"]:,.0f} images/s '
      f'itself; one cell serves {served_["rows_per_s"]:,.0f} images/s, at '
      f'{served_["cpu_ms"]:.2f} ms of consumer CPU a batch (reading locally: '
      f'{local["cpu_ms"]:.2f} ms).')


def _paper_section(paper: List[Dict[str, Any]], costs: Dict[int, Any]
                  ) -> str:
  from components.offload import sizing  # pylint: disable=g-import-not-at-top
  spare = HOST_CORES - ACCELERATORS
  taxi_rate = ASSUMED_RATES['taxi'][0]
  largest = max(costs)
  rows = [[p['kind'], f"{p['consumer_rate']:,} (assumed)",
           f"{p['cell_rate']:,.0f}", p['per_accelerator'], p['cells'],
           p['on_host'], p['elsewhere'], f"{p['receiving_cores']:.2f}"]
          for p in paper]
  return '\n\n'.join([
      f'## On paper: a {HOST_CORES}-core host with {ACCELERATORS} '
      'accelerators\n\n'
      'One training process per accelerator, one core each; the other '
      f'{spare} cores hold one local cell each. Cells per accelerator by '
      '`sizing.cells_needed` (the auto-scaler rule, '
      f'{sizing.HEADROOM:g}x headroom) from the cell rate measured here. '
      '**The accelerator rates are assumptions**: ' + '; '.join(
          f"{p['kind']} {p['consumer_rate']:,} examples/s: {p['basis']}"
          for p in paper) + '. Receiving: the share of its core a training '
      'process spends pulling its batches through the service path at that '
      'rate (the served consumer CPU per batch measured here). A process '
      'needs data_partitions >= its cells (a partition is one job on one '
      'cell).',
      report.table(['record', 'an accelerator trains ex/s',
                    'a cell makes ex/s (measured)', 'cells per accelerator',
                    f'cells for {ACCELERATORS}', 'on the host',
                    'on other hosts (launcher ray)',
                    'receiving, cores per process'], rows),
      f'Receiving {taxi_rate:,} taxi examples a second takes a training '
      f'process {paper[0]["receiving_cores"]:.2f} cores at batch {BATCH} and '
      f'{taxi_rate / largest * costs[largest]["served"]["cpu_ms"] / 1e3:.2f}'
      f' at batch {largest}: small records at a high rate want large '
      'batches through the service path.'])


def body(trainer: Dict[str, List[Dict[str, Any]]], costs: Dict[int, Any],
          images: Dict[str, Any], paper: List[Dict[str, Any]],
          train_steps: int, cores: List[int], load: List[float],
          wall_s: float) -> str:
  return '\n\n'.join([
      _trainer_section(trainer, train_steps, cores), _cost_section(costs),
      _time_section(trainer, costs), _image_section(images),
      _paper_section(paper, costs),
      f'Load average (1 min) before / after: {load[0]:.1f} / {load[1]:.1f} '
      f'(the machine is shared). Benchmark wall time: {wall_s:.0f} s.']) + '\n'
