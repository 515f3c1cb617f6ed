"""The trainer's side of `auto`: the consumer rate it sizes cells for."""

import os

from components.records import training_result
from components.trainer.config import DistributionConfig
from components.trainer.managed import served_data
from components.trainer.process.context import ProcessContext
from components.trainer.strategies import registry
from components.testing import trainer_testing as tt


def _context(root, offload, workers=2):
  # model_run_dir <root>/Trainer/7/model_run: as deep as TFX's
  # <root>/<node>/<output>/<execution>.
  task = tt.make_task(os.path.join(root, 'Trainer', '7'),
                      {'pattern': '', 'schema_path': ''})
  config = DistributionConfig.from_dict({'offload': offload})
  return ProcessContext(task=task, config=config,
                        spec=registry.get('one_device'), strategy=None,
                        tf_config={}, workers=workers, is_chief=True)


def test_auto_sizes_for_the_pipelines_published_rate_shared_by_workers(
    tmp_path):
  root = str(tmp_path)
  context = _context(root, {'cells': 'auto'})
  # No training published a rate yet.
  assert served_data._consumer_rate(context) is None  # pylint: disable=protected-access
  training_result.publish_steady_rate(
      root, training_result.SteadyRate(900.0, 64, 'model_run/3'))
  assert served_data._consumer_rate(context) == 450.0  # pylint: disable=protected-access
  # A fixed cell count asks for no rate.
  assert served_data._consumer_rate(  # pylint: disable=protected-access
      _context(root, {'cells': 2})) is None


def test_no_cells_without_offload_or_a_data_order(tmp_path):
  assert served_data.start(_context(str(tmp_path), {'cells': 0}),
                           order=None) is None
  assert served_data.start(_context(str(tmp_path), {'cells': 1}),
                           order=None) is None
