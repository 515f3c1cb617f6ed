"""A small real file system (tmpfs) for tests of full and read-only storage."""

import contextlib
import errno
import os
import subprocess

import pytest


@contextlib.contextmanager
def tmpfs(path: str, size: str):
  """A tmpfs of `size` (e.g. '2m') mounted at `path` for the block; skips
  with the reason where the machine cannot mount (needs root)."""
  os.makedirs(path)
  mounted = subprocess.run(['mount', '-t', 'tmpfs', '-o', f'size={size}',
                            'tmpfs', path], capture_output=True, text=True)
  if mounted.returncode:
    pytest.skip(f'cannot mount a tmpfs here (needs root): '
                f'{mounted.stderr.strip()}')
  try:
    yield path
  finally:
    subprocess.run(['umount', '-l', path], check=False)


def fill(directory: str) -> str:
  """Writes a file until the file system is full; returns its path."""
  path = os.path.join(directory, 'filler')
  with open(path, 'wb', buffering=0) as f:  # Unbuffered: nothing left to
    try:                                    # flush on close.
      while True:
        f.write(b'\0' * 4096)
    except OSError as e:
      assert e.errno == errno.ENOSPC, e
  return path
