"""Drop-ins record their executions in MLMD under the stock component's type.

TFX's own e2e tests, and dashboards built the same way, find a pipeline's
Transform and Trainer runs with `store.get_executions_by_type(
'tfx.components.trainer.component.Trainer')`. TFX names an execution's type
after the node's `type` (the pipeline IR's `node_info.type.name`, from
`BaseNode.get_class_type`), so that is where the stock name goes; our class
is recorded in the `component_class` execution property. The node id stays
the stock one for the same reason (see the components).
"""

from typing import Optional

from tfx.utils import name_utils

# Execution property with our component's class (the type is the stock one).
COMPONENT_CLASS_KEY = 'component_class'


class StockExecutionType:
  """Mixin for a component class: `type` is STOCK_TYPE_NAME.

  A subclass that wants its executions under its own class name sets
  `STOCK_TYPE_NAME = None` (queries by the stock type then miss them).
  """
  STOCK_TYPE_NAME: Optional[str] = None

  @classmethod
  def get_class_type(cls) -> str:
    return cls.STOCK_TYPE_NAME or super().get_class_type()

  @classmethod
  def component_class(cls) -> str:
    """The full name of the class itself, for COMPONENT_CLASS_KEY."""
    return name_utils.get_full_name(cls)
