"""Every patch of TFX and TensorFlow internals, in one package.

tfx-hpm changes library behaviour where the libraries offer no public hook.
Each change is a `Patch` below: the private symbols it relies on (with the
parameters it calls or overrides them with) and the library version it was
written for. `installed(*patches)` checks each one, failing with a
`PatchError` that names the expected and the installed version when the
library is another version or a symbol moved, and installs the swaps for the
block, reference-counted across threads: the library's own object comes back
when the last user leaves, not when the first one does.
`tests/test_patches.py` checks every patch against the installed libraries.

This module imports no TFX or TensorFlow; each patch imports what it
changes when it is installed.
"""

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import sys
import threading
import types
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

# The library versions (major.minor) every patch here was written against;
# setup.py pins the same.
EXPECTED_VERSIONS = {'tfx': '1.16', 'tensorflow': '2.16'}
_LIBRARY_NAMES = {'tfx': 'TFX', 'tensorflow': 'TensorFlow'}


class PatchError(RuntimeError):
  """A patch does not fit the installed library (another version, a moved
  symbol)."""


@dataclasses.dataclass(frozen=True)
class Symbol:
  """A library attribute a patch relies on: `module:attr[.attr...]`, and the
  parameter names it is called or overridden with (None: not callable)."""
  path: str
  params: Optional[Tuple[str, ...]] = None


@dataclasses.dataclass(frozen=True)
class Patch:
  """One change to a library.

  Attributes:
    name: what the patch is called in errors.
    library: 'tfx' or 'tensorflow' (keys of EXPECTED_VERSIONS).
    why: one line, for the error message.
    symbols: the private symbols it relies on.
    install: swaps the library's object(s); returns the undo. None for
      patches that only override private methods in a subclass: they are
      checked, nothing is swapped.
  """
  name: str
  library: str
  why: str
  symbols: Tuple[Symbol, ...]
  install: Optional[Callable[[], Callable[[], None]]] = None


def resolve(path: str) -> Any:
  """The object at `module:attr.attr`; AttributeError/ImportError if moved."""
  module_name, _, attrs = path.partition(':')
  value = importlib.import_module(module_name)
  for attr in filter(None, attrs.split('.')):
    value = getattr(value, attr)
  return value


def installed_version(library: str) -> str:
  return str(getattr(importlib.import_module(library), '__version__', '?'))


def check(patch: Patch) -> None:
  """Raises PatchError unless `patch` fits the installed library."""
  expected = EXPECTED_VERSIONS[patch.library]
  library = _LIBRARY_NAMES[patch.library]
  version = installed_version(patch.library)
  where = (f"tfx-hpm's patch {patch.name!r} ({patch.why}) was written for "
           f'{library} {expected}')
  if version.split('.')[:2] != expected.split('.'):
    raise PatchError(f'{where}; installed: {library} {version}. Install '
                     f'{library} {expected}.x (setup.py pins it) or port the '
                     'patch in components/patches.')
  for symbol in patch.symbols:
    try:
      value = resolve(symbol.path)
    except (ImportError, AttributeError) as e:
      raise PatchError(f'{where}; {symbol.path} is missing in the installed '
                       f'{library} {version} ({e}).') from e
    if symbol.params is None:
      continue
    params = tuple(inspect.signature(value).parameters)
    if params != symbol.params:
      raise PatchError(f'{where}; {symbol.path} takes {params} in the '
                       f'installed {library} {version}, the patch expects '
                       f'{symbol.params}.')


# Re-entrant: installing a patch may import a module that installs one.
_lock = threading.RLock()
_users: Dict[str, int] = {}
_undo: Dict[str, Callable[[], None]] = {}


def users(patch: Patch) -> int:
  """How many blocks hold `patch` installed now."""
  with _lock:
    return _users.get(patch.name, 0)


@contextlib.contextmanager
def installed(*patches: Patch) -> Iterator[None]:
  """Checks and installs `patches` for the block (reference-counted)."""
  entered = []
  try:
    for patch in patches:
      with _lock:
        if not _users.get(patch.name):
          check(patch)
          if patch.install is not None:
            _undo[patch.name] = patch.install()
        _users[patch.name] = _users.get(patch.name, 0) + 1
      entered.append(patch)
    yield
  finally:
    for patch in reversed(entered):
      with _lock:
        _users[patch.name] -= 1
        if not _users[patch.name]:
          _undo.pop(patch.name, lambda: None)()


def _swap(path: str, replacement: Callable[[Any], Any]
          ) -> Callable[[], None]:
  """Sets the attribute at `path` to `replacement(stock)`; returns the undo."""
  module_name, _, attrs = path.partition(':')
  owner_attrs, _, attr = attrs.rpartition('.')
  owner = resolve(f'{module_name}:{owner_attrs}')
  stock = getattr(owner, attr)
  setattr(owner, attr, replacement(stock))
  return lambda: setattr(owner, attr, stock)


_TRANSFORM = 'tfx.components.transform.executor:'

# The Transform executor's transformed-examples write, in a fixed number of
# files per split and counted (components/patches/transform.py). The stock
# executor instantiates `TransformProcessor` by its module-global name.
SHARDED_TRANSFORM_WRITES = Patch(
    'sharded_transform_writes', 'tfx',
    'OptimizedTransform writes num_output_shards files per split',
    (Symbol(_TRANSFORM + 'TransformProcessor._EncodeAndWrite',
            ('schema', 'file_format', 'output_path')),
     Symbol(_TRANSFORM + 'TransformProcessor._RecordBatchToExamplesFn')),
    lambda: _swap(
        _TRANSFORM + 'TransformProcessor',
        lambda stock: importlib.import_module(
            'components.patches.transform').sharded_processor(stock)))

# OptimizedTransform's executor overrides two private methods of the stock
# one (components/patches/transform.py: TransformExecutorHooks).
TRANSFORM_EXECUTOR_HOOKS = Patch(
    'transform_executor_hooks', 'tfx',
    "OptimizedTransform sees the module's preprocessing_fn and the Beam "
    'pipelines of the stock Transform',
    (Symbol(_TRANSFORM + 'Executor._GetPreprocessingFn',
            ('self', 'inputs', 'unused_outputs')),
     Symbol(_TRANSFORM + 'Executor._make_beam_pipeline', ('self',))))

# TFX pip-installs the module's wheel in a new process (about 2.7 s) each
# time it needs the module; a pure wheel is unzipped instead
# (components/user_wheels.py).
UNZIPPED_WHEEL_INSTALLS = Patch(
    'unzipped_wheel_installs', 'tfx',
    "the module's pure wheel is unzipped, not pip-installed",
    (Symbol('tfx.components.util.udf_utils:install_to_temp_directory',
            ('pip_dependency', 'temp_dir')),),
    lambda: _swap(
        'tfx.components.util.udf_utils:install_to_temp_directory',
        lambda stock: importlib.import_module(
            'components.user_wheels').install_to_temp_directory))


def _skip_autograph_for_tf_keras() -> Callable[[], None]:
  """Prepends a do-not-convert rule for tf_keras; the undo removes it."""
  config = resolve('tensorflow.python.autograph.core.config:')
  rule = resolve('tensorflow.python.autograph.core.config_lib:DoNotConvert')(
      'tf_keras')
  config.CONVERSION_RULES = (rule,) + tuple(config.CONVERSION_RULES)

  def undo():
    config.CONVERSION_RULES = tuple(
        r for r in config.CONVERSION_RULES if r is not rule)
  return undo


# TF 2.16's autograph rules skip the `keras` package but not `tf_keras`, so
# with TF_USE_LEGACY_KERAS every function tracing Keras code converts all of
# tf_keras: about ten seconds per function on a small model instead of under
# one. Keras converts user layers' `call` itself, so user code keeps
# autograph.
AUTOGRAPH_SKIPS_TF_KERAS = Patch(
    'autograph_skips_tf_keras', 'tensorflow',
    'autograph leaves tf_keras alone, as it does keras',
    (Symbol('tensorflow.python.autograph.core.config:CONVERSION_RULES'),
     Symbol('tensorflow.python.autograph.core.config_lib:DoNotConvert',
            ('module_prefix',))),
    _skip_autograph_for_tf_keras)

# HighPerfTrainer hands the module's run_fn the stock FnArgs, built by the
# stock Trainer executor's private method.
STOCK_FN_ARGS = Patch(
    'stock_fn_args', 'tfx', 'HighPerfTrainer builds the stock FnArgs',
    (Symbol('tfx.components.trainer.executor:GenericExecutor._GetFnArgs',
            ('self', 'input_dict', 'output_dict', 'exec_properties')),))


def stock_fn_args(input_dict, output_dict, exec_properties):
  """The FnArgs the stock Trainer gives run_fn, for these executor inputs."""
  with installed(STOCK_FN_ARGS):
    executor = resolve('tfx.components.trainer.executor:GenericExecutor')()
    return executor._GetFnArgs(input_dict, output_dict, exec_properties)  # pylint: disable=protected-access


def _artifact_type_module() -> Callable[[], None]:
  """Makes every tfx-hpm artifact type importable by its TYPE_NAME."""
  artifact = resolve('tfx.types.artifact:Artifact')
  hpm_types = importlib.import_module('components.types')
  created = []
  for _, cls in inspect.getmembers(hpm_types, inspect.isclass):
    if not issubclass(cls, artifact) or cls is artifact:
      continue
    module_name, _, class_name = cls.TYPE_NAME.rpartition('.')
    if module_name not in sys.modules:
      try:
        found = importlib.util.find_spec(module_name) is not None
      except (ImportError, ValueError):
        found = False
      if found:
        continue
      sys.modules[module_name] = types.ModuleType(
          module_name, 'tfx-hpm artifact types (components.patches).')
      created.append(module_name)
    setattr(sys.modules[module_name], class_name, cls)

  def undo():
    for name in created:
      sys.modules.pop(name, None)
  return undo


# TFX's KFP entrypoint imports a custom artifact class by its schema title,
# `<module>.<Class>` (one dot, compiler_utils._SCHEMA_TITLE_RE). tfx-hpm's
# types are titled `tfx_hpm.*` but live in `components.types`: unless a
# module `tfx_hpm` is importable, one is made in sys.modules that holds them.
ARTIFACT_TYPES_BY_TITLE = Patch(
    'artifact_types_by_title', 'tfx',
    "TFX's KFP entrypoint imports tfx_hpm.* artifact types by schema title",
    (Symbol('tfx.orchestration.kubeflow.v2.compiler_utils:_SCHEMA_TITLE_RE'),
     Symbol('tfx.orchestration.kubeflow.v2.container.'
            'kubeflow_v2_entrypoint_utils:_retrieve_class_path',
            ('type_schema',)),
     Symbol('tfx.utils.import_utils:import_class_by_path',
            ('class_path',))),
    _artifact_type_module)

ALL = (SHARDED_TRANSFORM_WRITES, TRANSFORM_EXECUTOR_HOOKS,
       UNZIPPED_WHEEL_INSTALLS, AUTOGRAPH_SKIPS_TF_KERAS, STOCK_FN_ARGS,
       ARTIFACT_TYPES_BY_TITLE)
