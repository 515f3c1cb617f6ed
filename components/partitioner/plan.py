"""From a per-layer profile to a pipeline partition plan (plan.json).

Pure Python + numpy (no TensorFlow, no TFX): the profile is produced by
`profiling.py`, the plan is consumed by
`pipeline_parallel.runner.PipelineRunner` (its format:
`components.records.partition_plan`).

Cost and memory model, per micro-batch of the profiled size, for stage s of
a schedule (`schedules`) that keeps F_s micro-batches in flight on it
(GPipe: M; 1F1B: min(K-s, M)):
- stage cost = sum over its layers of forward + backward time, plus one more
  forward for every re-materialized micro-batch (all of them for 'always';
  for 'except_last' those whose backward does not directly follow their
  forward on the stage: M-1 of M under GPipe, none on 1F1B's last stage);
- stage memory = training state (weights, gradient accumulators, optimizer
  slots) + layer activations (of F_s micro-batches with remat 'never', of
  the one being recomputed otherwise) + the tensors the stage receives (of
  F_s micro-batches, or of one when they are offloaded to host memory).
"""

import dataclasses
import json
import math
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from components.partitioner import partition
from components.pipeline_parallel import schedules
from components.pipeline_parallel import simulator
from components.records.partition_plan import PLAN_FORMAT_VERSION

PROFILE_FILE = 'profile.json'


@dataclasses.dataclass(frozen=True)
class LayerProfile:
  """Measurements of one layer call on a sample micro-batch."""
  name: str
  class_name: str
  forward_seconds: float
  backward_seconds: float
  parameter_bytes: int  # Weights first used by this call.
  trainable_bytes: int  # The trainable part of parameter_bytes.
  activation_bytes: int  # This call's outputs.
  inputs: Tuple[str, ...]
  outputs: Tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class ModelProfile:
  """A model's layer calls in topological order, measured on a micro-batch.

  `live_tensors[c]` lists the tensors alive across cut c (before layer c):
  produced before it (model inputs count as produced before layer 0) and
  consumed at or after it; cut n holds the model outputs.
  """
  microbatch_size: int
  optimizer_slot_ratio: float  # Optimizer state bytes per trainable byte.
  layers: Tuple[LayerProfile, ...]
  tensor_bytes: Dict[str, int]
  live_tensors: Tuple[Tuple[str, ...], ...]

  @property
  def num_layers(self) -> int:
    return len(self.layers)

  def cut_bytes(self, cut: int) -> int:
    return sum(self.tensor_bytes[name] for name in self.live_tensors[cut])

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)

  @classmethod
  def from_json(cls, text: str) -> 'ModelProfile':
    values = json.loads(text)
    return cls(
        microbatch_size=values['microbatch_size'],
        optimizer_slot_ratio=values['optimizer_slot_ratio'],
        layers=tuple(
            LayerProfile(**{**layer, 'inputs': tuple(layer['inputs']),
                            'outputs': tuple(layer['outputs'])})
            for layer in values['layers']),
        tensor_bytes=dict(values['tensor_bytes']),
        live_tensors=tuple(tuple(live) for live in values['live_tensors']))


def recompute_fractions(remat: str, schedule: str, num_stages: int,
                        num_microbatches: int) -> np.ndarray:
  """Per stage: share of micro-batches whose forward pass runs twice."""
  if remat == 'always':
    return np.ones(num_stages)
  if remat == 'never':
    return np.zeros(num_stages)
  return np.array([
      1.0 - sum(schedules.backward_follows(order)) / num_microbatches
      for order in schedules.stage_orders(schedule, num_stages,
                                          num_microbatches)])


def in_flight(schedule: str, num_stages: int,
              num_microbatches: int) -> List[int]:
  """Per stage: most micro-batches between their forward and backward."""
  return [schedules.in_flight(order) for order in schedules.stage_orders(
      schedule, num_stages, num_microbatches)]


def layer_costs(profile: ModelProfile, num_stages: int, num_microbatches: int,
                remat: str, schedule: str) -> np.ndarray:
  """(K, n) seconds per micro-batch of layer i on stage k, recomputation
  included."""
  extra = recompute_fractions(remat, schedule, num_stages, num_microbatches)
  forward = np.array([layer.forward_seconds for layer in profile.layers])
  backward = np.array([layer.backward_seconds for layer in profile.layers])
  return forward[None, :] * (1.0 + extra[:, None]) + backward[None, :]


def state_bytes(profile: ModelProfile) -> np.ndarray:
  """Weights + gradient accumulators + optimizer slots, per layer."""
  return np.array([
      layer.parameter_bytes + layer.trainable_bytes *
      (1.0 + profile.optimizer_slot_ratio) for layer in profile.layers
  ])


def memory_terms(profile: ModelProfile, num_stages: int,
                 num_microbatches: int, remat: str, offload_activations: bool,
                 schedule: str) -> Tuple[np.ndarray, np.ndarray]:
  """(layer_memory, cut_memory) rows per stage for `optimal_partition`."""
  activations = np.array([layer.activation_bytes for layer in profile.layers])
  cuts = np.array([profile.cut_bytes(c)
                   for c in range(profile.num_layers + 1)], dtype=np.float64)
  layer_memory, cut_memory = [], []
  for flight in in_flight(schedule, num_stages, num_microbatches):
    stored_copies = flight if remat == 'never' else 1
    received_copies = 1 if offload_activations else flight
    layer_memory.append(state_bytes(profile) + stored_copies * activations)
    cut_memory.append(received_copies * cuts)
  return np.array(layer_memory), np.array(cut_memory)


def make_plan(profile: ModelProfile, num_stages: int, num_microbatches: int,
              remat: str, offload_activations: bool,
              memory_budget_bytes=None,
              schedule: str = schedules.GPIPE,
              data_parallel_replicas: int = 1) -> Dict[str, Any]:
  """Optimal partition of `profile` and everything the runner and report use.

  The memory budget applies to `schedule`'s memory (1F1B fits where GPipe
  may not); the plan also records each stage's memory under every schedule.
  With R data-parallel replicas every copy of the pipeline runs the same
  plan on its own devices and 1/R of the batch; the predicted step leaves
  out the gradient sum across copies.

  Raises:
    partition.InfeasibleBudgetError: nothing fits the memory budget.
  """
  schedules.check_schedule(schedule)
  costs = layer_costs(profile, num_stages, num_microbatches, remat, schedule)
  layer_memory, cut_memory = memory_terms(profile, num_stages,
                                          num_microbatches, remat,
                                          offload_activations, schedule)
  best = partition.optimal_partition(costs, num_stages, layer_memory,
                                     cut_memory, memory_budget_bytes)
  stages = _stage_details(profile, best, num_microbatches, remat, schedule)
  simulated = simulator.simulate_schedule(
      [stage['forward_seconds'] for stage in stages],
      [stage['backward_seconds'] for stage in stages], num_microbatches,
      schedule)
  return {
      'format_version': PLAN_FORMAT_VERSION,
      'num_layers': profile.num_layers,
      'num_stages': num_stages,
      'num_microbatches': num_microbatches,
      'schedule': schedule,
      'microbatch_size': profile.microbatch_size,
      'data_parallel_replicas': data_parallel_replicas,
      'batch_size': (profile.microbatch_size * num_microbatches *
                     data_parallel_replicas),
      'remat': remat,
      'offload_activations': offload_activations,
      'memory_budget_bytes': memory_budget_bytes,
      'boundaries': list(best.boundaries),
      'layer_signature': [layer.class_name for layer in profile.layers],
      'stages': stages,
      'cuts': [_cut_details(profile, c) for c in best.boundaries[1:-1]],
      'predicted': {
          'step_seconds': simulated.makespan,
          'slowest_stage_seconds': best.bottleneck,
          'bubble_fraction': simulator.bubble_fraction(
              num_stages, num_microbatches),
          'simulated_idle_fraction': simulated.idle_fraction,
          'peak_memory_bytes': int(best.peak_memory),
      },
      'memory_by_schedule': memory_by_schedule(
          profile, best.boundaries, num_microbatches, remat,
          offload_activations),
      'baselines': _baselines(profile.num_layers, num_stages, best, costs,
                              layer_memory, cut_memory, memory_budget_bytes),
  }


def _baselines(num_layers: int, num_stages: int, best: partition.Partition,
               costs, layer_memory, cut_memory,
               memory_budget_bytes) -> Dict[str, Dict[str, Any]]:
  """Simple splits (uniform, a balancing heuristic) against the plan."""

  def baseline(boundaries):
    other = partition.evaluate(boundaries, costs, layer_memory, cut_memory)
    return {
        'boundaries': list(other.boundaries),
        'slowest_stage_seconds': other.bottleneck,
        'slowdown_vs_plan': other.bottleneck / best.bottleneck
                            if best.bottleneck > 0 else 1.0,
        'peak_memory_bytes': int(other.peak_memory),
        'fits_budget': bool(memory_budget_bytes is None or
                            other.peak_memory <= memory_budget_bytes),
    }

  return {
      'uniform': baseline(partition.uniform_boundaries(num_layers,
                                                       num_stages)),
      # The heuristic balances one cost per layer: the first stage's.
      'block_partition': baseline(partition.block_boundaries(costs[0],
                                                             num_stages)),
  }


def memory_by_schedule(profile: ModelProfile, boundaries: Sequence[int],
                       num_microbatches: int, remat: str,
                       offload_activations: bool) -> Dict[str, Any]:
  """Per schedule: each stage's predicted peak bytes with these boundaries."""
  num_stages = len(boundaries) - 1
  result = {}
  for schedule in schedules.SCHEDULES:
    memory = partition.evaluate(boundaries, np.zeros(profile.num_layers),
                                *memory_terms(profile, num_stages,
                                              num_microbatches, remat,
                                              offload_activations, schedule))
    result[schedule] = {
        'stage_memory_bytes': [int(m) for m in memory.stage_memory],
        'peak_memory_bytes': int(memory.peak_memory),
        'in_flight_microbatches': in_flight(schedule, num_stages,
                                            num_microbatches),
    }
  return result


def _stage_details(profile: ModelProfile, best: partition.Partition,
                   num_microbatches: int, remat: str,
                   schedule: str) -> List[Dict[str, Any]]:
  num_stages = best.num_stages
  extra = recompute_fractions(remat, schedule, num_stages, num_microbatches)
  flights = in_flight(schedule, num_stages, num_microbatches)
  states = state_bytes(profile)
  stages = []
  for s, (a, c) in enumerate(zip(best.boundaries, best.boundaries[1:])):
    layers = profile.layers[a:c]
    forward = sum(layer.forward_seconds for layer in layers)
    backward = sum(layer.backward_seconds for layer in layers)
    state = float(states[a:c].sum())
    stages.append({
        'index': s,
        'first_layer': a,
        'end_layer': c,
        'layers': [layer.name for layer in layers],
        'forward_seconds': forward,
        'backward_seconds': backward + float(extra[s]) * forward,
        'cost_seconds': best.stage_costs[s],
        'parameter_bytes': sum(layer.parameter_bytes for layer in layers),
        'state_bytes': int(state),
        'activation_bytes': int(best.stage_memory[s] - state),
        'memory_bytes': int(best.stage_memory[s]),
        'in_flight_microbatches': flights[s],
        'input_bytes_per_microbatch': profile.cut_bytes(a),
    })
  return stages


def _cut_details(profile: ModelProfile, cut: int) -> Dict[str, Any]:
  tensors = [{'name': name, 'bytes': profile.tensor_bytes[name]}
             for name in profile.live_tensors[cut]]
  return {
      'before_layer': cut,
      'tensors': tensors,
      'bytes_per_microbatch': sum(t['bytes'] for t in tensors),
  }




def profile_at(measured: Sequence[ModelProfile],
               microbatch_size: int) -> ModelProfile:
  """The profile of another micro-batch size, from one or two measured.

  Times are affine in the micro-batch size through the two measured sizes
  (with one, proportional to it), never negative; activation and tensor
  bytes are proportional (they carry the batch dimension); weights do not
  change. A measured size is returned as measured.
  """
  by_size = {p.microbatch_size: p for p in measured}
  if microbatch_size in by_size:
    return by_size[microbatch_size]
  small, large = min(by_size), max(by_size)
  low, high = by_size[small], by_size[large]

  def seconds(t_small, t_large):
    if small == large:
      return t_small * microbatch_size / small
    slope = (t_large - t_small) / (large - small)
    return max(t_small + slope * (microbatch_size - small), 0.0)

  def scaled(num_bytes):
    return int(round(num_bytes * microbatch_size / small))

  return dataclasses.replace(
      low,
      microbatch_size=microbatch_size,
      layers=tuple(
          dataclasses.replace(
              a, forward_seconds=seconds(a.forward_seconds,
                                         b.forward_seconds),
              backward_seconds=seconds(a.backward_seconds,
                                       b.backward_seconds),
              activation_bytes=scaled(a.activation_bytes))
          for a, b in zip(low.layers, high.layers)),
      tensor_bytes={name: scaled(n) for name, n in low.tensor_bytes.items()})


# Predicted steps closer than this (relative) count as equal.
_STEP_TIE = 1e-9


def choose_plan(measured: Sequence[ModelProfile], num_stages: int,
                batch_size: int, microbatch_counts: Sequence[int],
                schedule_names: Sequence[str], remat: str,
                offload_activations: bool, memory_budget_bytes=None,
                data_parallel_replicas: int = 1
               ) -> Tuple[Dict[str, Any], ModelProfile]:
  """The fastest predicted plan over micro-batch counts and schedules.

  Each (M, schedule) gets its optimal partition within the budget; the
  shortest simulated step wins, equal steps go to the lower peak memory,
  then to fewer micro-batches. The plan's `choice` records every candidate
  and why this one. Returns (plan, the profile it was made from).

  Raises:
    partition.InfeasibleBudgetError: no candidate fits the budget; names the
      smallest budget that fits one.
  """
  rows, feasible, min_budget = [], [], float('inf')
  for m in microbatch_counts:
    profile = profile_at(measured, batch_size // data_parallel_replicas // m)
    for schedule in schedule_names:
      row = {'num_microbatches': m, 'schedule': schedule}
      try:
        plan = make_plan(profile, num_stages, m, remat, offload_activations,
                         memory_budget_bytes, schedule,
                         data_parallel_replicas)
      except partition.InfeasibleBudgetError as error:
        min_budget = min(min_budget, error.min_budget)
        rows.append({**row, 'fits_budget': False,
                     'smallest_budget_bytes': int(math.ceil(
                         error.min_budget))})
        continue
      predicted = plan['predicted']
      rows.append({**row, 'fits_budget': True,
                   'step_seconds': predicted['step_seconds'],
                   'bubble_fraction': predicted['bubble_fraction'],
                   'peak_memory_bytes': predicted['peak_memory_bytes']})
      feasible.append((plan, profile))
  if not feasible:
    raise partition.InfeasibleBudgetError(memory_budget_bytes, min_budget,
                                          num_stages)
  fastest = min(p['predicted']['step_seconds'] for p, _ in feasible)
  tied = [(p, prof) for p, prof in feasible
          if p['predicted']['step_seconds'] <= fastest * (1 + _STEP_TIE)]
  plan, profile = min(tied, key=lambda entry: (
      entry[0]['predicted']['peak_memory_bytes'],
      entry[0]['num_microbatches']))
  plan['choice'] = {
      'candidates': rows,
      'measured_microbatch_sizes': sorted(p.microbatch_size
                                          for p in measured),
      'reason': _reason(plan, rows, len(feasible), len(tied)),
  }
  return plan, profile


def _reason(plan, rows, num_feasible: int, num_tied: int) -> str:
  chosen = f"M={plan['num_microbatches']}, {plan['schedule']}"
  if len(rows) == 1:
    return f'{chosen}: both were set in the config.'
  text = (f"{chosen}: the shortest predicted step "
          f"({plan['predicted']['step_seconds'] * 1e3:.3f} ms, compute + "
          f'bubble, simulated from the profile) of the {num_feasible} '
          f'candidates that fit the memory budget, out of {len(rows)}')
  if num_tied > 1:
    text += (f'; {num_tied} candidates predict the same step, and this one '
             'has the lowest peak memory '
             f"({plan['predicted']['peak_memory_bytes']:,} bytes)")
  return text + '.'
