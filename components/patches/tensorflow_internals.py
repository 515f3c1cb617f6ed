"""TensorFlow and tf-keras internals read where no public API exists.

Nothing here is swapped: each function checks its patch (once per process,
`patches.require`) and then reads the private symbol, so a moved symbol is a
`PatchError` naming the supported versions, not an AttributeError deep in
training.

- `cancellable_reader(iterator, manager)`: an offload stream's reads of its
  next elements, each ended by `manager.start_cancel()`
  (`CANCELLABLE_ITERATOR_READS`).
- `stop_service_servers(*servers)`: a tf.data service cell's dispatcher and
  worker stopped in process (`SERVICE_SERVER_STOPS`).
- `graph_network_nodes(model)`: a Functional or Sequential model's nodes by
  depth, None for a subclassed model (`KERAS_GRAPH_NODES`).
"""

from typing import Any, Callable, Dict, List, Optional

import tensorflow as tf
# pylint: disable=g-direct-tensorflow-import
from tensorflow.python.eager import cancellation
from tensorflow.python.eager import context
from tensorflow.python.eager import execute
# pylint: enable=g-direct-tensorflow-import

from components import patches


def cancellation_manager() -> cancellation.CancellationManager:
  patches.require(patches.CANCELLABLE_ITERATOR_READS)
  return cancellation.CancellationManager()


def cancellable_reader(iterator: Any,
                       manager: cancellation.CancellationManager
                      ) -> Callable[[], tf.Tensor]:
  """A function reading `iterator`'s next scalar int64 with `manager`
  itself: `CancellationManager.get_cancelable_function` sets a process-wide
  context while it runs, so every function another thread (the training
  step) started during a blocked read would be cancelled with it. The patch
  and the iterator's resource are checked once, here, not per element; the
  function holds the iterator (its resource lives as long)."""
  patches.require(patches.CANCELLABLE_ITERATOR_READS)
  resource = patches.private_attribute(patches.CANCELLABLE_ITERATOR_READS,
                                       iterator, '_iterator_resource')

  def read(held=iterator) -> tf.Tensor:
    del held
    return execute.execute_with_cancellation(
        'IteratorGetNext', 1, [resource],
        ('output_types', [tf.int64], 'output_shapes', [[]]),
        context.context(), manager)[0]

  return read


def stop_service_servers(*servers: Any) -> None:
  patches.require(patches.SERVICE_SERVER_STOPS)
  for server in servers:
    server._stop()  # pylint: disable=protected-access


def graph_network_nodes(model: tf.keras.Model
                        ) -> Optional[Dict[int, List[Any]]]:
  patches.require(patches.KERAS_GRAPH_NODES)
  if not patches.private_attribute(patches.KERAS_GRAPH_NODES, model,
                                   '_is_graph_network'):
    return None
  return patches.private_attribute(patches.KERAS_GRAPH_NODES, model,
                                   '_nodes_by_depth')
