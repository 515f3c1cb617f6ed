"""Base of the suite's configs: dataclasses passed as JSON exec properties.

Keys are strict: an unknown key is an error naming the allowed ones, since a
typo silently falling back to a default is the worst kind of bad config. No
TFX import, so config validation tests run without TFX.
"""

import dataclasses
import json
import math
import typing
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


def check_choice(name: str, value: Any, allowed) -> None:
  """Raises ValueError naming `name`'s bad value and the allowed ones."""
  if value not in allowed:
    raise ValueError(f'{name}={value!r} is not one of {allowed}.')


def check_int(name: str, value: Any, minimum: int) -> None:
  """Raises ValueError naming `name`'s bad value and the allowed range."""
  if not is_int(value, minimum):
    raise ValueError(f'{name}={value!r} must be an integer >= {minimum}.')


def _matches(value: Any, annotation: Any) -> bool:
  """Whether a JSON value fits a field's annotation: int (not bool), float
  (finite; an int is a float), bool, str, Optional/Union, List, Dict, Any
  and a nested JsonConfig."""
  if annotation is Any:
    return True
  if isinstance(annotation, type) and issubclass(annotation, JsonConfig):
    return isinstance(value, annotation)
  origin, args = typing.get_origin(annotation), typing.get_args(annotation)
  if origin is Union:
    return any(_matches(value, arg) for arg in args)
  if annotation is type(None):
    return value is None
  if annotation is bool:
    return isinstance(value, bool)
  if annotation is int:
    return is_int(value)
  if annotation is float:
    return is_number(value)
  if annotation is str:
    return isinstance(value, str)
  if origin in (list, tuple):
    return isinstance(value, (list, tuple)) and all(
        _matches(item, args[0]) for item in value)
  if origin is dict:
    return isinstance(value, dict) and all(
        _matches(k, args[0]) and _matches(v, args[1])
        for k, v in value.items())
  raise TypeError(f'No JSON check for the annotation {annotation!r}.')


_SCALARS = {int: ('an integer', 'integers'),
            float: ('a finite number', 'finite numbers'),
            bool: ('true or false', 'booleans'), str: ('a string', 'strings'),
            type(None): ('null', 'nulls'), Any: ('any JSON value', 'values')}


def _describe(annotation: Any, plural: bool = False) -> str:
  """An annotation as the error names what is allowed."""
  if annotation in _SCALARS:
    return _SCALARS[annotation][plural]
  if isinstance(annotation, type) and issubclass(annotation, JsonConfig):
    return (f'{"objects" if plural else "an object"} of '
            f'{annotation.OPTIONS_NAME}')

  origin, args = typing.get_origin(annotation), typing.get_args(annotation)
  if origin is Union:
    return ' or '.join(_describe(arg, plural) for arg in args)
  if origin in (list, tuple):
    return f'{"lists" if plural else "a list"} of {_describe(args[0], True)}'
  return (f'{"objects" if plural else "an object"} mapping '
          f'{_describe(args[0], True)} to {_describe(args[1], True)}')


class JsonConfig:
  """Mixin for dataclass configs: to/from dict and JSON, strict keys, each
  field's value of its annotated type.

  Subclasses are dataclasses that define `validate()` (returning self; the
  checks beyond the types) and `OPTIONS_NAME`, the name errors use for their
  options.
  """
  OPTIONS_NAME = 'config'
  # Old option name -> its name now: a config written for an older version
  # fails naming the new option instead of as an unknown key.
  RENAMED: Dict[str, str] = {}

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
    renamed = {old: cls.RENAMED[old] for old in values if old in cls.RENAMED}
    if renamed:
      raise ValueError(
          f'{cls.OPTIONS_NAME} option(s) moved: ' + ', '.join(
              f'{old!r} is now {new!r}' for old, new in sorted(renamed.items()))
          + '; use the new place (options are grouped by concern, seconds '
          'end in _s).')
    known = sorted(f.name for f in dataclasses.fields(cls))
    unknown = sorted(set(values) - set(known))
    if unknown:
      raise ValueError(f'Unknown {cls.OPTIONS_NAME} option(s) {unknown}; '
                       f'allowed: {known}.')
    hints = typing.get_type_hints(cls)
    for name, value in values.items():
      nested = hints[name]
      if (isinstance(nested, type) and issubclass(nested, JsonConfig) and
          isinstance(value, dict)):
        values[name] = nested.from_dict(value)
    config = cls(**values)
    try:
      config.validate()  # Its messages name the allowed values.
    except TypeError:  # A comparison met a value of another type.
      config.check_types()
      raise
    config.check_types()  # What validate let through: NaN, a str, a list.
    return config

  def check_types(self) -> None:
    """Raises ValueError naming the first field whose value is not of its
    annotated type (a string where a number belongs, NaN, a list)."""
    hints = typing.get_type_hints(type(self))
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if not _matches(value, hints[field.name]):
        raise ValueError(
            f'{self.OPTIONS_NAME} option {field.name}={value!r} must be '
            f'{_describe(hints[field.name])}.')

  @classmethod
  def from_json(cls, text: Optional[str]):
    return cls.from_dict(json.loads(text) if text else {})
