"""A partition stream's fetch from a cell: closing it cancels its own
blocked read and nothing else the process runs."""

import os
import signal
import threading
import time

import pytest
import tensorflow as tf

from components.offload import launch
from components.offload import stream


def test_closing_a_blocked_fetch_leaves_other_threads_functions_alone():
  """TF's `get_cancelable_function` makes its manager the whole process's
  while the function runs: a training step started while a fetch's read
  was blocked was cancelled with that read."""
  cell = launch.LocalCell('stopped', None)
  try:
    fetch = stream._Fetch(  # pylint: disable=protected-access
        lambda: tf.data.Dataset.range(10**9), cell.address, 'stopped')
    fetch.get(stream.FIRST_ELEMENT_S, lambda: None)
    os.kill(cell.pid, signal.SIGSTOP)
    # Once what the cell sent is taken, the fetch's read blocks.
    with pytest.raises(stream.CellLost, match='no element'):
      while True:
        fetch.get(1, lambda: None)

    @tf.function
    def steps():  # A second of steps, as a call of the managed loop.
      done = tf.constant(0)
      for _ in tf.range(10):
        tf.py_function(lambda: time.sleep(0.1), [], [])
        done += 1
      return done

    closer = threading.Timer(0.3, fetch.close)
    closer.start()
    assert int(steps()) == 10
    closer.join()
  finally:
    cell.stop()
