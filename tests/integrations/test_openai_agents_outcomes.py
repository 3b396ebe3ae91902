"""openai-agents: the outcome rules of the compaction hook's replacement, with the store's
failures injected at each of its commits (the replace of the suffix, then the prune of the
expired prefix that the SDK's EncryptedSession asks for).

The SDK's own SQLiteSession makes both in one transaction; here they are two commits, so a
failure of the second must not say that nothing was committed. The SDK runs on asyncio only.
"""

from __future__ import annotations

from typing import Any

import pytest

from nous_session import SessionActor
from nous_session.errors import OutcomeUnknownError, StoreError
from nous_session.integrations.openai_agents import NousSession
from nous_session.stores import MemoryStore

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    """The SDK runs on asyncio only."""
    return "asyncio"


class FailingStore(MemoryStore):
    """A memory store whose commits holding an event of type ``fail`` raise StoreError
    (nothing stored), or, with ``lose``, land and then raise OutcomeUnknownError."""

    fail: str | None = None
    lose = False

    async def commit(self, session_id: str, **arguments: Any) -> str | None:
        hit = self.fail is not None and any(e.type == self.fail for e in arguments["events"])
        if hit and not self.lose:
            raise StoreError("the store is out of reach")
        uid = await super().commit(session_id, **arguments)
        if hit:
            raise OutcomeUnknownError("the reply was lost")
        return uid


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


@pytest.mark.parametrize("lose", [False, True], ids=["refused", "reply-lost"])
async def test_a_replacement_whose_prune_fails_returns_true(lose: bool) -> None:
    """The replace of the suffix committed, then the prune of the expired prefix failed: the
    call raised that StoreError, which says nothing was committed, and the SDK took the
    compaction for failed. The replacement stands: it returns True; the prefix stays (the
    SDK's EncryptedSession drops expired items when it reads them)."""
    store = FailingStore()
    session = NousSession("prune", store)
    try:
        await session.add_items([user("expired"), user("a"), user("b"), user("c")])
        snapshot = await session._get_compaction_snapshot(
            3, prune_prefix=lambda item: item.get("content") == "expired"
        )
        assert snapshot is not None
        store.fail, store.lose = "remove", lose
        assert await snapshot.replace_suffix(1, [user("[summary of b, c]")])
        store.fail = None
        kept = [] if lose else [user("expired")]  # a lost reply: the prune landed
        assert await session.get_items() == [*kept, user("a"), user("[summary of b, c]")]
    finally:
        session.close()


async def test_a_replacement_refused_by_the_store_replaces_nothing() -> None:
    store = FailingStore()
    session = NousSession("refused", store)
    try:
        await session.add_items([user("expired"), user("a"), user("b")])
        snapshot = await session._get_compaction_snapshot(
            2, prune_prefix=lambda item: item.get("content") == "expired"
        )
        assert snapshot is not None
        store.fail = "replace"
        with pytest.raises(StoreError):
            await snapshot.replace_suffix(0, [user("[summary]")])
        store.fail = None
        assert await session.get_items() == [user("expired"), user("a"), user("b")]
        # Nothing changed, so the same snapshot replaces now.
        assert await snapshot.replace_suffix(0, [user("[summary]")])
        assert await session.get_items() == [user("[summary]")]
    finally:
        session.close()
    async with SessionActor.open(session_id="refused", store=store) as actor:
        kinds = [event.type for event in actor.log.events()]
        assert kinds.count("replace") == 1
        assert kinds.count("remove") == 1
