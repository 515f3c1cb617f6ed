"""Base of the suite's configs: dataclasses passed as JSON exec properties.

Keys are strict: an unknown key is an error naming the allowed ones, since a
typo silently falling back to a default is the worst kind of bad config. No
TFX import, so config validation tests run without TFX.
"""

import dataclasses
import json
import math
from typing import Any, Dict, Optional, Union


def is_int(value: Any, minimum: Optional[int] = None) -> bool:
  """An int that is not a bool (JSON has no int/bool distinction in Python)."""
  return (isinstance(value, int) and not isinstance(value, bool) and
          (minimum is None or value >= minimum))


def is_number(value: Any) -> bool:
  """A finite int or float that is not a bool: NaN and infinity are bad input
  (every comparison with NaN is False, so it would pass range checks)."""
  return (isinstance(value, (int, float)) and not isinstance(value, bool) and
          math.isfinite(value))


def check_json_values(name: str, value: Any) -> None:
  """Raises ValueError unless `value` is plain JSON: str keys, finite numbers.

  `json.dumps` writes NaN and Infinity, which are not JSON; the value would
  reach the executor and `build_model` as NaN.
  """
  if isinstance(value, dict):
    for key, item in value.items():
      if not isinstance(key, str):
        raise ValueError(f'{name} keys must be strings, got {key!r}.')
      check_json_values(f'{name}[{key!r}]', item)
  elif isinstance(value, (list, tuple)):
    for i, item in enumerate(value):
      check_json_values(f'{name}[{i}]', item)
  elif isinstance(value, float) and not math.isfinite(value):
    raise ValueError(f'{name} must be a finite number, got {value!r}.')
  elif not (value is None or isinstance(value, (str, int, float, bool))):
    raise ValueError(f'{name} must hold only JSON values (str, number, bool, '
                     f'None, list, dict), got {type(value).__name__} '
                     f'{value!r}.')


def check_int(name: str, value: Any, minimum: int) -> None:
  """Raises ValueError naming `name`'s bad value and the allowed range."""
  if not is_int(value, minimum):
    raise ValueError(f'{name}={value!r} must be an integer >= {minimum}.')


class JsonConfig:
  """Mixin for dataclass configs: to/from dict and JSON, strict keys.

  Subclasses are dataclasses that define `validate()` (returning self) and
  `OPTIONS_NAME`, the name errors use for their options.
  """
  OPTIONS_NAME = 'config'

  def validate(self):
    return self

  def to_dict(self) -> Dict[str, Any]:
    return dataclasses.asdict(self)

  def to_json(self) -> str:
    return json.dumps(self.to_dict(), sort_keys=True)

  @classmethod
  def from_dict(cls, values: Union[None, Dict[str, Any], 'JsonConfig']):
    """Builds and validates a config; unknown keys are an error."""
    if isinstance(values, cls):
      return values.validate()
    if values is not None and not isinstance(values, dict):
      raise ValueError(f'{cls.OPTIONS_NAME} must be a JSON object (dict), '
                       f'got {values!r}.')
    values = dict(values or {})
    known = sorted(f.name for f in dataclasses.fields(cls))
    unknown = sorted(set(values) - set(known))
    if unknown:
      raise ValueError(f'Unknown {cls.OPTIONS_NAME} option(s) {unknown}; '
                       f'allowed: {known}.')
    return cls(**values).validate()

  @classmethod
  def from_json(cls, text: Optional[str]):
    return cls.from_dict(json.loads(text) if text else {})
