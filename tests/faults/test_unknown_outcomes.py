"""A commit whose outcome stays unknown: callers hear OutcomeUnknownError, and a retry with the
idempotency key is answered with what landed, never appended twice."""

from __future__ import annotations

import os
import uuid
from typing import Any

import anyio
import pytest

from nous_session import (
    ConflictError,
    OutcomeUnknownError,
    SessionActor,
    StoreError,
)
from nous_session import _commits as commits_module
from nous_session.stores import MemoryStore

pytestmark = pytest.mark.anyio


class LostContactStore(MemoryStore):
    """A store whose next commit lands and loses its reply, after which it is out of reach
    (every call fails) until ``down`` is cleared."""

    outcome_may_be_unknown = True

    def __init__(self) -> None:
        super().__init__()
        self.lose_next = False
        self.down = False
        self.attempts = 0

    def _reach(self) -> None:
        if self.down:
            self.attempts += 1
            raise StoreError("the store is out of reach")

    def _lose(self) -> None:
        if self.lose_next:
            self.lose_next = False
            self.down = True
            raise OutcomeUnknownError("the reply was lost: the commit may or may not have landed")

    async def commit(self, session_id: str, **kwargs: Any) -> str | None:
        self._reach()
        uid = await super().commit(session_id, **kwargs)
        self._lose()
        return uid

    async def commit_rebased(self, session_id: str, **kwargs: Any) -> Any:
        self._reach()
        rebased = await super().commit_rebased(session_id, **kwargs)
        self._lose()
        return rebased

    async def committed(self, session_id: str, commit_id: str) -> tuple[int, int] | None:
        if self.down:
            raise StoreError("the store is out of reach")
        return await super().committed(session_id, commit_id)


@pytest.mark.parametrize("on_conflict", ["raise", "rebase"])
async def test_an_outcome_unknown_past_the_window_is_never_a_store_error(
    monkeypatch: pytest.MonkeyPatch, on_conflict: Any
) -> None:
    monkeypatch.setattr(commits_module, "RESOLVE_FOR", 0.2)
    store = LostContactStore()
    async with SessionActor.open(session_id="s", store=store, on_conflict=on_conflict) as session:
        await session.append("user_message", {"content": "before"})
        store.lose_next = True
        with anyio.fail_after(10), pytest.raises(OutcomeUnknownError) as caught:
            await session.append("user_message", {"content": "landed?"}, key="K")
        assert not isinstance(caught.value, StoreError)
        assert store.attempts > 0  # the actor did try to find out, for the whole window
        # The store is back; the plain retry with the key answers with what landed.
        store.down = False
        retried = await session.append("user_message", {"content": "landed?"}, key="K")
        assert retried.seq == 1
        stored = await store.load("s")
        assert [event.data["content"] for event in stored] == ["before", "landed?"]
        assert [m.text for m in session.messages()] == ["before", "landed?"]


async def test_a_conflict_from_a_lost_reply_answers_the_keys_it_finds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two keyed calls in the retry's batch: the one that landed is answered from its key;
    the new one fails with the ConflictError alone (its retry lands)."""
    monkeypatch.setattr(commits_module, "RESOLVE_FOR", 0.2)
    store = LostContactStore()
    async with SessionActor.open(session_id="s", store=store) as session:
        store.lose_next = True
        with pytest.raises(OutcomeUnknownError):
            await session.append("user_message", {"content": "first"}, key="A")
        store.down = False
        results: dict[str, Any] = {}

        async def call(key: str, text: str) -> None:
            try:
                results[key] = await session.append("user_message", {"content": text}, key=key)
            except ConflictError as error:
                results[key] = error

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "A", "first")
            tg.start_soon(call, "B", "second")
        assert results["A"].seq == 0
        if isinstance(results["B"], ConflictError):
            results["B"] = await session.append("user_message", {"content": "second"}, key="B")
        assert results["B"].seq == 1
        assert [e.data["content"] for e in await store.load("s")] == ["first", "second"]


POSTGRES_URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES", "")


@pytest.mark.faults
@pytest.mark.skipif(not POSTGRES_URL, reason="no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES")
async def test_a_lost_reply_past_the_window_on_postgres_is_unknown_and_a_keyed_retry_lands_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through a proxy that drops every reply (the commit lands; nothing comes back, nor does
    any answer while the actor tries to find out), the caller hears OutcomeUnknownError; once
    the network is back, the retry with its key returns the event that landed."""
    pytest.importorskip("psycopg")
    from nous_session.stores.postgres import PostgresStore
    from tests.support.faultkit import ReplyDroppingProxy

    monkeypatch.setattr(commits_module, "RESOLVE_FOR", 1.0)
    schema = f"u_{uuid.uuid4().hex[:12]}"
    try:
        with ReplyDroppingProxy(POSTGRES_URL) as proxy:
            async with PostgresStore(proxy.url, schema=schema, max_size=1) as faulty:
                async with SessionActor.open(session_id="s", store=faulty, follow=False) as session:
                    await session.append("user_message", {"content": "before"})
                    proxy.drop_reply_matching(lambda reply: True, n=10**6)
                    with anyio.fail_after(60), pytest.raises(OutcomeUnknownError) as caught:
                        await session.append("user_message", {"content": "landed?"}, key="K")
                    assert not isinstance(caught.value, StoreError)
                    assert proxy.dropped >= 1
                    proxy.pass_through()
                    with anyio.fail_after(60):
                        retried = await session.append(
                            "user_message", {"content": "landed?"}, key="K"
                        )
                    assert retried.seq == 1
        async with PostgresStore(POSTGRES_URL, schema=schema) as straight:
            stored = await straight.load("s")
            assert [event.data["content"] for event in stored] == ["before", "landed?"]
    finally:
        import psycopg

        with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def test_an_error_handed_to_its_caller_is_not_warned_about() -> None:
    """A ConflictError the caller catches is the caller's to report: the library logs it at
    debug, never as a warning (it printed ``nous_session.commit_failed`` on stderr)."""
    from structlog.testing import capture_logs

    store = MemoryStore()
    with capture_logs() as logs:
        async with (
            SessionActor.open(session_id="s", store=store) as first,
            SessionActor.open(session_id="s", store=store) as second,
        ):
            await first.append("user_message", {"content": "from first"})
            with pytest.raises(ConflictError):  # conditional: a plain append would land
                await second.append_many(
                    [("user_message", {"content": "from second"})], expect_count=0
                )
            retried = await second.append("user_message", {"content": "from second"})
            assert retried.seq == 1
    loud = [entry for entry in logs if entry["log_level"] in ("warning", "error", "critical")]
    assert loud == []
    assert any(entry["event"] == "nous_session.commit_failed" for entry in logs)
