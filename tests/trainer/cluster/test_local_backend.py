"""Supervision of local training processes, with real (trivial) children."""

import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from components.trainer.checkpoint.config import SupervisionConfig
from components.trainer.common import exit_codes
from components.trainer.cluster import local_backend
from components.trainer.cluster import supervisor
from components.trainer.cluster import tf_cluster
from components.trainer.cluster.tf_cluster import ProcessSpec
from components.trainer.common import progress


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
  result = local_backend.run_supervised(lambda attempt: specs, str(tmp_path))
  assert result.attempts == 1
  assert result.relaunches == []
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
  with pytest.raises(supervisor.ClusterFailedError) as error:
    local_backend.run_supervised(lambda attempt: specs, str(tmp_path))
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
  with pytest.raises(supervisor.ClusterFailedError,
                     match="'worker-0' was killed by signal 9"):
    local_backend.run_supervised(lambda attempt: specs, str(tmp_path))


def test_servers_are_stopped_when_trainers_finish(tmp_path):
  pid_file = str(tmp_path / 'server.pid')
  specs = [ProcessSpec('ps-0', _sleeper(pid_file), server=True),
           ProcessSpec('chief', _python(f"""
               import os, time
               while not os.path.exists({pid_file!r}):
                 time.sleep(0.05)
               """))]
  result = local_backend.run_supervised(lambda attempt: specs, str(tmp_path))
  assert result.attempts == 1
  _assert_killed(pid_file)


def test_server_exit_is_a_failure(tmp_path):
  specs = [ProcessSpec('ps-0', _python('print("ps quits")'), server=True),
           ProcessSpec('chief', _python('import time; time.sleep(600)'))]
  with pytest.raises(supervisor.ClusterFailedError,
                     match="'ps-0' exited with code 0") as error:
    local_backend.run_supervised(lambda attempt: specs, str(tmp_path))
  assert 'ps quits' in str(error.value)


def test_timeout_kills_and_fails(tmp_path):
  pid_file = str(tmp_path / 'stuck.pid')
  specs = [ProcessSpec('trainer', _sleeper(pid_file))]
  with pytest.raises(supervisor.ClusterTimeoutError, match='timeout_s=2'):
    local_backend.run_supervised(lambda attempt: specs, str(tmp_path),
                                 SupervisionConfig(timeout_s=2))
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
  with pytest.raises(supervisor.ClusterFailedError):
    local_backend.run_supervised(lambda attempt: specs, str(tmp_path),
                                 SupervisionConfig(grace_s=1))
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
  with pytest.raises(supervisor.ClusterFailedError):
    local_backend.run_supervised(lambda attempt: specs, str(tmp_path))
  assert _wait_until_dead(int(_wait_for_file(pid_file)), timeout_s=5)


def test_restart_relaunches_the_whole_cluster(tmp_path):
  attempts = []

  def make(attempt):
    attempts.append(attempt)
    code = 'import sys; sys.exit(5)' if attempt == 0 else 'print("ok")'
    return [ProcessSpec('worker-0', _python(code)),
            ProcessSpec('worker-1', _python('print("ok")'))]

  result = local_backend.run_supervised(make, str(tmp_path),
                                        SupervisionConfig(max_restarts=2))
  assert attempts == [0, 1]
  assert result.attempts == 2
  assert [(r.process, r.exit_code, r.attempt) for r in result.relaunches] == [
      ('worker-0', 5, 0)]


def test_restarts_run_out(tmp_path):
  specs = [ProcessSpec('worker-0', _python('import sys; sys.exit(4)'))]
  with pytest.raises(supervisor.ClusterFailedError, match='attempt 2') as error:
    local_backend.run_supervised(lambda attempt: specs, str(tmp_path),
                            SupervisionConfig(max_restarts=2))
  assert len(error.value.relaunches) == 2


def test_a_not_retryable_failure_is_not_relaunched(tmp_path):
  """E.g. another run holds the checkpoint lease: a relaunch meets it too."""
  specs = [ProcessSpec('worker-0', _python(
      f'import sys; sys.exit({exit_codes.NOT_RETRYABLE_EXIT_CODE})'))]
  with pytest.raises(supervisor.ClusterFailedError,
                     match='exited with code 78 .attempt 0') as error:
    local_backend.run_supervised(lambda attempt: specs, str(tmp_path),
                            SupervisionConfig(max_restarts=2))
  assert error.value.relaunches == []
  assert not (tmp_path / 'attempt-1').exists()


def test_a_preempted_exit_relaunches_without_using_a_restart(tmp_path):
  """A task preempted on its own (SIGTERM to its node, not to the
  supervisor) exits 75 at a checkpoint: the relaunch resumes, and is not
  counted against max_restarts, even where none is allowed."""
  def make(attempt):
    code = (exit_codes.PREEMPTED_EXIT_CODE if attempt < 2 else
            4 if attempt == 2 else 0)
    return [ProcessSpec('worker-0', _python(f'import sys; sys.exit({code})')),
            ProcessSpec('worker-1', _python('print("ok")'))]

  with pytest.raises(supervisor.ClusterFailedError,
                     match='exited with code 4 .attempt 2') as error:
    local_backend.run_supervised(make, str(tmp_path),
                                 SupervisionConfig(max_restarts=0))
  assert [r.exit_code for r in error.value.relaunches] == [75, 75]

  result = local_backend.run_supervised(make, str(tmp_path / 'again'),
                                   SupervisionConfig(max_restarts=1))
  assert result.attempts == 4
  assert [(r.exit_code, r.attempt, r.cause) for r in result.relaunches] == [
      (75, 0, 'preemption'), (75, 1, 'preemption'), (4, 2, 'failure')]
  assert supervisor.count_by_cause(result.relaunches) == {
      'failure': 1, 'preemption': 2, 'membership': 0}


def test_one_judge_for_every_backend():
  """The outcome from the tasks' states alone, whichever backend reports
  them: a task lost with its host (Ray: no exit code) is a failure; after a
  preemption notice, only the trainers' exits count."""
  status = supervisor.TaskStatus
  ps = status('ps-0', server=True, running=True)
  chief = status('chief', server=False, running=True)
  lost = status('worker-0', server=True, running=False, note='[Ray] died')
  assert supervisor.judge([ps, chief], notified=False) is None
  assert supervisor.judge([ps, lost, chief], notified=False) == (
      supervisor.Outcome.FAILED, lost)
  done = status('chief', server=False, running=False, exit_code=0)
  assert supervisor.judge([ps, done], notified=False) == (
      supervisor.Outcome.DONE, done)
  stopped = status('chief', server=False, running=False, exit_code=-15)
  assert supervisor.judge([ps, lost, stopped], notified=True) == (
      supervisor.Outcome.PREEMPTED, stopped)
  assert supervisor.judge([lost, chief], notified=True) is None


def test_children_die_with_a_killed_supervisor(tmp_path):
  """SIGKILL of the supervising process leaves no training process behind."""
  pid_file = str(tmp_path / 'orphan.pid')
  supervisor = subprocess.Popen(_python(f"""
      from components.trainer.cluster import local_backend, tf_cluster
      spec = tf_cluster.ProcessSpec('worker-0', {_sleeper(pid_file)!r})
      local_backend.run_supervised(lambda attempt: [spec], {str(tmp_path)!r})
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
      from components.trainer.checkpoint.config import SupervisionConfig
      from components.trainer.cluster import local_backend
      from components.trainer.cluster import supervisor, tf_cluster
      specs = [tf_cluster.ProcessSpec('ps-0', {server!r}, server=True),
               tf_cluster.ProcessSpec('chief', {trainer!r})]
      try:
        local_backend.run_supervised(lambda attempt: specs, {str(tmp_path)!r},
                                SupervisionConfig(max_restarts=3))
      except supervisor.ClusterPreemptedError as e:
        print('PREEMPTED', e.failure.process, e.failure.exit_code,
              len(e.relaunches))
      """), cwd=os.path.dirname(os.path.dirname(__file__)),
                                stdout=subprocess.PIPE, text=True)
  _wait_for_file(pid_file)
  _wait_for_file(str(tmp_path / 'server.pid'))
  supervisor.send_signal(signal.SIGTERM)
  stdout, _ = supervisor.communicate(timeout=30)
  assert 'PREEMPTED chief 75 0' in stdout
  assert _wait_for_file(marker) == 'saved'
  assert not _alive(int(_wait_for_file(str(tmp_path / 'server.pid'))))


def _chief_writing_progress(progress_file: str, steps, exit_code: int):
  """A chief that records progress.json as the real one does (the numbers
  from `progress.details`, the file replaced atomically), then exits."""
  return _python(f"""
      import json, os, sys, time
      from components.trainer.common import progress
      for step in {list(steps)!r}:
        record = progress.details(
            step=step, train_steps=4, loss=0.5 / step, steps_per_sec=2.0,
            steady=step > 1, examples_per_step=32, elapsed_s=0.5 * step,
            checkpoints=step // 2, last_checkpoint_step=step // 2 * 2 or None)
        record.update(step=step, time=time.time())
        with open({progress_file!r} + '.tmp', 'w') as f:
          json.dump(record, f)
        os.replace({progress_file!r} + '.tmp', {progress_file!r})
        time.sleep(1.0)  # Ten relay periods.
      sys.exit({exit_code})
      """)


def test_progress_is_logged_through_the_component_logger(tmp_path, caplog):
  """The chief's progress.json, read every few seconds (here 0.1 s) while
  the cluster runs and once as it ends, becomes lines of the component's
  logger; a previous run's record is not shown."""
  progress_file = tmp_path / 'progress.json'
  progress_file.write_text(json.dumps({
      'step': 99, 'train_steps': 100, 'time': time.time() - 3600,
      'examples_per_sec': 1.0, 'elapsed_s': 1.0}))

  def make(attempt):  # Attempt 0 fails after step 2; attempt 1 finishes.
    steps, code = ([1, 2], 1) if attempt == 0 else ([3, 4], 0)
    return [ProcessSpec('chief', _chief_writing_progress(str(progress_file),
                                                         steps, code))]

  caplog.set_level(logging.INFO, logger='tfx_hpm')
  result = local_backend.run_supervised(
      make, str(tmp_path / 'logs'),
      SupervisionConfig(max_restarts=1, progress_every_s=0.1),
      read_progress=lambda: json.loads(progress_file.read_text()))
  assert result.attempts == 2
  lines = [r.getMessage() for r in caplog.records
           if r.name == progress.LOGGER.name]
  assert lines, caplog.text
  assert not any('step 99/100' in line for line in lines)
  assert lines == [
      'Training step 1/4 (25%), loss 0.5000, 64 examples/s, elapsed 0 s, '
      'ETA ?, checkpoints 0, restarts 0',
      'Training step 2/4 (50%), loss 0.2500, 64 examples/s, elapsed 1 s, '
      'ETA 1 s, checkpoints 1 (last at step 2), restarts 0',
      'Training step 3/4 (75%), loss 0.1667, 64 examples/s, elapsed 2 s, '
      'ETA 0 s, checkpoints 1 (last at step 2), restarts 1',
      'Training step 4/4 (100%), loss 0.1250, 64 examples/s, elapsed 2 s, '
      'ETA 0 s, checkpoints 2 (last at step 4), restarts 1',
  ], caplog.text


def _chief_with_pauses(progress_file: str, unreadable: str, script):
  """A chief that records progress.json as the real one does, following
  `script`: ('step', n) records step n of 8, ('saving', n) a save of step n,
  ('pause', s) sleeps, ('unreadable', s) makes the record unreadable for s
  seconds, ('hang',) sleeps for good, ('exit',) exits 0."""
  return _python(f"""
      import json, os, sys, time
      from components.trainer.common import progress
      def write(step, **extra):
        record = dict(progress.details(
            step=step, train_steps=8, loss=0.5, steps_per_sec=2.0, steady=True,
            examples_per_step=32, elapsed_s=1.0, checkpoints=0,
            last_checkpoint_step=None), step=step, time=time.time(), **extra)
        with open({progress_file!r} + '.tmp', 'w') as f:
          json.dump(record, f)
        os.replace({progress_file!r} + '.tmp', {progress_file!r})
      for what, *value in {script!r}:
        if what == 'step':
          write(value[0])
        elif what == 'saving':
          write(value[0], **{{progress.PAUSED: 'saving'}})
        elif what == 'pause':
          time.sleep(value[0])
        elif what == 'unreadable':
          open({unreadable!r}, 'w').close()
          time.sleep(value[0])
          os.remove({unreadable!r})
        elif what == 'hang':
          time.sleep(600)
        elif what == 'exit':
          sys.exit(0)
      """)


def test_a_chief_recording_no_new_step_is_hung_killed_and_relaunched(
    tmp_path):
  """No new step for hang_timeout_s: the attempt is killed at once and
  relaunched, as a restart. The clock does not run before the first step,
  during a save, while the record cannot be read, or after the last step
  (evaluation and export record none): each of those pauses here is more
  than twice hang_timeout_s."""
  progress_file, unreadable = tmp_path / 'progress.json', tmp_path / 'gone'
  pid_file = str(tmp_path / 'hung.pid')
  hang_s, pause_s = 1.0, 2.5

  def make(attempt):
    if attempt == 0:
      script = [('pause', pause_s), ('step', 1), ('step', 2),
                ('saving', 2), ('pause', pause_s), ('step', 3),
                ('unreadable', pause_s), ('step', 4), ('hang',)]
      argv = _python(f"""
          import os, subprocess, sys
          with open({pid_file!r}, 'w') as f:
            f.write(str(os.getpid()))
          sys.exit(subprocess.call({_chief_with_pauses(
              str(progress_file), str(unreadable), script)!r}))
          """)
    else:
      argv = _chief_with_pauses(
          str(progress_file), str(unreadable),
          [('step', 5), ('step', 8), ('pause', pause_s), ('exit',)])
    return [ProcessSpec('chief', argv)]

  def read():
    if unreadable.exists() or not progress_file.exists():
      return None
    return json.loads(progress_file.read_text())

  result = local_backend.run_supervised(
      make, str(tmp_path / 'logs'),
      SupervisionConfig(max_restarts=1, hang_timeout_s=hang_s,
                        progress_every_s=0.1), read_progress=read)
  assert result.attempts == 2
  [hung] = result.relaunches
  assert (hung.process, hung.exit_code, hung.attempt) == ('chief', None, 0)
  assert re.search(r'No new training step for \d+ s \(hang_timeout_s=1\)',
                   hung.log_tail), hung.log_tail
  _assert_killed(pid_file)

  with pytest.raises(supervisor.ClusterFailedError,
                     match=r"'chief' recorded no progress \(hung\) and was "
                     r'killed \(attempt 0\)'):
    local_backend.run_supervised(
        lambda attempt: [ProcessSpec('chief', _chief_with_pauses(
            str(progress_file), str(unreadable), [('step', 1), ('hang',)]))],
        str(tmp_path / 'logs-2'),
        SupervisionConfig(hang_timeout_s=hang_s, progress_every_s=0.1),
        read_progress=read)


class _ElasticAttempt(local_backend.LocalAttempt):
  """A local attempt that says it runs `workers` of `full_workers` and
  finds room to grow at its second check."""

  def __init__(self, specs, attempt, attempt_dir, workers, full_workers):
    super().__init__(specs, attempt, attempt_dir)
    self.workers, self.full_workers = workers, full_workers
    if workers < full_workers:
      self.membership_reason = f'only {workers} of {full_workers} fit'
    self.checks = 0

  def can_grow(self):
    self.checks += 1
    return self.checks >= 2


def test_a_smaller_attempt_grows_back_at_a_checkpoint(tmp_path, caplog):
  """An elastic cluster below full size: every rescale_check_s the attempt
  is asked for room; once there is, its tasks get the notice (they
  checkpoint and exit 75) and the cluster is relaunched at full size, not
  as a restart. Both membership changes are recorded; the progress line
  says `workers 1/2` while the cluster is smaller."""
  progress_file = tmp_path / 'progress.json'
  stopped = str(tmp_path / 'stopped')
  attempts = []

  def start(index, attempt_dir):
    if index == 0:
      specs = [ProcessSpec('worker-0', _python(f"""
          import json, os, signal, sys, time
          def stop(*_):
            open({stopped!r}, 'w').close()
            sys.exit({exit_codes.PREEMPTED_EXIT_CODE})
          signal.signal(signal.SIGTERM, stop)
          with open({str(progress_file)!r}, 'w') as f:
            json.dump(dict(step=1, train_steps=4, time=time.time(),
                           examples_per_sec=1.0, elapsed_s=1.0), f)
          time.sleep(600)
          """))]
      attempt = _ElasticAttempt(specs, index, attempt_dir, 1, 2)
    else:
      specs = [ProcessSpec(f'worker-{i}', _python('print("ok")'))
               for i in range(2)]
      attempt = _ElasticAttempt(specs, index, attempt_dir, 2, 2)
    attempts.append(attempt)
    return attempt

  caplog.set_level(logging.INFO, logger='tfx_hpm')
  result = supervisor.supervise(
      start, str(tmp_path / 'logs'),
      SupervisionConfig(max_restarts=0, rescale_check_s=0.5,
                        progress_every_s=0.1),
      read_progress=lambda: (json.loads(progress_file.read_text())
                             if progress_file.exists() else None))
  assert result.attempts == 2 and attempts[0].checks == 2
  assert os.path.exists(stopped)  # It got the notice.
  [rescaled] = result.relaunches
  assert rescaled.exit_code == exit_codes.PREEMPTED_EXIT_CODE
  # Not a restart: a relaunch of its own cause.
  assert rescaled.cause == 'membership'
  assert [(e.attempt, e.from_workers, e.to_workers, e.full_workers,
           e.reason) for e in result.membership] == [
               (0, 2, 1, 2, 'only 1 of 2 fit'),
               (1, 1, 2, 2, 'room for all 2 workers again')]
  lines = [r.getMessage() for r in caplog.records
           if r.name == progress.LOGGER.name]
  assert lines and lines[0].endswith('restarts 0, workers 1/2'), lines


def test_error_tail_drops_tensorflow_startup_noise(tmp_path):
  """The failure's log tail shows the real error, not what TF prints as it
  starts; the log file keeps everything."""
  startup = [  # As TensorFlow 2.16 prints them here, at every start.
      '2026-12-01 12:52:26.314409: E external/local_xla/xla/stream_executor/'
      'cuda/cuda_fft.cc:479] Unable to register cuFFT factory: Attempting to '
      'register factory for plugin cuFFT when one has already been registered',
      '2026-12-01 12:52:26.345973: E external/local_xla/xla/stream_executor/'
      'cuda/cuda_dnn.cc:10575] Unable to register cuDNN factory: Attempting '
      'to register factory for plugin cuDNN when one has already been '
      'registered',
      '2026-12-01 12:52:26.346056: E external/local_xla/xla/stream_executor/'
      'cuda/cuda_blas.cc:1442] Unable to register cuBLAS factory: Attempting '
      'to register factory for plugin cuBLAS when one has already been '
      'registered',
      '2026-12-01 12:52:26.400000: I tensorflow/core/util/port.cc:113] oneDNN '
      'custom operations are on. You may see slightly different numerical '
      'results due to floating-point round-off errors from different '
      'computation orders.',
      '2026-12-01 12:52:28.014421: W tensorflow/compiler/tf2tensorrt/utils/'
      'py_utils.cc:38] TF-TRT Warning: Could not find TensorRT',
  ]
  # A file, so that the traceback shows source lines (indented, like the
  # source line under a warning).
  script = tmp_path / 'trainer.py'
  script.write_text(textwrap.dedent(f"""
      import sys, warnings
      for line in {startup!r}:
        print(line, file=sys.stderr)
      warnings.warn('You are using a non-supported Python version',
                    FutureWarning)
      print('training step 3')
      def train():
        raise ValueError('the real problem')
      train()
      """))
  specs = [ProcessSpec('trainer', [sys.executable, str(script)])]
  with pytest.raises(supervisor.ClusterFailedError) as error:
    local_backend.run_supervised(lambda attempt: specs, str(tmp_path))
  message = str(error.value)
  assert 'training step 3' in message
  assert 'Traceback (most recent call last):' in message
  assert 'in train' in message and "raise ValueError('the real problem')" in (
      message)
  assert message.rstrip().endswith('ValueError: the real problem')
  for noise in ('cuFFT', 'cuDNN', 'cuBLAS', 'oneDNN', 'TensorRT',
                'FutureWarning', 'warnings.warn'):
    assert noise not in message, message
  log = (tmp_path / 'attempt-0' / 'trainer.log').read_text()
  assert all(line in log for line in startup) and 'FutureWarning' in log


def test_cluster_layouts():
  argv = lambda role: ['train', role]  # pylint: disable=unnecessary-lambda-assignment
  single = tf_cluster.cluster_processes('mirrored', 1, 0, argv)
  assert [(p.name, p.argv, p.env) for p in single] == [
      ('trainer', ['train', 'trainer'], {'TF_CONFIG': None})]

  mwm = tf_cluster.cluster_processes('multi_worker_mirrored', 3, 0, argv)
  configs = [json.loads(p.env['TF_CONFIG']) for p in mwm]
  assert [c['task'] for c in configs] == [
      {'type': 'worker', 'index': i} for i in range(3)]
  workers = configs[0]['cluster']['worker']
  assert len(set(workers)) == 3 and all(c['cluster'] == {'worker': workers}
                                        for c in configs)
  assert not any(p.server for p in mwm)

  ps = tf_cluster.cluster_processes('parameter_server', 2, 1, argv)
  assert [(p.name, p.argv[1], p.server) for p in ps] == [
      ('ps-0', 'server', True), ('worker-0', 'server', True),
      ('worker-1', 'server', True), ('chief', 'trainer', False)]
  cluster = json.loads(ps[0].env['TF_CONFIG'])['cluster']
  assert {k: len(v) for k, v in cluster.items()} == {
      'chief': 1, 'worker': 2, 'ps': 1}
  addresses = [a for v in cluster.values() for a in v]
  assert len(set(addresses)) == 4
  assert all(p.env['GRPC_FAIL_FAST'] == 'use_caller' for p in ps)
