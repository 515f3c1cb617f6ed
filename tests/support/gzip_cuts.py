"""Gzip TFRecord files cut short, as the damaged-data tests cut them.

TF reads a gzip file cut where a record ends (or inside the gzip trailer)
without an error, only with fewer records; a cut inside a record fails with
a DataLossError. Which cut is which depends on the file's bytes.
"""

from typing import Iterator, Optional, Tuple

import tensorflow as tf


def write_records(path: str, count: int = 32) -> None:
  """`count` records of 50 bytes each, gzipped."""
  with tf.io.TFRecordWriter(path, 'GZIP') as writer:
    for i in range(count):
      writer.write(bytes([i]) * 50)


def _records_read(path: str) -> Optional[int]:
  """The records TF reads of `path`, or None if it fails to read it."""
  try:
    return sum(1 for _ in tf.data.TFRecordDataset(path, 'GZIP'))
  except tf.errors.DataLossError:
    return None


def silent_cuts(path: str) -> Iterator[Tuple[int, int]]:
  """Cuts `path` shorter and shorter, from its whole length down, and yields
  (length, records read) for each cut TF reads without an error; the file
  is cut to that length while the caller looks at it."""
  with open(path, 'rb') as f:
    whole = f.read()
  for cut in range(len(whole) - 1, 20, -1):
    with open(path, 'wb') as f:
      f.write(whole[:cut])
    records = _records_read(path)
    if records is not None:
      yield cut, records


def cut_inside_a_record(path: str) -> None:
  """Cuts `path` at or below half its length where TF fails to read it."""
  with open(path, 'rb') as f:
    whole = f.read()
  for cut in range(len(whole) // 2, 0, -1):
    with open(path, 'wb') as f:
      f.write(whole[:cut])
    if _records_read(path) is None:
      return
  raise AssertionError(f'no cut of {path} fails to read')
