"""Where the default data and module live, and copies of the taxi CSVs.

Paths may be local or any filesystem TFX knows (gs://, ...): copies go through
`tfx.dsl.io.fileio` (tf.io.gfile underneath).
"""

import os

import tfx


def is_remote(path: str) -> bool:
  """True for a URI with a scheme (gs://, s3://, hdfs://...)."""
  return '://' in path


def local_abspath(path: str) -> str:
  """`path` made absolute if it is local; a URI is returned unchanged."""
  return path if is_remote(path) else os.path.abspath(path)


def default_data_root() -> str:
  """The Chicago taxi CSV folder shipped inside the installed tfx wheel."""
  return os.path.join(os.path.dirname(tfx.__file__), 'examples',
                      'chicago_taxi_pipeline', 'data', 'simple')


def default_module_file() -> str:
  """Our taxi module (preprocessing_fn, run_fn, build_model)."""
  return os.path.join(os.path.dirname(__file__), 'taxi_module.py')


def _csv_names(data_root: str):
  from tfx.dsl.io import fileio  # pylint: disable=g-import-not-at-top
  # Directory listings of object stores may name sub-folders with a '/'.
  return sorted(name.rstrip('/') for name in fileio.listdir(data_root)
                if name.rstrip('/').endswith('.csv'))


def write_sample(data_root: str, out_dir: str, num_rows: int) -> str:
  """Copies the header and the first `num_rows` rows of every CSV to `out_dir`.

  Tests and quick runs use it to get a small but real slice of the data.
  Either folder may be local or remote (e.g. gs://).
  """
  from tfx.dsl.io import fileio  # pylint: disable=g-import-not-at-top
  fileio.makedirs(out_dir)
  for name in _csv_names(data_root):
    with fileio.open(os.path.join(data_root, name)) as src:
      # Text mode gives whole lines on every filesystem.
      lines = []
      for i, line in enumerate(src):
        if i > num_rows:
          break
        lines.append(line if isinstance(line, str) else line.decode())
    with fileio.open(os.path.join(out_dir, name), 'w') as dst:
      dst.write(''.join(lines))
  return out_dir


def copy_data(data_root: str, out_dir: str) -> str:
  """Copies every CSV of `data_root` to `out_dir` (local or remote)."""
  from tfx.dsl.io import fileio  # pylint: disable=g-import-not-at-top
  fileio.makedirs(out_dir)
  for name in _csv_names(data_root):
    fileio.copy(os.path.join(data_root, name), os.path.join(out_dir, name),
                overwrite=True)
  return out_dir
