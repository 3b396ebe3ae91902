"""The adapters keep the one rule for a store given none: the store NOUS_SESSION_STORE names,
else a private in-memory store."""

from __future__ import annotations

from pathlib import Path

import pytest

from nous_session import SessionActor
from nous_session.integrations._common import opened_store
from nous_session.stores import MemoryStore
from nous_session.stores.sqlite import SQLiteStore

pytestmark = pytest.mark.anyio


@pytest.fixture
def named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    url = f"sqlite:///{tmp_path / 'named.sqlite3'}"
    monkeypatch.setenv("NOUS_SESSION_STORE", url)
    return url


async def test_a_block_given_no_store_opens_the_named_one_or_memory(
    named: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What the LangGraph saver and the pydantic-ai store open when given none.
    async with opened_store(None) as store:
        assert isinstance(store, SQLiteStore)
        assert f"sqlite:///{store.path}" == named
    monkeypatch.delenv("NOUS_SESSION_STORE")
    async with opened_store(None) as store:
        assert isinstance(store, MemoryStore)


async def test_an_openai_agents_session_given_no_store_writes_to_the_named_one(
    named: str,
) -> None:
    agents = pytest.importorskip("nous_session.integrations.openai_agents")
    session = agents.NousSession("chat")
    try:
        await session.add_items([{"role": "user", "content": "hello"}])
    finally:
        session.close()
    async with SessionActor.open(session_id="chat", store=named) as actor:
        assert [message.text for message in actor.messages()] == ["hello"]


async def test_an_adk_service_given_no_store_writes_to_the_named_one(named: str) -> None:
    adk = pytest.importorskip("nous_session.integrations.google_adk")
    async with adk.NousSessionService() as service:
        await service.create_session(app_name="app", user_id="u", session_id="chat")
    again = adk.NousSessionService(named)
    async with again:
        session = await again.get_session(app_name="app", user_id="u", session_id="chat")
        assert session is not None
        assert session.id == "chat"


def test_an_empty_store_url_is_refused_not_taken_for_none() -> None:
    """A store of "" is a bad URL (no scheme), as everywhere else; the ADK service took it for
    no store and used a private memory store, and its sessions were lost at exit."""
    adk = pytest.importorskip("nous_session.integrations.google_adk")
    with pytest.raises(ValueError, match="no scheme"):
        adk.NousSessionService("")
    agents = pytest.importorskip("nous_session.integrations.openai_agents")
    with pytest.raises(ValueError, match="no scheme"):
        agents.NousSession("chat", "")
