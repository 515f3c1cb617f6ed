"""The attempt's offload (`distribution.offload`): the cells that serve
this process's partitions of the data order, and for `auto` the consumer
rate they are sized for."""

from typing import Optional

from absl import logging

from components import pipeline_layout
from components.data.data_order import DataOrder
from components.offload.config import AUTO
from components.offload.served import Offload
from components.records import training_result
from components.trainer.process.context import ProcessContext


def start(context: ProcessContext, order: Optional[DataOrder]
          ) -> Optional[Offload]:
  """This process's cells; None where offload is off, or where there is no
  data order to serve (parameter servers, train files without an index)."""
  config = context.config.offload
  if not config.enabled:
    return None
  if order is None:
    logging.warning('distribution.offload is set, but this training reads '
                    'no data order (train files that are not one indexed '
                    'split folder): it reads its data itself.')
    return None
  return Offload(config, order.partitions // context.workers, order.batch,
                 _consumer_rate(context))


def _consumer_rate(context: ProcessContext) -> Optional[float]:
  """This process's share of the rate the pipeline's newest managed
  training published (examples a second), if any."""
  if context.config.offload.cells != AUTO:
    return None
  root = pipeline_layout.pipeline_root(None, context.task.model_run_dir)
  rate = training_result.newest_steady_rate(root)
  return rate and rate.examples_per_sec / context.workers
