"""Shared fixtures: a small real slice of the taxi data, tf-keras everywhere,
a local GCS server (`gcs_bucket`) for gs:// pipeline roots, and the trainer
tests' id dataset (`data`) and child-process environment (`child_env`)."""

import os
import pathlib
import sys
import uuid

# Must be set before TensorFlow is imported anywhere in the test process.
os.environ.setdefault('TF_USE_LEGACY_KERAS', '1')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')

import portpicker  # pylint: disable=g-import-not-at-top

from components.testing import gcs_emulator  # pylint: disable=g-import-not-at-top

# gs:// goes to a local emulator, in this process and in every process the
# tests start (pipeline runners, trainer workers inherit os.environ). TF reads
# its filesystem settings when it is imported, so this happens here, before
# any test module imports it; the server itself starts only when a test asks
# for `gcs_bucket`. Local paths are unaffected.
GCS_EMULATOR_PORT = portpicker.pick_unused_port()
os.environ.update(gcs_emulator.environment(GCS_EMULATOR_PORT))

import filelock  # pylint: disable=g-import-not-at-top
import pytest  # pylint: disable=g-import-not-at-top

from components import patches  # pylint: disable=g-import-not-at-top
from pipelines import data  # pylint: disable=g-import-not-at-top

# Beam steps in the test processes run as our entry points run them: on the
# in-process DirectRunner, with no Prism download (Beam 2.78).
patches.keep_installed(patches.DIRECT_RUNNER_IN_PROCESS)

SAMPLE_ROWS = 2000

# Seeds the randomized fault tests (kill steps): different every run, printed
# in the session header so a failure can be replayed with
# TFX_HPM_TEST_SEED=<seed>.
RUN_SEED = int(os.environ.get('TFX_HPM_TEST_SEED') or
               int.from_bytes(os.urandom(4), 'big'))
# pytest-xdist workers start after this and inherit it: one seed per run.
os.environ['TFX_HPM_TEST_SEED'] = str(RUN_SEED)


def pytest_report_header(config):
  del config
  return f'fault-injection seed: TFX_HPM_TEST_SEED={RUN_SEED}'


@pytest.fixture(scope='session')
def run_seed() -> int:
  """This run's seed for random fault points (see RUN_SEED)."""
  return RUN_SEED


@pytest.fixture(scope='session')
def run_dir(tmp_path_factory, worker_id) -> pathlib.Path:
  """A folder of this whole run, shared by its xdist workers (use a
  `filelock.FileLock` to make something there once)."""
  base = tmp_path_factory.getbasetemp()
  return base if worker_id == 'master' else base.parent


@pytest.fixture(scope='session')
def taxi_sample_dir(run_dir) -> str:
  """The first SAMPLE_ROWS rows of the taxi CSV shipped with tfx, written
  once a run (read only: every worker's pipelines read the same files, so
  their ExampleGen executions have the same cache key)."""
  sample = run_dir / 'taxi_sample'
  with filelock.FileLock(f'{sample}.lock'):
    if not sample.exists():
      written = data.write_sample(data.default_data_root(), f'{sample}.tmp',
                                  SAMPLE_ROWS)
      os.rename(written, sample)
  return str(sample)


@pytest.fixture(scope='session', name='data')
def id_data(tmp_path_factory):
  """tests/support/trainer_testing's dataset of NUM_EXAMPLES examples with
  an `id` feature (read only: one for the session)."""
  # pylint: disable-next=g-import-not-at-top
  from components.testing import trainer_testing  # TF on first use only.
  return trainer_testing.write_id_dataset(
      str(tmp_path_factory.mktemp('ids')), trainer_testing.NUM_EXAMPLES)


@pytest.fixture
def child_env(monkeypatch):
  """The launcher starts processes with this process's environment."""
  # pylint: disable-next=g-import-not-at-top
  from components.testing import trainer_testing
  for key, value in trainer_testing.child_env().items():
    monkeypatch.setenv(key, value)


@pytest.fixture(scope='session')
def taxi_upstream(run_dir, taxi_sample_dir) -> str:
  """The folder of `tests.support.taxi_runs.run_upstream`: ExampleGen ..
  Transform (stock) on the taxi sample, run once a run for every worker.
  `taxi_runs.start_from` copies its MLMD file into a root, where a pipeline
  of the same name with caching on then reuses those executions."""
  from components.testing import taxi_runs  # pylint: disable=g-import-not-at-top
  upstream = run_dir / 'taxi_upstream'
  with filelock.FileLock(f'{upstream}.lock'):
    if not (upstream / taxi_runs.METADATA).exists():
      taxi_runs.run_upstream(str(upstream), taxi_sample_dir)
  return str(upstream)


@pytest.fixture(scope='session')
def shared_taxi_root(tmp_path_factory, taxi_upstream) -> str:
  """One pipeline root (with its MLMD file) for the Trainer-level taxi
  pipeline runs of this worker (`tests.support.taxi_runs.run`): it starts
  from `taxi_upstream`, so each run there executes only its Trainer,
  Evaluator and Pusher (reading the upstream artifacts where they are)."""
  from components.testing import taxi_runs  # pylint: disable=g-import-not-at-top
  root = str(tmp_path_factory.mktemp('shared_taxi_root'))
  taxi_runs.start_from(taxi_upstream, root)
  return root


@pytest.fixture(scope='session')
def gcs_emulator_server(tmp_path_factory):
  """The GCS emulator process, started on first use, killed at the end.

  When a test failed, the end of its log is printed in the summary.
  """
  server = gcs_emulator.GcsEmulator(
      GCS_EMULATOR_PORT, log_dir=str(tmp_path_factory.mktemp('gcs_emulator')))
  _STARTED.append(server)
  try:
    yield server
  finally:
    server.stop()


@pytest.fixture(scope='session')
def gcs_bucket(gcs_emulator_server) -> str:
  """'gs://<bucket>': a fresh bucket on the session's GCS emulator."""
  return gcs_emulator_server.create_bucket(f'tfx-hpm-{uuid.uuid4().hex[:12]}')


_STARTED = []

# The set a test belongs to (`make test` runs the core set; `make test-all`
# both, in one session).
SET_MARKERS = ('extended', 'conformance')


def set_of(item) -> str:
  for marker in SET_MARKERS:
    if item.get_closest_marker(marker):
      return marker
  return 'core'


def pytest_collection_modifyitems(items):
  """Within each module, the core tests first; each test's set in the JUnit
  XML.

  One `make test-all` session then builds each module's and the session's
  shared fixtures (a Ray cluster, a baseline training, the shared pipeline
  upstream) once for both sets, and a core test pays for the fixtures it
  uses, as it would in `make test`.
  """
  modules = {}
  for item in items:
    modules.setdefault(item.nodeid.split('::')[0], []).append(item)
  items[:] = [item for module in modules.values()
              for item in sorted(module, key=lambda i: set_of(i) != 'core')]
  for item in items:
    item.user_properties.append(('set', set_of(item)))


# Files with the longest runs (measured serially: pipelines, notebooks,
# clusters), longest first. pytest-xdist hands files out by test count, which
# would leave these few-test files for last and one worker running them alone.
LONG_FILES = (
    'tests/test_tfx_conformance.py', 'tests/test_gcs_pipeline.py',
    'tests/test_notebook.py',
    'tests/test_kubeflow_run.py', 'tests/trainer/cluster/test_ray_backend.py',
    'tests/trainer/test_pipeline.py', 'tests/test_dropin_pipelines.py',
    'tests/transform/test_pipeline.py', 'tests/trainer/managed/test_resume.py',
    'tests/trainer/cluster/test_faults.py')


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
  """Whole files to workers (`--dist loadfile`), LONG_FILES first."""
  # pylint: disable-next=g-import-not-at-top
  from xdist.scheduler import LoadFileScheduling

  class LongFilesFirst(LoadFileScheduling):

    def _assign_work_unit(self, node):
      for scope in reversed(LONG_FILES):
        if scope in self.workqueue:
          self.workqueue.move_to_end(scope, last=False)
      super()._assign_work_unit(node)

  if config.getvalue('dist') != 'loadfile':
    return None
  return LongFilesFirst(config, log)


def pytest_terminal_summary(terminalreporter):
  stats = terminalreporter.stats
  if not _STARTED or not (stats.get('failed') or stats.get('error')):
    return
  server = _STARTED[0]
  terminalreporter.section('GCS emulator log')
  terminalreporter.write_line(f'{server.log_path} (last lines):')
  terminalreporter.write_line(server.log_tail(8000))


_EXIT_STATUS = []


def pytest_sessionfinish(session, exitstatus):
  del session
  _EXIT_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
  """Ends the process once pytest has reported, skipping interpreter teardown.

  With TensorFlow, TFMA and TFX loaded, protobuf's finalizers can crash while
  freeing TF objects at interpreter shutdown (a segfault, exit 139, after
  every test passed; seen here under `tests/test_kubeflow_run.py`). The
  pipeline runners end the same way (`os._exit`).
  """
  del config
  # An xdist worker reports to the controller through its gateway and
  # exits when the controller closes it; only the controller ends here.
  if _EXIT_STATUS and 'PYTEST_XDIST_WORKER' not in os.environ:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_EXIT_STATUS[0])  # pylint: disable=protected-access
