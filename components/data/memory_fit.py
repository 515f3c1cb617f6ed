"""Whether a memory cache of the parsed examples fits: the rule the tuner
applies to the split it measured and the trainer applies again to the rows
each of its processes caches, on its own machine. No TensorFlow import."""

import os

# Memory the cached tensors take beyond their raw bytes (tf.data buffers,
# tensor headers).
CACHE_OVERHEAD = 1.1


def physical_memory_bytes() -> int:
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def default_ram_budget() -> int:
  """A quarter of this machine's memory: the rest is the model's, the
  framework's and other processes'."""
  return physical_memory_bytes() // 4


def cache_bytes(rows: int, bytes_per_row: float) -> int:
  return int(rows * bytes_per_row * CACHE_OVERHEAD)
