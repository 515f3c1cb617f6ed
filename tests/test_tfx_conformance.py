"""Drop-in conformance: TFX's own Trainer and Transform tests, run on ours.

Each class below subclasses a test class of the installed tfx wheel,
generated at test time by `tests.support.tfx_conformance` with only the
module under test swapped: `component.Trainer` -> HighPerfTrainer,
`executor.GenericExecutor` -> our trainer Executor, `component.Transform` ->
OptimizedTransform, `executor.Executor` -> our transform Executor. The test
methods, their data (the wheel's `testdata`) and their assertions are TFX's.

What the subclasses add, and why:
- Transform executor classes give the executor our `tuned_input_pipeline`
  output (outside the folder whose listing the stock test asserts) with a
  short tuning budget, and check after every successful `Do` that it holds a
  valid input pipeline config: the stock tests then also prove that our
  addition works under every stock exec property.
- Each Transform executor class copies its input data into its own folder:
  the stock classes share one folder made at import time, which holds when
  each file runs in its own process (as under Bazel) but not in one pytest
  process (Parquet and SequenceExample copies would mix).
- The trainer executor tests run twice: as shipped, and with every output on
  `ram://` (TFX's `TEST_UNDECLARED_OUTPUTS_DIR` hook).

Exclusions (`NOT_APPLICABLE`): none so far.
"""

import functools
import os
import shutil
import tempfile
import uuid
from unittest import mock

import pytest
from tfx.components.trainer import component as stock_trainer_component
from tfx.components.trainer import executor as stock_trainer_executor
from tfx.components.transform import component as stock_transform_component
from tfx.components.transform import executor as stock_transform_executor
from tfx.types import artifact_utils

from components.records import tuned_input_pipeline
from components.trainer import component as trainer_component
from components.trainer import executor as trainer_executor
from components.transform import component as transform_component
from components.transform.config import TuningConfig
from components.transform import executor as transform_executor
from components.transform import spec_keys as transform_keys
from components.types import TunedInputPipeline
from tests.support.tfx_conformance import stock_test_module
from tests.support.tfx_conformance import SwappedModule

_TRAINER_COMPONENT = SwappedModule(
    stock_trainer_component, Trainer=trainer_component.HighPerfTrainer)
_TRAINER_EXECUTOR = SwappedModule(
    stock_trainer_executor, GenericExecutor=trainer_executor.Executor)


class _CheckedTransformExecutor(transform_executor.Executor):
  """Our executor; after a successful Do, its tuned output must be valid."""

  def Do(self, input_dict, output_dict, exec_properties):
    super().Do(input_dict, output_dict, exec_properties)
    tuned = output_dict.get(transform_keys.TUNED_INPUT_PIPELINE_KEY)
    if tuned:
      tuned_input_pipeline.read(artifact_utils.get_single_uri(tuned)).validate()


_TRANSFORM_EXECUTOR = SwappedModule(
    stock_transform_executor, Executor=_CheckedTransformExecutor)

_trainer_component_test = stock_test_module(
    'components/trainer/component_test.py', {
        'from tfx.components.trainer import component': _TRAINER_COMPONENT,
        'from tfx.components.trainer import executor': _TRAINER_EXECUTOR,
    })
_trainer_executor_test = stock_test_module(
    'components/trainer/executor_test.py', {
        'from tfx.components.trainer import executor': _TRAINER_EXECUTOR,
    })
_transform_component_test = stock_test_module(
    'components/transform/component_test.py', {
        'from tfx.components.transform import component': SwappedModule(
            stock_transform_component,
            Transform=transform_component.OptimizedTransform),
    })
_transform_executor_test = stock_test_module(
    'components/transform/executor_test.py', {
        'from tfx.components.transform import executor': _TRANSFORM_EXECUTOR,
    })
_BASED_ON_EXECUTOR_TEST = {
    'from tfx.components.transform import executor_test':
        _transform_executor_test}
_transform_executor_v2_test = stock_test_module(
    'components/transform/executor_v2_test.py', _BASED_ON_EXECUTOR_TEST)
_transform_executor_on_parquet_test = stock_test_module(
    'components/transform/executor_on_parquet_test.py',
    _BASED_ON_EXECUTOR_TEST)
_transform_executor_sequence_example_test = stock_test_module(
    'components/transform/executor_sequence_example_test.py',
    _BASED_ON_EXECUTOR_TEST)

# Tests that cannot apply to our classes: test name -> why.
NOT_APPLICABLE = {}

# Stock executor tests that fail before any Beam run (a bad module or
# split): quick, so `make test` runs them too.
QUICK = frozenset({'test_do_with_no_preprocessing_fn',
                   'test_do_with_duplicate_preprocessing_fn',
                   'test_do_with_empty_analyze_splits'})

# The TF2 class (TestTransformExecutorV2: the stock component's default,
# force_tf_compat_v1=False) runs every stock executor test in CI. The classes
# that rerun those tests in another mode (tf.compat.v1) or on another input
# format (Parquet, SequenceExample) keep in CI only the tests whose path
# depends on it: reading and materializing the input, several input
# artifacts, the counters. Their other tests (15 per class) repeat a test
# the TF2 class runs and are marked `conformance_repeat`: `make
# test-conformance` runs them, CI does not (the 90-minute limit; see the
# README's test table).
REPEAT_CHECKS = frozenset({'test_do_with_module_file',
                           'test_do_with_multiple_artifacts',
                           'test_counters'})


def _wrapped(test, *marks):
  """`test` as a new function of the class with `marks` (the stock function
  stays unmarked for the other classes that inherit it)."""
  @functools.wraps(test)
  def wrapped(self, _test=test):
    return _test(self)
  for mark in marks:
    wrapped = mark(wrapped)
  return wrapped


def _expectations(cls=None, *, executor=False, repeats=False):
  """Marks the class's tests: those listed in NOT_APPLICABLE as expected
  failures; with `executor`, all but QUICK ones `slow` and `conformance`
  (`make test-conformance`); with `repeats` (a class that reruns the TF2
  class's tests in another mode or on another input format), those not in
  REPEAT_CHECKS also `conformance_repeat`.

  Also hides `tf.test.TestCase.test_session`: a deprecated helper named like
  a test, which skips itself ("Not a test.") when collected.
  """
  def mark(cls):
    cls.test_session = None
    for name in dir(cls):
      if not name.startswith('test') or not callable(getattr(cls, name)):
        continue
      marks = []
      reason = NOT_APPLICABLE.get(f'{cls.__name__}.{name}')
      if reason:
        marks.append(pytest.mark.xfail(reason=reason, strict=True))
      if executor and name not in QUICK:
        marks += [pytest.mark.slow, pytest.mark.conformance]
        if repeats and name not in REPEAT_CHECKS:
          marks.append(pytest.mark.conformance_repeat)
      if marks:
        setattr(cls, name, _wrapped(getattr(cls, name), *marks))
    return cls
  return mark(cls) if cls is not None else mark


@_expectations
class TestTrainerComponent(_trainer_component_test.ComponentTest):
  """tfx/components/trainer/component_test.py on HighPerfTrainer."""


@_expectations(executor=True)
class TestTrainerExecutor(_trainer_executor_test.ExecutorTest):
  """tfx/components/trainer/executor_test.py on HighPerfTrainer's executor,
  with the stock exec properties only."""


@_expectations(executor=True)
class TestTrainerExecutorOnRam(_trainer_executor_test.ExecutorTest):
  """The same, every output (and so the checkpoints) on `ram://`."""

  def setUp(self):
    with mock.patch.dict(os.environ, {
        'TEST_UNDECLARED_OUTPUTS_DIR': f'ram://conformance-{uuid.uuid4().hex}'
    }):
      super().setUp()


@_expectations
class TestTransformComponent(_transform_component_test.ComponentTest):
  """tfx/components/transform/component_test.py on OptimizedTransform."""


class _TransformExecutorSetUp:
  """Own input folder per class; our tuned output, checked after `Do`."""

  # Short: the stock tests' data is small, and the budget is per test.
  TUNING = TuningConfig(time_budget_s=1.0, measure_seconds=0.1,
                        max_candidates=3)

  @classmethod
  def setUpClass(cls):
    cls._TEMP_ARTIFACTS_DIR = tempfile.mkdtemp(prefix='conformance-')
    cls._ARTIFACT_URI_TEMPLATE = os.path.join(cls._TEMP_ARTIFACTS_DIR,
                                              'example_gen{}')
    super().setUpClass()

  @classmethod
  def tearDownClass(cls):
    super().tearDownClass()
    shutil.rmtree(cls._TEMP_ARTIFACTS_DIR, ignore_errors=True)

  def _make_base_do_params(self, source_data_dir, output_data_dir):
    super()._make_base_do_params(source_data_dir, output_data_dir)
    tuned = TunedInputPipeline()
    tuned.uri = os.path.join(output_data_dir + '_tuned_input_pipeline', '0')
    self._output_dict[transform_keys.TUNED_INPUT_PIPELINE_KEY] = [tuned]
    self._exec_properties[transform_keys.TUNING_KEY] = (
        self.TUNING.to_json())


@_expectations(executor=True, repeats=True)
class TestTransformExecutor(_TransformExecutorSetUp,
                            _transform_executor_test.ExecutorTest):
  """tfx/components/transform/executor_test.py (tf.compat.v1 Transform)."""


@_expectations(executor=True)
class TestTransformExecutorV2(_TransformExecutorSetUp,
                              _transform_executor_v2_test.ExecutorV2Test):
  """tfx/components/transform/executor_v2_test.py (native TF2 Transform)."""


@_expectations(executor=True, repeats=True)
class TestTransformExecutorOnParquet(
    _TransformExecutorSetUp,
    _transform_executor_on_parquet_test.ExecutorOnParquetTest):
  """tfx/components/transform/executor_on_parquet_test.py."""


@_expectations(executor=True, repeats=True)
class TestTransformExecutorSequenceExample(
    _TransformExecutorSetUp,
    _transform_executor_sequence_example_test
    .ExecutorWithSequenceExampleTest):
  """tfx/components/transform/executor_sequence_example_test.py."""
