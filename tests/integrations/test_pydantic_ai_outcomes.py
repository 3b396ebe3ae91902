"""pydantic-ai: the outcome rules where a call makes two commits (the record's, then a
replace or remove of the surface), with the store's failures injected at the second.

The store is anyio: these run on asyncio and trio (pydantic-ai's agents run on asyncio only,
but its store interface is only awaited).
"""

from __future__ import annotations

import pytest
from pydantic_ai.conversation import Conversation
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

from nous_session import SessionActor
from nous_session.integrations.pydantic_ai import NousConversationStore
from tests.integrations.test_langgraph_outcomes import FailingStore

pytestmark = pytest.mark.anyio


async def surface(store: FailingStore, conversation_id: str) -> list[str]:
    async with SessionActor.open(session_id=f"pydantic-ai:{conversation_id}", store=store) as actor:
        return [message.text for message in actor.messages()]


@pytest.mark.parametrize("lose", [False, True], ids=["refused", "reply-lost"])
async def test_a_delete_whose_surface_remove_fails_deletes_and_returns(lose: bool) -> None:
    """The record's deletion committed, then the remove of the surface failed: a refused one
    was logged and the call returned, but a lost reply raised OutcomeUnknownError, though the
    deletion's commit was known and the surface is a view."""
    backing = FailingStore()
    messages = [
        ModelRequest(parts=[UserPromptPart(content="hi")]),
        ModelResponse(parts=[TextPart(content="hello")]),
    ]
    async with NousConversationStore.open(backing) as store:
        await store.save(Conversation(conversation_id="c", messages=messages))
        backing.fail, backing.lose = "remove", lose
        await store.delete("c")
        assert await store.load("c") is None
    assert await surface(backing, "c") == ([] if lose else ["hi", "hello"])
