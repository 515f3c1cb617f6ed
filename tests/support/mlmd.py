"""A finished pipeline run's MLMD (SQLite), opened read-only for checks."""

from ml_metadata import metadata_store
from ml_metadata.proto import metadata_store_pb2


def read_only_store(metadata_path: str) -> metadata_store.MetadataStore:
  """The store at `metadata_path`; read-only, so a check cannot change it."""
  config = metadata_store_pb2.ConnectionConfig()
  config.sqlite.filename_uri = metadata_path
  config.sqlite.connection_mode = (
      metadata_store_pb2.SqliteMetadataSourceConfig.READONLY)
  return metadata_store.MetadataStore(config)


def latest_artifact(metadata_path: str, type_name: str):
  """The newest artifact of `type_name`; fails if there is none."""
  artifacts = read_only_store(metadata_path).get_artifacts_by_type(type_name)
  assert artifacts, f'no {type_name} artifact in {metadata_path}'
  return max(artifacts, key=lambda a: a.id)


# Where TFX's own e2e tests (and dashboards built the same way) look for a
# pipeline's Transform and Trainer executions.
STOCK_EXECUTION_TYPES = {
    'Transform': 'tfx.components.transform.component.Transform',
    'Trainer': 'tfx.components.trainer.component.Trainer',
}
OUR_CLASSES = {
    'Transform': 'components.transform.component.OptimizedTransform',
    'Trainer': 'components.trainer.component.HighPerfTrainer',
}


def assert_found_by_the_stock_execution_types(metadata_path: str,
                                              ours: bool) -> None:
  """Each node's one execution is found by the stock type; ours say who they
  are in the `component_class` property, the stock ones have none."""
  store = read_only_store(metadata_path)
  for node, stock_type in STOCK_EXECUTION_TYPES.items():
    [execution] = store.get_executions_by_type(stock_type)
    recorded = execution.custom_properties.get('component_class')
    if ours:
      assert recorded.string_value == OUR_CLASSES[node], recorded
    else:
      assert recorded is None, recorded
