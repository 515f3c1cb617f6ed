"""A cell whose dispatcher and worker are processes of their own, so that
its worker can restart under a running job: the dispatcher then gives the
job a task on the new worker, which produces the job from its start (what a
consumer sees after a worker's reconnect)."""

import subprocess
import sys
from typing import Optional

import portpicker

_SERVER = """
import sys, tensorflow as tf
service = tf.data.experimental.service
if sys.argv[1] == 'dispatcher':
  server = service.DispatchServer(service.DispatcherConfig(
      port=int(sys.argv[2])))
else:
  server = service.WorkerServer(service.WorkerConfig(
      dispatcher_address=sys.argv[2], heartbeat_interval_ms=200))
print('serving', flush=True)
sys.stdin.read()
"""


def _serve(*args: str) -> subprocess.Popen:
  process = subprocess.Popen(
      [sys.executable, '-c', _SERVER, *args], stdin=subprocess.PIPE,
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  if process.stdout.readline().strip() != 'serving':
    raise RuntimeError(f'{args[0]} did not start ({process.wait()}).')
  return process


class SplitCell:
  """`launch.LocalCell`'s interface, plus `restart_worker`."""

  def __init__(self, name: str):  # pylint: disable=unused-argument
    port = portpicker.pick_unused_port()
    self.address = f'localhost:{port}'
    self._dispatcher = _serve('dispatcher', str(port))
    self._worker = _serve('worker', self.address)
    self.pid = self._dispatcher.pid

  def restart_worker(self) -> None:
    self._worker.kill()
    self._worker.wait()
    self._worker = _serve('worker', self.address)

  def gone(self) -> Optional[str]:
    code = self._dispatcher.poll()
    return None if code is None else f'its dispatcher is gone (exit {code})'

  def stop(self) -> None:
    for process in (self._worker, self._dispatcher):
      process.kill()
      process.wait()
