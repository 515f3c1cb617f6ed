"""What `pipelines.local_runner` prints: a progress report on the console,
everything else in the log file (asserted by the pipeline tests)."""

import re

NODES = ('CsvExampleGen', 'Transform', 'Trainer', 'Evaluator', 'Pusher')


def assert_progress_report(console: str, stdout: str, log_file: str,
                           variant: str, train_steps: int = 0) -> None:
  """Per component: started, done in N s; the hpm trainer's progress lines;
  TFX's INFO (node protos, artifact dicts) only in the log file."""
  for node in NODES:
    assert f'[{node}] started' in console, console
    assert re.search(rf'\[{node}\] done in \d+\.\d s', console), console
  if variant == 'hpm':
    assert re.search(rf'\[Trainer\] Training step {train_steps}/'
                     rf'{train_steps} \(100%\), loss \d', console), console
  assert 'Running launcher for' not in console
  assert f'full log: {log_file}' in stdout
  with open(log_file) as f:
    log = f.read()
  assert 'Running launcher for' in log and '[Trainer] started' not in log
