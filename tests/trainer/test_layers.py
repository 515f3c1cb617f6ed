"""The trainer's layer order is written once, in `.importlinter` (which
`make lint` enforces); the package docstring that says what each layer owns
lists the same layers in the same order."""

import configparser
import os

import components.trainer

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _contract_layers():
  parser = configparser.ConfigParser()
  parser.read(os.path.join(REPO_ROOT, '.importlinter'))
  return [line.strip() for line in parser.get(
      'importlinter:contract:trainer-layers', 'layers').splitlines()
          if line.strip()]


def _docstring_layers():
  """The docstring's table rows: a layer name (or `a | b`, possibly split
  over two rows whose second starts with '|') in the first column."""
  layers = []
  for line in components.trainer.__doc__.splitlines():
    if not line.startswith('  ') or line.startswith('   '):
      continue
    name = line.strip().split('  ')[0].strip()
    if name.startswith('| ') and layers:
      layers[-1] += ' ' + name
    else:
      layers.append(name)
  return layers


def test_the_package_docstring_lists_the_contracts_layers_in_order():
  assert _docstring_layers() == _contract_layers()
