"""Shared fixtures: every async test runs on asyncio and on trio."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

# CI runs more examples than a developer's quick loop; both are real runs of the same properties.
settings.register_profile(
    "ci", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=300, deadline=None)
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
