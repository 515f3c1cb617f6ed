"""One TF task of a Ray attempt: an actor on its node that runs its process.

The actor reports its node and a free port there (for the TF_CONFIGs), runs
the task's process in its own process group (killed by the kernel if the
actor dies), keeps its output for the driver's log pulls and echoes it
(Ray forwards it to the driver's log, prefixed with the task), and passes a
preemption notice or a stop on to the process group.
"""

import os
import signal
import subprocess
import sys
import tempfile
import threading
from typing import Any, Dict, List, Optional

import portpicker
import ray

from components.trainer.cluster import local_backend
from components.trainer.cluster import tf_cluster

# Placeholders in a task's argv that the actor replaces on its node: its
# Python interpreter and its local copy of the training task file.
PYTHON = '<python>'
TASK_FILE = '<task-file>'


class _TaskActor:
  """One TF task on its node: its address there, then its process."""

  def __init__(self, name: str):
    self._name = name
    self._log = bytearray()
    self._lock = threading.Lock()
    self._popen: Optional[subprocess.Popen] = None
    self._dir = tempfile.mkdtemp(prefix='hpm-ray-task-')

  def __repr__(self):
    # Ray prefixes the actor's forwarded output with this.
    return self._name

  def where(self) -> Dict[str, Any]:
    return {'node_id': ray.get_runtime_context().get_node_id(),
            'port': portpicker.pick_unused_port(), 'actor_pid': os.getpid()}

  def run(self, argv: List[str], env: Dict[str, Optional[str]],
          task_json: str) -> int:
    """Runs the task's process to its end; returns its exit code."""
    task_path = os.path.join(self._dir, tf_cluster.TASK_FILE_NAME)
    with open(task_path, 'w') as f:
      f.write(task_json)
    argv = [sys.executable if a == PYTHON else task_path if a == TASK_FILE
            else a for a in argv]
    # The cluster's address, for what the process starts on it (offload
    # cells with launcher 'ray').
    env = {'RAY_ADDRESS': ray.get_runtime_context().gcs_address, **env}
    # Its own process group (stopped as one), killed by the kernel if this
    # actor dies.
    self._popen = subprocess.Popen(
        argv, env=local_backend.process_env(env), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
        preexec_fn=local_backend.die_with_parent(os.getpid()))
    for line in self._popen.stdout:
      with self._lock:
        self._log += line
      sys.stdout.write(line.decode('utf-8', errors='replace'))
      sys.stdout.flush()
    return self._popen.wait()

  def read_log(self, offset: int) -> bytes:
    with self._lock:
      return bytes(self._log[offset:])

  def terminate(self) -> None:
    """Passes a preemption notice on: SIGTERM to the process group."""
    if self._popen is not None and self._popen.poll() is None:
      local_backend.signal_group(self._popen.pid, signal.SIGTERM)

  def stop(self, grace_s: float) -> None:
    """SIGTERM the process group, SIGKILL it after `grace_s`."""
    if self._popen is None:
      return
    if self._popen.poll() is None:
      local_backend.signal_group(self._popen.pid, signal.SIGTERM)
      try:
        self._popen.wait(timeout=grace_s)
      except subprocess.TimeoutExpired:
        pass
    local_backend.signal_group(self._popen.pid, signal.SIGKILL)
    self._popen.wait()


# Threaded, so that log pulls and stop run while `run` blocks.
RemoteTaskActor = ray.remote(max_concurrency=4, max_restarts=0)(_TaskActor)
