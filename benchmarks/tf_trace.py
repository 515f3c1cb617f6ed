"""Where the time of a few traced calls went, from a TF profiler trace.

The trace's host plane has one line per thread; each thread's busy time is
the union of its events' intervals (events nest). Threads are grouped by
what they run: the Python caller, TensorFlow's op pool (`tf_Compute`), the
caller's wait for the next batch (`tf_data_iterator_get_next`, on the step's
critical path) and tf.data's own work (iterator and private threads).
"""

import glob
import os
import tempfile
from typing import Callable, Dict

import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2

GROUPS = (
    ('tf_data_iterator_get_next', 'waiting for the next batch (GetNext)'),
    ('tf_data', 'tf.data work (its own threads)'),
    ('tf_Compute', 'ops of the step (op pool threads, summed)'),
    ('python', 'the call, as the caller sees it'),
)


def _busy_seconds(line) -> float:
  busy, covered_to = 0.0, None
  for start, end in sorted((e.offset_ps, e.offset_ps + e.duration_ps)
                           for e in line.events):
    covered_to = start if covered_to is None else max(covered_to, start)
    busy += max(0, end - covered_to)
    covered_to = max(covered_to, end)
  return busy * 1e-12


def busy_seconds(trace_dir: str) -> Dict[str, float]:
  """Busy seconds per group (GROUPS) in the trace under `trace_dir`."""
  (path,) = glob.glob(os.path.join(trace_dir, '**', '*.xplane.pb'),
                      recursive=True)
  space = xplane_pb2.XSpace()
  with open(path, 'rb') as f:
    space.ParseFromString(f.read())
  totals = {label: 0.0 for _, label in GROUPS}
  for plane in space.planes:
    if plane.name != '/host:CPU':
      continue
    for line in plane.lines:
      for prefix, label in GROUPS:
        if line.name.startswith(prefix):
          totals[label] += _busy_seconds(line)
          break
  return totals


def trace(call: Callable[[], None]) -> Dict[str, float]:
  """Runs `call` under the profiler; its busy seconds per group."""
  with tempfile.TemporaryDirectory() as trace_dir:
    tf.profiler.experimental.start(trace_dir)
    try:
      call()
    finally:
      tf.profiler.experimental.stop()
    return busy_seconds(trace_dir)
