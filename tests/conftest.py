"""Shared fixtures: every async test runs on asyncio and on trio."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from tallies import Tallies

# The same properties, run deeper or shallower: `ci` on CI's main Python, `dev` by default,
# `quick` on CI's other Pythons (what a version can break shows without the depth).
settings.register_profile(
    "ci", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=300, deadline=None)
settings.register_profile("quick", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio"),
        pytest.param(("trio", {}), id="trio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    """Run each ``@pytest.mark.anyio`` test once per backend."""
    return request.param  # type: ignore[no-any-return]


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(Tallies(config), Tallies.name)


@pytest.fixture(scope="session")
def tallies(pytestconfig: pytest.Config) -> Tallies:
    """The session's :class:`Tallies`."""
    plugin = pytestconfig.pluginmanager.get_plugin(Tallies.name)
    assert isinstance(plugin, Tallies)
    return plugin
