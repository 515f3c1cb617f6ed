"""Where the default data and module live: inside the installed packages."""

import os

import tfx


def default_data_root() -> str:
  """The Chicago taxi CSV folder shipped inside the installed tfx wheel."""
  return os.path.join(os.path.dirname(tfx.__file__), 'examples',
                      'chicago_taxi_pipeline', 'data', 'simple')


def default_module_file() -> str:
  """Our taxi module (preprocessing_fn, run_fn, build_model)."""
  return os.path.join(os.path.dirname(__file__), 'taxi_module.py')


def write_sample(data_root: str, out_dir: str, num_rows: int) -> str:
  """Copies the header and the first `num_rows` rows of every CSV to `out_dir`.

  Tests and quick runs use it to get a small but real slice of the data.
  """
  os.makedirs(out_dir, exist_ok=True)
  for name in sorted(os.listdir(data_root)):
    if not name.endswith('.csv'):
      continue
    with open(os.path.join(data_root, name)) as src, open(
        os.path.join(out_dir, name), 'w') as dst:
      for i, line in enumerate(src):
        if i > num_rows:
          break
        dst.write(line)
  return out_dir
