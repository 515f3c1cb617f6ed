"""Supervision of local training processes, with real (trivial) children."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from components.trainer import launcher
from components.trainer.launcher import ProcessSpec


def _python(code: str):
  return [sys.executable, '-c', textwrap.dedent(code)]


def _alive(pid: int) -> bool:
  """True while `pid` exists and is not a zombie."""
  try:
    with open(f'/proc/{pid}/stat') as f:
      return f.read().split(')')[-1].split()[0] != 'Z'
  except FileNotFoundError:
    return False


def _wait_for_file(path: str, timeout_s: float = 20) -> str:
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    if os.path.exists(path) and os.path.getsize(path):
      with open(path) as f:
        return f.read()
    time.sleep(0.05)
  raise AssertionError(f'{path} was not written')


def _wait_until_dead(pid: int, timeout_s: float = 10) -> bool:
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    if not _alive(pid):
      return True
    time.sleep(0.05)
  return False


def _sleeper(pid_file: str, ignore_term: bool = False):
  """Writes its pid, sleeps 600 s, then writes `_finished(pid_file)`."""
  return _python(f"""
      import os, signal, time
      {'signal.signal(signal.SIGTERM, signal.SIG_IGN)' if ignore_term else ''}
      with open({pid_file!r}, 'w') as f:
        f.write(str(os.getpid()))
      time.sleep(600)
      open({_finished(pid_file)!r}, 'w').close()
      """)


def _finished(pid_file: str) -> str:
  """Exists only if the sleeper ended on its own: it was not killed."""
  return pid_file + '.finished'


def _assert_killed(pid_file: str) -> None:
  assert not _alive(int(_wait_for_file(pid_file)))
  assert not os.path.exists(_finished(pid_file))


def test_all_trainers_succeed(tmp_path):
  specs = [ProcessSpec(f'worker-{i}', _python(f'print("done {i}")'))
           for i in range(2)]
  result = launcher.run_supervised(lambda attempt: specs, str(tmp_path))
  assert result.attempts == 1
  assert result.restarts == []
  log = tmp_path / 'attempt-0' / 'worker-1.log'
  assert log.read_text().strip() == 'done 1'


def test_crash_fails_with_log_tail_and_kills_the_rest(tmp_path):
  pid_file = str(tmp_path / 'sleeper.pid')
  crash = _python("""
      import sys, time
      time.sleep(0.5)
      for i in range(100):
        print(f'line {i}')
      sys.exit(3)
      """)
  specs = [ProcessSpec('worker-0', crash),
           ProcessSpec('worker-1', _sleeper(pid_file))]
  with pytest.raises(launcher.ClusterFailedError) as error:
    launcher.run_supervised(lambda attempt: specs, str(tmp_path))
  message = str(error.value)
  assert "'worker-0' exited with code 3" in message
  assert 'worker-1: running' in message
  assert 'line 99' in message and 'line 60' in message
  assert 'line 59\n' not in message  # Only the last 40 lines.
  assert error.value.failure.exit_code == 3
  _assert_killed(pid_file)


def test_signal_death_is_reported(tmp_path):
  specs = [ProcessSpec('worker-0', _python("""
      import os, signal
      print('about to die')
      os.kill(os.getpid(), signal.SIGKILL)
      """))]
  with pytest.raises(launcher.ClusterFailedError,
                     match="'worker-0' was killed by signal 9"):
    launcher.run_supervised(lambda attempt: specs, str(tmp_path))


def test_servers_are_stopped_when_trainers_finish(tmp_path):
  pid_file = str(tmp_path / 'server.pid')
  specs = [ProcessSpec('ps-0', _sleeper(pid_file), server=True),
           ProcessSpec('chief', _python(f"""
               import os, time
               while not os.path.exists({pid_file!r}):
                 time.sleep(0.05)
               """))]
  result = launcher.run_supervised(lambda attempt: specs, str(tmp_path))
  assert result.attempts == 1
  _assert_killed(pid_file)


def test_server_exit_is_a_failure(tmp_path):
  specs = [ProcessSpec('ps-0', _python('print("ps quits")'), server=True),
           ProcessSpec('chief', _python('import time; time.sleep(600)'))]
  with pytest.raises(launcher.ClusterFailedError,
                     match="'ps-0' exited with code 0") as error:
    launcher.run_supervised(lambda attempt: specs, str(tmp_path))
  assert 'ps quits' in str(error.value)


def test_timeout_kills_and_fails(tmp_path):
  pid_file = str(tmp_path / 'stuck.pid')
  specs = [ProcessSpec('trainer', _sleeper(pid_file))]
  with pytest.raises(launcher.ClusterTimeoutError, match='timeout_s=2'):
    launcher.run_supervised(lambda attempt: specs, str(tmp_path), timeout_s=2)
  _assert_killed(pid_file)


def test_sigterm_ignoring_process_is_sigkilled_after_grace(tmp_path):
  pid_file = str(tmp_path / 'stubborn.pid')
  specs = [ProcessSpec('worker-0', _python(f"""
               import os, sys, time
               while not os.path.exists({pid_file!r}):
                 time.sleep(0.05)
               sys.exit(1)
               """)),
           ProcessSpec('worker-1', _sleeper(pid_file, ignore_term=True))]
  with pytest.raises(launcher.ClusterFailedError):
    launcher.run_supervised(lambda attempt: specs, str(tmp_path), grace_s=1)
  # It ignored SIGTERM: only the SIGKILL after the grace period ended it.
  _assert_killed(pid_file)


def test_grandchildren_are_killed_with_their_group(tmp_path):
  pid_file = str(tmp_path / 'grandchild.pid')
  grandchild = _sleeper(pid_file)
  specs = [ProcessSpec('worker-0', _python(f"""
      import os, subprocess, sys, time
      subprocess.Popen({grandchild!r})
      while not os.path.exists({pid_file!r}):
        time.sleep(0.05)
      sys.exit(2)
      """))]
  with pytest.raises(launcher.ClusterFailedError):
    launcher.run_supervised(lambda attempt: specs, str(tmp_path))
  assert _wait_until_dead(int(_wait_for_file(pid_file)), timeout_s=5)


def test_restart_relaunches_the_whole_cluster(tmp_path):
  attempts = []

  def make(attempt):
    attempts.append(attempt)
    code = 'import sys; sys.exit(5)' if attempt == 0 else 'print("ok")'
    return [ProcessSpec('worker-0', _python(code)),
            ProcessSpec('worker-1', _python('print("ok")'))]

  result = launcher.run_supervised(make, str(tmp_path), max_restarts=2)
  assert attempts == [0, 1]
  assert result.attempts == 2
  assert [(r.process, r.exit_code, r.attempt) for r in result.restarts] == [
      ('worker-0', 5, 0)]


def test_restarts_run_out(tmp_path):
  specs = [ProcessSpec('worker-0', _python('import sys; sys.exit(4)'))]
  with pytest.raises(launcher.ClusterFailedError, match='attempt 2') as error:
    launcher.run_supervised(lambda attempt: specs, str(tmp_path),
                            max_restarts=2)
  assert len(error.value.restarts) == 2


def test_children_die_with_a_killed_supervisor(tmp_path):
  """SIGKILL of the supervising process leaves no training process behind."""
  pid_file = str(tmp_path / 'orphan.pid')
  supervisor = subprocess.Popen(_python(f"""
      from components.trainer import launcher
      spec = launcher.ProcessSpec('worker-0', {_sleeper(pid_file)!r})
      launcher.run_supervised(lambda attempt: [spec], {str(tmp_path)!r})
      """), cwd=os.path.dirname(os.path.dirname(__file__)))
  child = int(_wait_for_file(pid_file))
  assert _alive(child)
  supervisor.send_signal(signal.SIGKILL)
  supervisor.wait()
  assert _wait_until_dead(child, timeout_s=5)


def test_sigterm_is_forwarded_and_fails_as_preempted(tmp_path):
  """A preemption notice reaches the trainers, which checkpoint and exit;
  the run then fails as preempted, without using up restarts."""
  pid_file = str(tmp_path / 'trainer.pid')
  marker = str(tmp_path / 'checkpointed')
  trainer = _python(f"""
      import os, signal, sys, time
      def on_term(signum, frame):
        with open({marker!r}, 'w') as f:
          f.write('saved')
        sys.exit(75)
      signal.signal(signal.SIGTERM, on_term)
      with open({pid_file!r}, 'w') as f:
        f.write(str(os.getpid()))
      time.sleep(600)
      """)
  server = _sleeper(str(tmp_path / 'server.pid'))
  supervisor = subprocess.Popen(_python(f"""
      from components.trainer import launcher
      specs = [launcher.ProcessSpec('ps-0', {server!r}, server=True),
               launcher.ProcessSpec('chief', {trainer!r})]
      try:
        launcher.run_supervised(lambda attempt: specs, {str(tmp_path)!r},
                                max_restarts=3)
      except launcher.ClusterPreemptedError as e:
        print('PREEMPTED', e.failure.process, e.failure.exit_code,
              len(e.restarts))
      """), cwd=os.path.dirname(os.path.dirname(__file__)),
                                stdout=subprocess.PIPE, text=True)
  _wait_for_file(pid_file)
  _wait_for_file(str(tmp_path / 'server.pid'))
  supervisor.send_signal(signal.SIGTERM)
  stdout, _ = supervisor.communicate(timeout=30)
  assert 'PREEMPTED chief 75 0' in stdout
  assert _wait_for_file(marker) == 'saved'
  assert not _alive(int(_wait_for_file(str(tmp_path / 'server.pid'))))


def test_cluster_layouts():
  argv = lambda role: ['train', role]  # pylint: disable=unnecessary-lambda-assignment
  single = launcher.cluster_processes('mirrored', 1, 0, argv)
  assert [(p.name, p.argv, p.env) for p in single] == [
      ('trainer', ['train', 'trainer'], {'TF_CONFIG': None})]

  mwm = launcher.cluster_processes('multi_worker_mirrored', 3, 0, argv)
  configs = [json.loads(p.env['TF_CONFIG']) for p in mwm]
  assert [c['task'] for c in configs] == [
      {'type': 'worker', 'index': i} for i in range(3)]
  workers = configs[0]['cluster']['worker']
  assert len(set(workers)) == 3 and all(c['cluster'] == {'worker': workers}
                                        for c in configs)
  assert not any(p.server for p in mwm)

  ps = launcher.cluster_processes('parameter_server', 2, 1, argv)
  assert [(p.name, p.argv[1], p.server) for p in ps] == [
      ('ps-0', 'server', True), ('worker-0', 'server', True),
      ('worker-1', 'server', True), ('chief', 'trainer', False)]
  cluster = json.loads(ps[0].env['TF_CONFIG'])['cluster']
  assert {k: len(v) for k, v in cluster.items()} == {
      'chief': 1, 'worker': 2, 'ps': 1}
  addresses = [a for v in cluster.values() for a in v]
  assert len(set(addresses)) == 4
  assert all(p.env['GRPC_FAIL_FAST'] == 'use_caller' for p in ps)
