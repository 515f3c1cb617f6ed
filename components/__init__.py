"""tfx-hpm components: HighPerfTrainer, OptimizedTransform, GPipePartitioner.

The component classes are loaded lazily so that the pure-logic modules under
each component folder (partitioning, strategy rules, config validation) import
without pulling in TFX.
"""

import importlib

_EXPORTS = {
    'HighPerfTrainer': 'components.trainer.component',
    'OptimizedTransform': 'components.transform.component',
    'GPipePartitioner': 'components.partitioner.component',
}

__all__ = list(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
