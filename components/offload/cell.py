"""A cell: one tf.data service dispatcher and one worker in one process.

One worker per dispatcher gives each job one producer, so its elements come
in the order the dataset makes them (with several workers a consumer
interleaves their tasks in arrival order). Run as a process
(`python -m components.offload.cell`: prints its address as a JSON line and
serves until its stdin closes, so it ends with the process that started it)
or inside a Ray actor (`launch`).
"""

import json
import os
import sys
from typing import Optional

# The cell's dataset graphs are built by the trainer with tf-keras.
os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')

# pylint: disable=g-import-not-at-top,wrong-import-position
from components.offload import launch

# A cell process pins itself, before TensorFlow sizes its thread pools.
if __name__ == '__main__' and os.environ.get(launch.CPUS_ENV):
  os.sched_setaffinity(0, {int(cpu) for cpu in
                           os.environ[launch.CPUS_ENV].split(',')})

import tensorflow as tf

from components.patches import tensorflow_internals
# pylint: enable=g-import-not-at-top,wrong-import-position

# How often the worker tells the dispatcher it is alive, and how long the
# dispatcher waits before it gives a silent worker's tasks up.
_HEARTBEAT_MS = 500


class Cell:
  """A dispatcher and its one worker, listening on `host` (an address the
  consumers reach, '' for localhost)."""

  def __init__(self, host: str = '', port: int = 0):
    self.host = host or 'localhost'
    self._dispatcher = tf.data.experimental.service.DispatchServer(
        tf.data.experimental.service.DispatcherConfig(port=port))
    self.address = f'{self.host}:{self._dispatcher.target.rsplit(":", 1)[1]}'
    self._worker = tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(
            dispatcher_address=self.address,
            worker_address=f'{self.host}:%port%',
            heartbeat_interval_ms=_HEARTBEAT_MS))

  def stop(self) -> None:
    tensorflow_internals.stop_service_servers(self._worker, self._dispatcher)


def main(host: Optional[str] = None) -> None:
  cell = Cell(host or '')
  print(json.dumps({'address': cell.address, 'pid': os.getpid()}),
        flush=True)
  sys.stdin.read()  # Until the parent closes it (or dies).
  cell.stop()


if __name__ == '__main__':
  main(sys.argv[1] if len(sys.argv) > 1 else None)
