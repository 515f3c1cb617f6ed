"""Directory renames on gs:// for processes that use TF's modular GCS plugin.

Only the tests need this: the GCS emulator is reachable through TF's modular
filesystem (TF_USE_MODULAR_FILESYSTEM=1, tensorflow-io-gcs-filesystem 0.37.1),
whose RenameFile moves one object and never a directory's contents:
`tf.io.gfile.rename('gs://b/src', 'gs://b/dst')` fails with "Permanent error
in RewriteObject: [NOT_FOUND]" (it rewrites an object named `src`), and with
trailing slashes only the `src/` marker moves. tf.Transform publishes its
outputs with exactly such a rename (transform_fn_io.publish_outputs). TF's
built-in GCS filesystem, which a real pipeline image uses, renames a directory
object by object (tsl gcs_file_system.cc RenameFile); this does the same.

It takes effect in a process whose PYTHONPATH starts with this folder (Python
imports `sitecustomize` at start-up): `tf.io.gfile.rename` of a gs://
directory then renames each object under it, files first, then the directory
markers. Everything else goes to TF unchanged.
"""

import importlib.abc
import importlib.util
import sys

_MODULE = 'tensorflow.python.lib.io.file_io'


def _patch(file_io):
  original = file_io.rename_v2

  def rename_v2(src, dst, overwrite=False):
    src_path = file_io.compat.path_to_str(src)
    if not (src_path.startswith('gs://') and
            file_io.is_directory_v2(src_path)):
      return original(src, dst, overwrite)
    src_path = src_path.rstrip('/')
    dst_path = file_io.compat.path_to_str(dst).rstrip('/')
    # The plugin's walk names folders with a trailing slash ('src/sub/').
    walked = [(root.rstrip('/'), files)
              for root, _, files in file_io.walk_v2(src_path)]
    for root, files in walked:
      relative = root[len(src_path):]
      for name in files:
        original(f'{root}/{name}', f'{dst_path}{relative}/{name}', overwrite)
    for root, _ in sorted(walked, key=lambda w: len(w[0]), reverse=True):
      relative = root[len(src_path):]
      try:
        original(f'{root}/', f'{dst_path}{relative}/', True)
      except file_io.errors.NotFoundError:
        pass  # No marker object for this folder.
    return None

  rename_v2.__doc__ = original.__doc__
  file_io.rename_v2 = rename_v2


class _PatchOnImport(importlib.abc.MetaPathFinder):
  """Patches file_io right after it is executed, before tf.io.gfile binds
  its `rename` to file_io.rename_v2."""

  def find_spec(self, fullname, path, target=None):
    del path, target
    if fullname != _MODULE:
      return None
    sys.meta_path.remove(self)
    spec = importlib.util.find_spec(fullname)
    if spec is None or spec.loader is None:
      return spec
    exec_module = spec.loader.exec_module

    def exec_and_patch(module):
      exec_module(module)
      _patch(module)

    spec.loader.exec_module = exec_and_patch
    return spec


sys.meta_path.insert(0, _PatchOnImport())
