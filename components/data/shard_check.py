"""Finds the damaged file among a training's TFRecord files.

TF's DataLossError for a damaged record (a truncated file, a flipped byte,
a broken gzip stream) names neither the file nor the record, so with
thousands of shards nobody could tell which one to replace. After such a
failure `first_damaged` reads the files once, in order, and names the first
that cannot be read to its end and how many records it yields before that.
A gzip file cut where a record ends reads without error in TF, so a gzip
file is also read through to its end-of-stream marker; `count_whole`, which
the shard index counts with, catches such a file on its first count from
the gzip trailer's size.
"""

import re
import zlib
from typing import Dict, List, Optional, Sequence, Tuple

import tensorflow as tf


def _files(file_patterns: Sequence[str]) -> List[str]:
  return sorted({path for pattern in file_patterns
                 for path in tf.io.gfile.glob(pattern)})


def _count(path: str, compression_type: str, skip_damage: bool) -> int:
  dataset = tf.data.TFRecordDataset(path, compression_type)
  if skip_damage:
    dataset = dataset.ignore_errors()
  return int(dataset.reduce(tf.constant(0, tf.int64),
                            lambda count, _: count + 1))


_CHUNK_BYTES = 1 << 20


def _plain(message: str) -> str:
  """TF's message without the function and op names around it."""
  message = re.sub(r'\{\{function_node [^}]*\}\}\s*', '', message)
  return re.sub(r'\s*\[Op:[^\]]*\].*$', '', message, flags=re.S).strip()


def _gzip_complete(path: str) -> bool:
  """Whether the file's gzip stream reaches its end-of-stream marker."""
  stream = zlib.decompressobj(16 + zlib.MAX_WBITS)
  with tf.io.gfile.GFile(path, 'rb') as f:
    while not stream.eof:
      chunk = f.read(_CHUNK_BYTES)
      if not chunk:
        return False
      try:
        stream.decompress(chunk, _CHUNK_BYTES)
        while stream.unconsumed_tail and not stream.eof:
          stream.decompress(stream.unconsumed_tail, _CHUNK_BYTES)
      except zlib.error:
        return False
  return True


# TFRecord framing around each record: its length (8 bytes) and two CRCs.
_RECORD_FRAMING_BYTES = 16


def count_whole(path: str, compression_type: str) -> int:
  """The records of one file, read once; for gzip also its trailer's size
  (ISIZE, the uncompressed bytes mod 2^32) against the records read, so a
  file cut where a record ends, which TF reads without an error, is not
  counted as whole. Only a mismatch reads the file again, to its end marker
  (a file of several gzip members has the last member's size there).

  Raises:
    tf.errors.DataLossError: the file cannot be read to its end.
  """
  dataset = tf.data.TFRecordDataset(path, compression_type).batch(4096).map(
      lambda batch: (tf.size(batch, out_type=tf.int64), tf.reduce_sum(
          tf.cast(tf.strings.length(batch, unit='BYTE'), tf.int64))))
  records = stored = 0
  for count, record_bytes in dataset.as_numpy_iterator():
    records += int(count)
    stored += int(record_bytes) + _RECORD_FRAMING_BYTES * int(count)
  if compression_type == 'GZIP' and _gzip_size(path) != stored % 2**32:
    _, error = read_to_end(path, compression_type)
    if error is not None:
      raise tf.errors.DataLossError(None, None, f'{path}: {error}')
  return records


def _gzip_size(path: str) -> int:
  """The uncompressed size a gzip file's trailer records (its last 4
  bytes, little-endian), or -1 for a file too short to have one."""
  with tf.io.gfile.GFile(path, 'rb') as f:
    size = f.size()
    if size < 18:  # A gzip header and trailer.
      return -1
    f.seek(size - 4)
    return int.from_bytes(f.read(4), 'little')


def read_to_end(path: str, compression_type: str
                ) -> Tuple[int, Optional[str]]:
  """(records read before any damage, what is wrong or None)."""
  try:
    records = _count(path, compression_type, skip_damage=False)
  except tf.errors.DataLossError as e:
    return (_count(path, compression_type, skip_damage=True),
            _plain(e.message))
  if compression_type == 'GZIP' and not _gzip_complete(path):
    return records, ('the gzip stream ends before its end-of-stream marker '
                     '(the file was cut short)')
  return records, None


def first_damaged(file_patterns: Sequence[str], compression_type: str
                  ) -> Optional[Dict[str, object]]:
  """The first file (by path) that fails to read: {'path', 'readable_records'
  (before the damage), 'error'}; None if every file reads to its end."""
  for path in _files(file_patterns):
    records, error = read_to_end(path, compression_type)
    if error is not None:
      return {'path': path, 'readable_records': records, 'error': error}
  return None
