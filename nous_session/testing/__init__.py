"""A store conformance suite, written once, run against every backend.

Third-party stores prove themselves with one subclass::

    import pytest
    from nous_session.testing import StoreConformance

    class TestMyStore(StoreConformance):
        @pytest.fixture
        def anyio_backend(self):
            return "asyncio"  # or parametrise over ("asyncio", "trio")

        @pytest.fixture
        async def store(self):
            store = MyStore(...)  # fresh and empty for every test
            yield store
            await store.aclose()

        @pytest.fixture
        def reopen(self, store):
            # A new store object over the same persisted data (or the same object for an
            # in-memory store); the suite closes what it opens.
            return lambda: MyStore(...)

It needs pytest and anyio's pytest plugin (``pip install nous_session[test]``). Each test
asserts one rule of the :class:`~nous_session.stores.Store` contract.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from nous_session.stores.base import Store
from nous_session.testing._commits import CommitConformance
from nous_session.testing._forks import ForkConformance
from nous_session.testing._listing import ListingConformance
from nous_session.testing._rebasing import RebasingConformance
from nous_session.testing._sessions import SessionConformance

# ODD_SESSION_IDS: a public name of the module this package was, kept for its users.
from nous_session.testing._shared import ODD_SESSION_IDS as ODD_SESSION_IDS
from nous_session.testing._shared import sample_log
from nous_session.testing._stored import StoredConformance

__all__ = ["ListingConformance", "StoreConformance", "sample_log"]


class StoreConformance(
    CommitConformance,
    RebasingConformance,
    StoredConformance,
    ForkConformance,
    SessionConformance,
):
    """The Store contract as tests. Subclass and provide ``store`` and ``reopen`` fixtures.

    The tests come in parts, one per capability: loading and committing, rebasing commits,
    what a read returns (count, horizon, keys, kept events, commit ids), forks, and sessions
    and persistence. The parts of a capability the store lacks skip, saying so.
    """

    @pytest.fixture
    def reopen(self, store: Store) -> Callable[[], Store]:
        """A fresh store object over the same data; the default reuses ``store`` itself."""
        return lambda: store
