"""The tuner on object storage: it measures the trainer's reader where the
examples are and picks the read-ahead by itself."""

import json
import os
import subprocess
import sys
import uuid

import portpicker
import pytest

from components.testing import gcs_emulator

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


@pytest.mark.slow
def test_the_tuner_reads_ahead_from_a_throttled_store(tmp_path):
  """A store that answers each request 50 ms late at 1 MB/s a stream: one
  stream is the bottleneck, so the tuner adopts a read-ahead (confirmed by a
  second measurement), and the reader at that K reads the rows of K = 1."""
  port = portpicker.pick_unused_port()
  emulator = gcs_emulator.GcsEmulator(port, log_dir=str(tmp_path),
                                      object_store=True)
  try:
    bucket = emulator.create_bucket(f'tuning-{uuid.uuid4().hex[:8]}')
    run = subprocess.run(
        [sys.executable, '-m', 'tests.support.remote_tuning', '--port',
         str(port), '--bucket', bucket, '--work', str(tmp_path / 'local')],
        env={**os.environ, **gcs_emulator.environment(port),
             'TF_CPP_MIN_LOG_LEVEL': '2'},
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
        check=False)
  finally:
    emulator.stop()
  assert run.returncode == 0, run.stderr[-5000:]
  found = json.loads(run.stdout.strip().splitlines()[-1])
  assert found['read_ahead_shards'] > 1, (found['candidates'], found['notes'])
  rows = found['rows']
  assert rows[str(found['read_ahead_shards'])] == rows['1']
  # An epoch of the order over the store's shards (counts estimated from
  # their sizes: no index was copied with them), each row once.
  assert len(set(rows['1'])) == len(rows['1']) > 1500
