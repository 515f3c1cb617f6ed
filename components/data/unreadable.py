"""Reading past unreadable records, only where the user opted in.

`fault_tolerance.skip_unreadable_records` (off by default) trains on when a
data file is damaged: `scan` reads every file of the training's splits once
and, for each file that cannot be read to its end, keeps where its readable
records end. The input pipeline then reads only that prefix of the file;
nothing is skipped silently: every skipped file, position and count is
logged at each start and recorded on `model_run`. The scan is kept beside
the checkpoints (`RECORD_NAME`), so a restart reads it instead of the data.
"""

import concurrent.futures
import dataclasses
import os
from typing import Dict, List, Optional, Sequence

from components import storage
from components.data import shard_check

RECORD_NAME = 'unreadable_records.json'
_SCAN_THREADS = 8


@dataclasses.dataclass(frozen=True)
class Unreadable:
  """One damaged file: records [0, position) are read, the rest skipped."""
  path: str
  position: int
  error: str


@dataclasses.dataclass(frozen=True)
class Scan:
  """Every scanned file's readable records, and the damaged ones."""
  readable: Dict[str, int]
  unreadable: List[Unreadable]

  def limits(self) -> Dict[str, int]:
    """The damaged files' readable prefixes (the input pipeline's limits)."""
    return {u.path: u.position for u in self.unreadable}

  def describe(self) -> List[Dict[str, object]]:
    return [dataclasses.asdict(u) for u in self.unreadable]


def scan(files: Sequence[str], compression_type: str) -> Scan:
  """Reads each file to its end, in parallel."""
  files = sorted(files)
  with concurrent.futures.ThreadPoolExecutor(_SCAN_THREADS) as pool:
    found = list(pool.map(
        lambda f: shard_check.read_to_end(f, compression_type), files))
  readable, unreadable = {}, []
  for path, (records, error) in zip(files, found):
    readable[path] = records
    if error is not None:
      unreadable.append(Unreadable(path, records, error))
  return Scan(readable, unreadable)


def record_path(directory: str) -> str:
  return os.path.join(directory, RECORD_NAME)


def write(directory: str, files: Sequence[str], result: Scan) -> None:
  storage.write_json(record_path(directory), {
      'files': sorted(files), 'readable': result.readable,
      'unreadable': result.describe()})


def read(directory: str, files: Sequence[str]) -> Optional[Scan]:
  """The scan an earlier attempt kept, if it covered exactly `files`."""
  values = storage.read_json(record_path(directory))
  if not values or values.get('files') != sorted(files):
    return None
  return Scan(dict(values['readable']),
              [Unreadable(**u) for u in values['unreadable']])
