"""The two TFX lanes (1.16 and 1.21): which one this test process runs on,
and the lock each pins."""

import os
import re
from typing import Dict

import tfx

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
LANES = ('1.16', '1.21')


def installed() -> str:
  """The lane of the installed TFX, e.g. '1.21'."""
  return '.'.join(tfx.__version__.split('.')[:2])


def lock_path(lane: str) -> str:
  return os.path.join(REPO_ROOT, f'requirements-tfx{lane}.lock')


def pins(lane: str) -> Dict[str, str]:
  """The lock's exact pins, by lower-case package name."""
  with open(lock_path(lane)) as f:
    return {name.lower().replace('_', '-'): version for name, version in
            re.findall(r'^([A-Za-z0-9_.\-]+)==(\S+)$', f.read(), re.M)}
