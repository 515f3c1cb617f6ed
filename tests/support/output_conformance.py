"""What a stock component and ours leave, compared output by output.

For two executions (the stock component's and ours on the same inputs) it
lists, per output key, every difference a downstream user could meet: a file
or folder the stock one writes that ours does not, a file in another format,
an MLMD property or custom property missing or of another type, and for
models what loading offers (the Keras loader, the root's attributes, each
signature's inputs and outputs). Ours may add: additions are reported apart
and are not differences. Each difference is one line of text, so that the
README's drop-in section can list the known ones verbatim
(`documented_differences`) and a test compare the two lists.
"""

import os
import re
from typing import Any, Dict, Iterable, List, Set, Tuple

from ml_metadata.proto import metadata_store_pb2
import tensorflow as tf

from tests.support import mlmd

# Run-specific parts of file names: TensorBoard event files (time, host),
# shard numbers and counts (a shard count is a tuning).
_NAME_PATTERNS = (
    (re.compile(r'^events\.out\.tfevents\..*'), 'events.out.tfevents.*'),
    (re.compile(r'-\d{5}-of-\d{5}'), '-*-of-*'),
)
# What a user reaches for on a loaded SavedModel's root.
_MODEL_ROOT_ATTRIBUTES = ('variables', 'trainable_variables', 'keras_api',
                          'signatures', '__call__')
README_SECTION = '#### Differences from the stock outputs'


def _normal_name(name: str) -> str:
  for pattern, replacement in _NAME_PATTERNS:
    name = pattern.sub(replacement, name)
  return name


def _file_format(path: str) -> str:
  """gzip, text or binary, from the first bytes."""
  with tf.io.gfile.GFile(path, 'rb') as f:
    head = f.read(512)
  if head[:2] == b'\x1f\x8b':
    return 'gzip'
  try:
    head.decode('utf-8')
    return 'text'
  except UnicodeDecodeError:
    return 'binary'


def file_tree(uri: str) -> Dict[str, str]:
  """Relative path (run-specific parts normalized) -> 'folder' or format."""
  tree = {}
  for folder, subfolders, files in tf.io.gfile.walk(uri):
    relative = os.path.relpath(folder, uri)
    prefix = '' if relative == '.' else _normal_name(relative) + '/'
    for name in subfolders:
      tree[prefix + _normal_name(name) + '/'] = 'folder'
    for name in files:
      tree[prefix + _normal_name(name)] = _file_format(
          os.path.join(folder, name))
  return tree


def _value_type(value: metadata_store_pb2.Value) -> str:
  return value.WhichOneof('value') or 'unset'


def mlmd_record(artifact: metadata_store_pb2.Artifact) -> Dict[str, str]:
  """'property NAME' / 'custom property NAME' -> value type."""
  record = {f'property {k}': _value_type(v)
            for k, v in artifact.properties.items()}
  record.update({f'custom property {k}': _value_type(v)
                 for k, v in artifact.custom_properties.items()})
  return record


def _spec_text(spec: Any) -> str:
  if isinstance(spec, tf.TensorSpec):
    return f'{spec.dtype.name}{spec.shape}'
  return type(spec).__name__


def model_offers(saved_model_dir: str) -> Dict[str, str]:
  """What loading the SavedModel offers: 'keras load', each root attribute,
  each signature's inputs and outputs -> a description."""
  offers = {}
  try:
    tf.keras.models.load_model(saved_model_dir)
    offers['keras load'] = 'works'
  except ValueError:  # E.g. no Keras metadata (tf.saved_model.save).
    pass
  loaded = tf.saved_model.load(saved_model_dir)
  for attribute in _MODEL_ROOT_ATTRIBUTES:
    if hasattr(loaded, attribute):
      offers[f'root attribute {attribute}'] = 'present'
  for name, function in loaded.signatures.items():
    _, inputs = function.structured_input_signature
    for key, spec in sorted(inputs.items()):
      offers[f'signature {name} input {key}'] = _spec_text(spec)
    for key, spec in sorted(function.structured_outputs.items()):
      offers[f'signature {name} output {key}'] = _spec_text(spec)
  return offers


def _compare(where: str, stock: Dict[str, str], ours: Dict[str, str]
             ) -> Tuple[List[str], List[str]]:
  """(differences, additions) between two description dicts."""
  differences = []
  for key, value in sorted(stock.items()):
    if key not in ours:
      differences.append(f'{where}: {key} missing (stock: {value})')
    elif ours[key] != value:
      differences.append(f'{where}: {key} is {ours[key]} (stock: {value})')
  additions = [f'{where}: {key} added ({ours[key]})'
               for key in sorted(set(ours) - set(stock))]
  return differences, additions


def node_outputs(metadata_path: str, pipeline_name: str, node_id: str
                 ) -> Dict[str, List[metadata_store_pb2.Artifact]]:
  """The output artifacts of the node's newest execution, by output key."""
  store = mlmd.read_only_store(metadata_path)
  node = store.get_context_by_type_and_name('node',
                                            f'{pipeline_name}.{node_id}')
  assert node is not None, f'no node {node_id} in {metadata_path}'
  execution = max(store.get_executions_by_context(node.id),
                  key=lambda e: e.id)
  outputs: Dict[str, List[metadata_store_pb2.Artifact]] = {}
  events = [e for e in store.get_events_by_execution_ids([execution.id])
            if e.type == metadata_store_pb2.Event.OUTPUT]
  artifacts = {a.id: a for a in store.get_artifacts_by_id(
      [e.artifact_id for e in events])}
  for event in events:
    key = event.path.steps[0].key
    outputs.setdefault(key, []).append(artifacts[event.artifact_id])
  return outputs


def compare_outputs(stock: Dict[str, List[metadata_store_pb2.Artifact]],
                    ours: Dict[str, List[metadata_store_pb2.Artifact]],
                    saved_models: Dict[str, str]
                    ) -> Tuple[List[str], List[str]]:
  """(differences, additions) over every stock output key; `saved_models`:
  output key -> the SavedModel's folder inside the artifact
  ('Format-Serving' for a Model)."""
  differences, additions = [], []

  def add(result):
    differences.extend(result[0])
    additions.extend(result[1])

  for key in sorted(stock):
    if key not in ours:
      differences.append(f'{key}: output missing')
      continue
    if len(ours[key]) != len(stock[key]):
      differences.append(f'{key}: {len(ours[key])} artifacts (stock: '
                         f'{len(stock[key])})')
    stock_artifact, our_artifact = stock[key][0], ours[key][0]
    add(_compare(key, mlmd_record(stock_artifact), mlmd_record(our_artifact)))
    add(_compare(key, file_tree(stock_artifact.uri),
                 file_tree(our_artifact.uri)))
    if key in saved_models:
      add(_compare(key, model_offers(
          os.path.join(stock_artifact.uri, saved_models[key])), model_offers(
              os.path.join(our_artifact.uri, saved_models[key]))))
  return differences, additions


def documented_differences(readme_path: str, component: str) -> Set[str]:
  """The differences the README's drop-in section lists for `component`:
  each bullet '- `<component>` `<difference>`: why' of README_SECTION."""
  with open(readme_path) as f:
    text = f.read()
  assert README_SECTION in text, f'{README_SECTION!r} not in {readme_path}'
  section = text.split(README_SECTION, 1)[1].split('\n#', 1)[0]
  return set(re.findall(rf'^- `{re.escape(component)}` `([^`]+)`', section,
                        flags=re.MULTILINE))


def _first_lines(items: Iterable[str], limit: int = 40) -> str:
  items = list(items)
  return '\n'.join(items[:limit]) + (
      f'\n... and {len(items) - limit} more' if len(items) > limit else '')


def assert_documented(differences: List[str], readme_path: str,
                      component: str) -> None:
  """The differences found are exactly those the README lists."""
  documented = documented_differences(readme_path, component)
  assert set(differences) == documented, (
      'not in the README:\n' + _first_lines(
          sorted(set(differences) - documented)) +
      '\nin the README, not found:\n' + _first_lines(
          sorted(documented - set(differences))))
