"""Ray's test_backend_registry.py, ported, with SWITCHBOARD's own
registration beside it (ray_suites.py runs these once: they test the
registry, not a backend).

The port of python/ray/util/collective/tests/test_backend_registry.py in
ray-project/ray: the same six cases. Ray 2.60 has no
ray.util.collective.is_registered_collective_backend (that test module
fails to import on 2.60), so `is_registered` below asks the registry
itself, as that function does in later Ray.
"""

import pytest
from ray.util.collective import backend_registry, is_backend_available, \
    register_collective_backend, types
from ray.util.collective.collective_group.base_collective_group import BaseGroup


def is_registered(name):
    return backend_registry._global_registry.is_registered(name)


class MockGroup(BaseGroup):
    def __init__(self, world_size, rank, group_name):
        super().__init__(world_size, rank, group_name)

    @classmethod
    def backend(cls):
        return "MOCK"

    @classmethod
    def check_backend_availability(cls):
        return True


class CustomBackendWithTimeout(BaseGroup):
    def __init__(self, world_size, rank, group_name, custom_timeout=None):
        super().__init__(world_size, rank, group_name)
        self.custom_timeout = custom_timeout

    @classmethod
    def backend(cls):
        return "CUSTOM_WITH_TIMEOUT"

    @classmethod
    def check_backend_availability(cls):
        return True


@pytest.fixture
def clean_registry():
    registry = backend_registry._global_registry
    saved = dict(registry._map)
    registry._map.clear()
    yield
    registry._map.clear()
    registry._map.update(saved)


def test_register_collective_backend(clean_registry):
    register_collective_backend("mock", MockGroup)
    assert is_registered("mock") is True
    assert is_backend_available("mock") is True


def test_register_duplicate_backend(clean_registry):
    register_collective_backend("mock", MockGroup)
    with pytest.raises(ValueError, match="Backend MOCK already registered"):
        register_collective_backend("mock", MockGroup)


def test_register_invalid_backend(clean_registry):
    class NotABaseGroup:
        pass

    with pytest.raises(TypeError, match="is not a subclass of BaseGroup"):
        register_collective_backend("invalid", NotABaseGroup)


def test_is_backend_available(clean_registry):
    register_collective_backend("mock", MockGroup)
    assert is_backend_available("mock") is True
    assert is_backend_available("nonexistent") is False


def test_is_registered_collective_backend(clean_registry):
    assert is_registered("mock") is False
    register_collective_backend("mock", MockGroup)
    assert is_registered("mock") is True
    assert is_registered("MOCK") is True


def test_backend_with_custom_parameters(clean_registry):
    register_collective_backend("custom_timeout", CustomBackendWithTimeout)
    assert is_registered("custom_timeout") is True


# --- SWITCHBOARD's registration ----------------------------------------------

def test_switchboard_registered_on_import_under_any_case():
    import switchboard.ray
    for name in ["switchboard", "SWITCHBOARD", "SwitchBoard"]:
        assert is_registered(name)
        assert is_backend_available(name)
    assert backend_registry._global_registry.get("switchboard") is switchboard.ray.SwitchboardGroup
    assert types.Backend("switchboard") == "SWITCHBOARD"
    assert switchboard.ray.SwitchboardGroup.backend() == "SWITCHBOARD"


def test_switchboard_registration_is_idempotent_where_rays_is_not(clean_registry):
    import switchboard.ray
    switchboard.ray.register()
    switchboard.ray.register()  # a second import or setup in a reused worker
    assert is_registered("SWITCHBOARD")
    with pytest.raises(ValueError, match="Backend SWITCHBOARD already registered"):
        register_collective_backend("switchboard", switchboard.ray.SwitchboardGroup)
