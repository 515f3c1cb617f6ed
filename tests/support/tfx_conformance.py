"""TFX's own component tests, generated from the installed tfx wheel.

`stock_test_module('components/trainer/executor_test.py', {...})` reads the
test module's source from the installed `tfx` package (never copied into this
repository), replaces whole import lines of the module under test with names
bound to ours, and executes it as a new module whose `__file__` is the stock
file (so its test data paths and tracebacks point into the wheel). Everything
else is TFX's test code as shipped. A replaced line must occur exactly once,
so a TFX upgrade that changes an import fails loudly instead of silently
testing the stock class.

`SwappedModule` stands in for a stock module (e.g. `tfx.components.trainer.
executor`) with some attributes replaced by ours; every other attribute is
the stock module's, also when a test sets or patches it (the stock code that
our subclasses inherit reads its own module globals).
"""

import os
import sys
import types
from typing import Any, Dict

import tfx

TFX_ROOT = os.path.dirname(tfx.__file__)
# Name under which the generated modules live in sys.modules.
_PACKAGE = 'tfx_hpm_conformance'
_SWAPS = '_CONFORMANCE_SWAPS'


class SwappedModule(types.ModuleType):
  """A stock module with some attributes replaced.

  Reads, writes and deletes of any other attribute go to the stock module,
  so `mock.patch.object(proxy, '_SOME_CONSTANT', ...)` patches what the stock
  code (and our subclasses of it) reads.
  """

  def __init__(self, stock: types.ModuleType, **replacements: Any):
    super().__init__(stock.__name__, stock.__doc__)
    for name, value in replacements.items():
      if not hasattr(stock, name):
        raise AttributeError(f'{stock.__name__} has no {name!r} to replace')
      object.__setattr__(self, name, value)
    object.__setattr__(self, '_stock', stock)
    object.__setattr__(self, '_replaced', frozenset(replacements))

  def __getattr__(self, name: str) -> Any:
    return getattr(self._stock, name)

  def __setattr__(self, name: str, value: Any) -> None:
    if name in self._replaced:
      object.__setattr__(self, name, value)
    else:
      setattr(self._stock, name, value)

  def __delattr__(self, name: str) -> None:
    if name in self._replaced:
      object.__delattr__(self, name)
    else:
      delattr(self._stock, name)


def stock_test_module(relpath: str, swaps: Dict[str, Any]) -> types.ModuleType:
  """Executes `<tfx>/<relpath>` with import lines swapped.

  Args:
    relpath: The test module's path inside the tfx package.
    swaps: A whole import line of the stock source -> the object to bind in
      its place (to the name the line imports, or its `as` name).

  Returns:
    The generated module (also in sys.modules, so generated modules can
    build on each other).

  Raises:
    ValueError: A line to swap does not occur exactly once.
  """
  path = os.path.join(TFX_ROOT, relpath)
  with open(path, encoding='utf-8') as f:
    lines = f.read().split('\n')
  bound = {}
  for line, value in swaps.items():
    where = [i for i, text in enumerate(lines) if text == line]
    if len(where) != 1:
      raise ValueError(f'{path}: expected the line {line!r} once, found it '
                       f'{len(where)} times; the installed TFX changed.')
    name = line.split(' as ')[-1] if ' as ' in line else line.split()[-1]
    bound[name] = value
    # One line for one line: tracebacks keep the stock line numbers.
    lines[where[0]] = f'{name} = {_SWAPS}[{name!r}]'
  module_name = (f'{_PACKAGE}.' +
                 relpath[:-len('.py')].replace('/', '.').replace('-', '_'))
  module = types.ModuleType(module_name)
  module.__file__ = path
  setattr(module, _SWAPS, bound)
  sys.modules[module_name] = module
  try:
    exec(compile('\n'.join(lines), path, 'exec'), module.__dict__)  # pylint: disable=exec-used
  except BaseException:
    del sys.modules[module_name]
    raise
  return module
