"""Every patch of TFX and TensorFlow internals, in one package.

tfx-hpm changes library behaviour where the libraries offer no public hook.
Each change is a `Patch` below: the private symbols it relies on (with the
parameters it calls or overrides them with), checked against both supported
ends, TFX 1.16 / TensorFlow 2.16 and TFX 1.21 / TensorFlow 2.21 (the minors
between them share those symbols). `installed(*patches)` checks each one,
failing with a `PatchError` that names the supported and the installed
version when the library is outside that range or a symbol moved, and
installs the swaps for the
block, reference-counted across threads: the library's own object comes back
when the last user leaves, not when the first one does. Private reads that
swap nothing go through `tensorflow_internals`, which `require`s their patch
(checked once per process) before the read.
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
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

# The library versions (major.minor) every patch here was written against,
# oldest and newest; setup.py declares the same ranges and each end has a lock.
SUPPORTED_VERSIONS = {'tfx': ('1.16', '1.21'), 'tensorflow': ('2.16', '2.21'),
                      'tf_keras': ('2.16', '2.21'),
                      'apache_beam': ('2.60', '2.78')}
_LIBRARY_NAMES = {'tfx': 'TFX', 'tensorflow': 'TensorFlow',
                  'tf_keras': 'tf-keras', 'apache_beam': 'Beam'}


class PatchError(RuntimeError):
  """A patch does not fit the installed library (another version, a moved
  symbol)."""


@dataclasses.dataclass(frozen=True)
class Symbol:
  """A library attribute a patch relies on: `module:attr[.attr...]`, the
  parameter names it is called or overridden with (None: not callable), and
  the library version from which it is relied on (None: every version)."""
  path: str
  params: Optional[Tuple[str, ...]] = None
  since: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Patch:
  """One change to a library.

  Attributes:
    name: what the patch is called in errors.
    library: 'tfx', 'tensorflow', 'tf_keras' or 'apache_beam' (keys of
      SUPPORTED_VERSIONS).
    why: one line, for the error message.
    symbols: the private symbols it relies on.
    install: swaps the library's object(s); returns the undo. None for
      patches that only override private methods in a subclass or read
      private symbols (`tensorflow_internals`): they are checked, nothing is
      swapped.
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


def _minor(version: str) -> Tuple[int, ...]:
  """(major, minor) of a version string; () when it has none."""
  try:
    return tuple(int(part) for part in version.split('.')[:2])
  except ValueError:
    return ()


def supports(library: str, version: str) -> bool:
  """Whether `version` of `library` lies between the supported ends."""
  oldest, newest = SUPPORTED_VERSIONS[library]
  minor = _minor(version)
  return bool(minor) and _minor(oldest) <= minor <= _minor(newest)


def _written_for(patch: Patch) -> str:
  oldest, newest = SUPPORTED_VERSIONS[patch.library]
  return (f"tfx-hpm's patch {patch.name!r} ({patch.why}) was written for "
          f'{_LIBRARY_NAMES[patch.library]} {oldest} to {newest}')


def check(patch: Patch) -> None:
  """Raises PatchError unless `patch` fits the installed library."""
  oldest, newest = SUPPORTED_VERSIONS[patch.library]
  library = _LIBRARY_NAMES[patch.library]
  version = installed_version(patch.library)
  where = _written_for(patch)
  if not supports(patch.library, version):
    raise PatchError(f'{where}; installed: {library} {version}. Install '
                     f'{library} {oldest}.x to {newest}.x (setup.py declares '
                     'the range) or port the patch in components/patches.')
  for symbol in patch.symbols:
    if symbol.since and _minor(version) < _minor(symbol.since):
      continue
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


def private_attribute(patch: Patch, owner: Any, name: str) -> Any:
  """`owner.name`, an instance attribute `patch` relies on (a Symbol names
  only what a class or module holds); PatchError when it is gone."""
  try:
    return getattr(owner, name)
  except AttributeError as e:
    raise PatchError(
        f'{_written_for(patch)}; {type(owner).__qualname__} objects have no '
        f'{name} in the installed {_LIBRARY_NAMES[patch.library]} '
        f'{installed_version(patch.library)}.') from e


# Re-entrant: installing a patch may import a module that installs one.
_lock = threading.RLock()
_users: Dict[str, int] = {}
_undo: Dict[str, Callable[[], None]] = {}
_kept: List[Any] = []
_required: Set[str] = set()


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


def require(*patches: Patch) -> None:
  """Checks `patches` once per process: patches that swap nothing (private
  reads), checked where they are first used."""
  with _lock:
    for patch in patches:
      if patch.name not in _required:
        check(patch)
        _required.add(patch.name)


def keep_installed(*patches: Patch) -> None:
  """Checks and installs `patches` for the rest of the process (entry
  points: what they run, in this process, runs with them)."""
  block = installed(*patches)
  block.__enter__()  # pylint: disable=unnecessary-dunder-call
  # Held, never left: a collected block would run its undo.
  _kept.append(block)


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
  """Prepends a do-not-convert rule for tf_keras unless TensorFlow has one
  (2.21 does); the undo removes what it added."""
  config = resolve('tensorflow.python.autograph.core.config:')
  if any(rule.matches('tf_keras.src.engine')
         for rule in config.CONVERSION_RULES):
    return lambda: None
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
# autograph. TF 2.21's own rules skip tf_keras: there it adds nothing.
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

def _direct_runner_in_process() -> Callable[[], None]:
  """Marks the DirectRunner interactive, the one state in which it skips
  Prism, where it would try Prism (Beam 2.78); the undo unmarks it."""
  runner = resolve('apache_beam.runners.direct.direct_runner:'
                   'SwitchingDirectRunner')
  if not hasattr(runner, '_is_interactive'):
    return lambda: None
  stock = runner.__dict__['_is_interactive']
  runner._is_interactive = True  # pylint: disable=protected-access
  return lambda: setattr(runner, '_is_interactive', stock)


# Beam 2.78's DirectRunner runs a pipeline on the Prism runner first, and
# downloads Prism's binary from GitHub at run time when it has none: offline
# (air-gapped clusters, CI) every Beam step tries the download, logs its
# failure and only then falls back. Beam 2.60's runs FnApiRunner in process.
# With this patch the DirectRunner does on both ends what it does on 2.60
# (FnApiRunner where the pipeline allows, else the bundle-based runner), so
# both lanes run the same runner and nothing is downloaded; a pipeline that
# wants Prism names it (--runner=PrismRunner). `_is_interactive` is read only
# by the DirectRunner's Prism check.
DIRECT_RUNNER_IN_PROCESS = Patch(
    'direct_runner_in_process', 'apache_beam',
    "Beam's DirectRunner runs in process and downloads no Prism binary",
    (Symbol('apache_beam.runners.direct.direct_runner:SwitchingDirectRunner'),
     Symbol('apache_beam.runners.direct.direct_runner:'
            'SwitchingDirectRunner._is_interactive', since='2.78')),
    _direct_runner_in_process)

_EXECUTE = 'tensorflow.python.eager.'

# An offload stream's blocked read of a cell that `close` cancels
# (`tensorflow_internals.cancellable_reader`): tf.data has no public
# cancellable `next`, and `CancellationManager.get_cancelable_function`
# cancels every function other threads start meanwhile. Also relies on
# iterators' instance attribute `_iterator_resource`.
CANCELLABLE_ITERATOR_READS = Patch(
    'cancellable_iterator_reads', 'tensorflow',
    "an offload stream's read of its cell, cancelled by its own manager",
    (Symbol(_EXECUTE + 'execute:execute_with_cancellation',
            ('op_name', 'num_outputs', 'inputs', 'attrs', 'ctx',
             'cancellation_manager', 'name')),
     Symbol(_EXECUTE + 'cancellation:CancellationManager.start_cancel',
            ('self',)),
     Symbol(_EXECUTE + 'context:context', ()),
     Symbol('tensorflow.python.data.ops.iterator_ops:OwnedIterator')))

# A tf.data service cell's servers stopped in process
# (`tensorflow_internals.stop_service_servers`): the public servers stop only
# when the process ends.
SERVICE_SERVER_STOPS = Patch(
    'service_server_stops', 'tensorflow',
    "a tf.data service cell's dispatcher and worker stopped in process",
    (Symbol('tensorflow.python.data.experimental.service.server_lib:'
            'DispatchServer._stop', ('self',)),
     Symbol('tensorflow.python.data.experimental.service.server_lib:'
            'WorkerServer._stop', ('self',))))

# A graph network's layer nodes by depth (`tensorflow_internals.
# graph_network_nodes`), which GPipe partitioning walks: tf-keras has no
# public API for them. Relies on models' instance attributes
# `_is_graph_network` and `_nodes_by_depth`.
KERAS_GRAPH_NODES = Patch(
    'keras_graph_nodes', 'tf_keras',
    "a Keras graph network's nodes, which GPipe partitioning walks",
    (Symbol('tf_keras.src.engine.functional:Functional'),
     Symbol('tf_keras:__internal__.KerasTensor')))

ALL = (SHARDED_TRANSFORM_WRITES, TRANSFORM_EXECUTOR_HOOKS,
       UNZIPPED_WHEEL_INSTALLS, AUTOGRAPH_SKIPS_TF_KERAS, STOCK_FN_ARGS,
       ARTIFACT_TYPES_BY_TITLE, DIRECT_RUNNER_IN_PROCESS,
       CANCELLABLE_ITERATOR_READS, SERVICE_SERVER_STOPS, KERAS_GRAPH_NODES)
