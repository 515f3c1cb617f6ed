"""A partition stream's pump from a cell: closing it cancels its own
blocked read and nothing else the process runs."""

import os
import signal
import threading
import time

import tensorflow as tf

from components.offload import launch
from components.offload import stream


def test_closing_a_blocked_pump_leaves_other_threads_functions_alone():
  """TF's `get_cancelable_function` makes its manager the whole process's
  while the function runs: a training step started while a pump's read
  was blocked was cancelled with that read."""
  cell = launch.LocalCell('stopped', None)
  try:
    queue = tf.queue.FIFOQueue(2, [tf.int64])

    def put(number, unused_element):
      with tf.control_dependencies([queue.enqueue([number])]):
        return tf.identity(number)

    pump = stream._Pump(  # pylint: disable=protected-access
        lambda: stream.from_cell(
            tf.data.Dataset.range(10**9).enumerate(), cell.address,
            'stopped'), 0, put, 'stopped')
    assert int(queue.dequeue()) == 0  # The cell served.
    os.kill(cell.pid, signal.SIGSTOP)
    # Once what the cell sent is taken, the pump's read blocks.
    quiet_since, seen = time.monotonic(), pump.progressed_at
    while time.monotonic() - quiet_since < 2:
      if int(queue.size()):
        queue.dequeue()
      if pump.progressed_at != seen:
        quiet_since, seen = time.monotonic(), pump.progressed_at
      time.sleep(0.05)
    assert pump.error is None and not pump.finished

    @tf.function
    def steps():  # A second of steps, as a call of the managed loop.
      done = tf.constant(0)
      for _ in tf.range(10):
        tf.py_function(lambda: time.sleep(0.1), [], [])
        done += 1
      return done

    closer = threading.Timer(0.3, pump.close)
    closer.start()
    assert int(steps()) == 10
    closer.join()
    # The blocked read itself was cancelled: the pump stopped.
    assert pump.stopped.is_set() and pump.error is None
  finally:
    cell.stop()
