"""Starting a cell where the config says, and telling whether it is gone.

`local`: a child process on the cores the training process is not pinned to
(all of them where it is pinned to none). `ray`: an actor on a node with
`cpus_per_cell` free, never restarted by Ray (a lost cell's partitions move
on instead, at the position the trainer reached).
"""

import json
import os
import select
import subprocess
import sys
import time
from typing import Optional, Sequence, Set

from absl import logging

from components.offload.config import OffloadConfig

# Seconds a started cell has to report its address.
START_TIMEOUT_S = 120
# The cores a cell process pins itself to, comma-separated, before it
# imports TensorFlow (which sizes its thread pools by them).
CPUS_ENV = 'TFX_HPM_CELL_CPUS'
# Seconds a killed cell process has to end (one in uninterruptible sleep may
# not): past them it is left, and its stop logged.
STOP_TIMEOUT_S = 10
# Seconds a Ray actor has to answer whether it is alive.
_PING_TIMEOUT_S = 5
_PING_EVERY_S = 2


class CellStartTimeout(RuntimeError):
  """A started cell reported no address in time."""


class LocalCell:
  """A cell in a child process of this one, on `cpus` (None: wherever).

  The child pins itself (`CPUS_ENV`): `preexec_fn` in a threaded
  parent may deadlock the child, Python's documentation warns. Starting waits
  at most `start_timeout_s` for the address; `command` replaces the cell's
  (tests start processes that never serve)."""

  def __init__(self, name: str, cpus: Optional[Set[int]],
               start_timeout_s: float = START_TIMEOUT_S,
               command: Optional[Sequence[str]] = None):
    env = {**os.environ, 'TF_CPP_MIN_LOG_LEVEL': '2'}
    env.pop(CPUS_ENV, None)
    if cpus:
      env[CPUS_ENV] = ','.join(str(cpu) for cpu in sorted(cpus))
    self._name = name
    self._process = subprocess.Popen(
        list(command or [sys.executable, '-m', 'components.offload.cell']),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    self.pid = self._process.pid
    try:  # Every way a start fails leaves no process behind.
      line = _first_line(self._process, start_timeout_s)
      if not line:
        raise RuntimeError(
            f'Offload cell {name} exited before it served (exit code '
            f'{self._process.wait(timeout=STOP_TIMEOUT_S)}).')
      try:
        self.address = json.loads(line)['address']
      except (ValueError, KeyError) as e:
        raise RuntimeError(f'Offload cell {name} printed {line[:200]!r}, '
                           'not its address.') from e
    except BaseException:
      self.stop()
      raise

  def gone(self) -> Optional[str]:
    """Why the cell is gone; None while its process runs."""
    code = self._process.poll()
    return None if code is None else f'its process is gone (exit {code})'

  def stop(self) -> None:
    """Kills the process and waits for it, `STOP_TIMEOUT_S` at most."""
    if self._process.poll() is None:
      self._process.kill()
    try:
      self._process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
      logging.warning('Offload cell %s (pid %d) did not end %d s after its '
                      'kill; left to the system.', self._name, self.pid,
                      STOP_TIMEOUT_S)
    for pipe in (self._process.stdin, self._process.stdout):
      pipe.close()


def _first_line(process: subprocess.Popen, timeout_s: float) -> str:
  """The first line `process` prints ('' when it exits first); raises
  CellStartTimeout after `timeout_s`."""
  deadline, line = time.monotonic() + timeout_s, b''
  descriptor = process.stdout.fileno()
  while not line.endswith(b'\n'):
    remaining = deadline - time.monotonic()
    if remaining <= 0:
      raise CellStartTimeout(
          f'Offload cell (pid {process.pid}) printed no address in '
          f'{timeout_s:g} s.')
    readable, _, _ = select.select([descriptor], [], [], remaining)
    if readable:
      chunk = os.read(descriptor, 4096)
      if not chunk:
        break
      line += chunk
  return line.decode(errors='replace').strip()


class RayCell:
  """A cell in a Ray actor; its node's address is the cell's."""

  def __init__(self, name: str, cpus: float):
    import ray  # pylint: disable=g-import-not-at-top
    self._ray = ray
    if not ray.is_initialized():
      # A training process the Ray launcher started has the cluster's
      # address in RAY_ADDRESS; elsewhere `auto` finds this node's cluster.
      ray.init(address=os.environ.get('RAY_ADDRESS') or 'auto',
               log_to_driver=False)
    actor_class = ray.remote(num_cpus=cpus, max_restarts=0)(_CellActor)
    self._actor = actor_class.remote()
    info = ray.get(self._actor.info.remote(), timeout=START_TIMEOUT_S)
    self.address, self.pid = info['address'], info['pid']
    self._pinged_at, self._gone = time.monotonic(), None

  def gone(self) -> Optional[str]:
    """Why the cell is gone (its actor died, or its node does not answer:
    a partition), None while it answers."""
    # Asked at most every _PING_EVERY_S: a waiting consumer asks twice a
    # second.
    now = time.monotonic()
    if self._gone is None and now - self._pinged_at >= _PING_EVERY_S:
      self._pinged_at = now
      try:
        self._ray.get(self._actor.info.remote(), timeout=_PING_TIMEOUT_S)
      except self._ray.exceptions.GetTimeoutError:
        self._gone = f'its actor did not answer in {_PING_TIMEOUT_S} s'
      except Exception as error:  # pylint: disable=broad-except
        self._gone = f'its actor is gone ({type(error).__name__})'
    return self._gone

  def stop(self) -> None:
    self._ray.kill(self._actor, no_restart=True)


class _CellActor:
  """The cell's process on its Ray node."""

  def __init__(self):
    import ray  # pylint: disable=g-import-not-at-top
    from components.offload import cell  # pylint: disable=g-import-not-at-top
    self._cell = cell.Cell(ray.util.get_node_ip_address())

  def info(self):
    return {'address': self._cell.address, 'pid': os.getpid()}


def start(config: OffloadConfig, name: str):
  """A new cell of `config.launcher`."""
  if config.launcher == 'ray':
    return RayCell(name, config.cpus_per_cell)
  return LocalCell(name, spare_cpus())


def spare_cpus() -> Optional[Set[int]]:
  """The cores this process is not pinned to; None where it may use all
  (or all that exist are its own)."""
  mine = os.sched_getaffinity(0)
  spare = set(range(os.cpu_count() or 1)) - mine
  return spare or None

