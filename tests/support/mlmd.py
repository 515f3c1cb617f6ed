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
