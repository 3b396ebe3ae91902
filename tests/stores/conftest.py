"""Fixtures the store tests share: the store a module's ``backend`` makes, and a PostgreSQL
backend of its own schema. A module's own fixture of the same name wins."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest


@pytest.fixture
def postgres() -> Iterator[Any]:
    # Imported here, not at the top: this file is loaded before the root conftest gives each
    # xdist worker its own database, and the helpers read the URL when they are imported.
    from tests.support.erasure import postgres_backend

    yield from postgres_backend()


@pytest.fixture
async def store(backend: Any) -> AsyncIterator[Any]:
    """The store the module's ``backend`` fixture makes, closed after the test."""
    made = backend.make()
    yield made
    await made.aclose()
