"""What a pipelined step really did: per stage and micro-batch, when each
forward and backward ran, from a TF profiler trace of one step.

Ops carry the runner's 'pipeline/replica<r>/stage<s>/microbatch<m>/<phase>'
name scope; gradient ops of activations kept from the forward carry the
forward's scope under 'gradient_tape/', so they count as backward. Transfers
(_Send/_Recv) are left out: they wait on the other device. Times are those
of replica 0's stages together with the other copies' (a copy runs the same
schedule on its own devices).
"""

import glob
import os
import re
import tempfile
from typing import Any, Dict, List, Tuple

import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

_SCOPE = re.compile(
    r'pipeline/replica\d+/stage(\d+)/microbatch(\d+)/(forward|backward)')
# Variable reads and the loss metric's updates run whenever their control
# inputs allow; they would stretch a task's span without being its work.
_BOOKKEEPING_OPS = ('ReadVariableOp', 'AssignVariableOp',
                    'AssignAddVariableOp')

# (stage, micro-batch, phase, start s, end s, op type)
Op = Tuple[int, int, str, float, float, str]


def trace_ops(trace_dir: str) -> List[Op]:
  """Every pipeline op of the profiler trace in `trace_dir`."""
  (path,) = glob.glob(os.path.join(trace_dir, '**', '*.xplane.pb'),
                      recursive=True)
  space = xplane_pb2.XSpace()
  with open(path, 'rb') as f:
    space.ParseFromString(f.read())
  ops = []
  for plane in space.planes:
    for line in plane.lines:
      for event in line.events:
        name = plane.event_metadata[event.metadata_id].name
        match = _SCOPE.search(name)
        if match and not name.endswith(('_Send', '_Recv')):
          start = line.timestamp_ns * 1e-9 + event.offset_ps * 1e-12
          phase = ('backward' if 'gradient_tape/' in name else
                   match.group(3))
          ops.append((int(match.group(1)), int(match.group(2)), phase, start,
                      start + event.duration_ps * 1e-12,
                      name.rpartition(':')[2]))
  return ops


def idle_fraction(ops: List[Op], num_stages: int) -> float:
  """1 - (time each stage had an op running) / (K x span of the step)."""
  begin = min(op[3] for op in ops)
  finish = max(op[4] for op in ops)
  busy = 0.0
  for stage in range(num_stages):  # Length of the union of its op intervals.
    covered_to = begin
    for start, end in sorted(op[3:5] for op in ops if op[0] == stage):
      busy += max(0.0, end - max(start, covered_to))
      covered_to = max(covered_to, end)
  return 1.0 - busy / (num_stages * (finish - begin))


def tasks(ops: List[Op]) -> List[Dict[str, Any]]:
  """Each (stage, micro-batch, phase) task from its first op's start to its
  last op's end (bookkeeping ops left out), in seconds from the step's first
  op; the keys of `simulator.ScheduledTask`."""
  begin = min(op[3] for op in ops)
  spans = {}
  for stage, micro, phase, start, end, op_type in ops:
    if op_type in _BOOKKEEPING_OPS:
      continue
    first, last = spans.get((stage, micro, phase), (start, end))
    spans[(stage, micro, phase)] = (min(first, start), max(last, end))
  return [{'stage': stage, 'microbatch': micro, 'phase': phase,
           'start': first - begin, 'end': last - begin}
          for (stage, micro, phase), (first, last) in sorted(spans.items())]


def measure_step(runner, features, labels) -> Dict[str, Any]:
  """Runs one traced step of `runner` (after one untraced, which traces the
  function); returns its measured idle fraction and tasks."""
  runner.train_step(features, labels).numpy()
  with tempfile.TemporaryDirectory() as trace_dir:
    tf.profiler.experimental.start(trace_dir)
    runner.train_step(features, labels).numpy()
    tf.profiler.experimental.stop()
    ops = trace_ops(trace_dir)
  return {'idle_fraction': idle_fraction(ops, len(runner.stages)),
          'tasks': tasks(ops)}
