"""The launcher registry: each launcher's facts in one entry, its run in one
backend class, chosen by name in one place."""

import pytest

from components.trainer.config import DistributionConfig
from components.trainer.launchers import backends
from components.trainer.launchers import registry


@pytest.mark.parametrize('name', registry.names())
def test_every_registered_launcher_has_its_backend(name):
  backend = backends.for_config(DistributionConfig(launcher=name))
  assert isinstance(backend, backends.Backend)
  assert backend.spec is registry.get(name)


def test_capabilities_select_launchers():
  assert registry.names() == ('in_process', 'local', 'ray')
  assert registry.names(starts_processes=True) == ('local', 'ray')
  assert registry.names(ray_cluster=True) == ('ray',)
  # `auto` starts processes unless outputs live in this process, and is
  # never a Ray cluster (`ray` is chosen only by name).
  assert registry.starts_processes('auto')
  assert not registry.on_ray_cluster('auto')


def test_auto_and_unknown_names_have_no_backend():
  with pytest.raises(ValueError, match=r"launcher='auto' is not one of "
                     r"\('in_process', 'local', 'ray'\) \(or 'auto'\)"):
    backends.for_config(DistributionConfig())
  with pytest.raises(ValueError, match="launcher='kubernetes' is not one of"):
    registry.get('kubernetes')


def test_a_name_registers_once():
  with pytest.raises(ValueError, match="'local' is registered already"):
    registry.register(registry.LauncherSpec('local', starts_processes=True))
