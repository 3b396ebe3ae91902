"""LangGraph: the outcome rules of ``aput`` at each of its commits (the checkpoint's, then a
replace of the surface when the messages channel was rewritten), with the store's failures
injected, and a retry after ``OutcomeUnknownError`` writing nothing twice.

The saver is anyio: these call it directly, on asyncio and trio.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint

from nous_session import SessionActor
from nous_session.errors import OutcomeUnknownError, StoreError
from nous_session.integrations.langgraph import CHECKPOINT_EVENT, NousSessionSaver
from nous_session.stores import MemoryStore

pytestmark = pytest.mark.anyio

THREAD = "t"


class FailingStore(MemoryStore):
    """A memory store whose next commit holding an event of type ``fail`` raises StoreError
    (nothing stored), or with ``lose`` lands and then raises OutcomeUnknownError."""

    fail: str | None = None
    lose = False

    def _hit(self, events: Any) -> bool:
        hit = self.fail is not None and any(e.type == self.fail for e in events)
        if hit:
            self.fail = None
            if not self.lose:
                raise StoreError("the store is out of reach")
        return hit

    async def commit(self, session_id: str, **arguments: Any) -> str | None:
        hit = self._hit(arguments["events"])
        uid = await super().commit(session_id, **arguments)
        if hit:
            raise OutcomeUnknownError("the reply was lost")
        return uid

    async def commit_rebased(self, session_id: str, **arguments: Any) -> Any:
        hit = self._hit(arguments["events"])
        rebased = await super().commit_rebased(session_id, **arguments)
        if hit:
            raise OutcomeUnknownError("the reply was lost")
        return rebased


def checkpoint(number: int, messages: list[Any]) -> Any:
    made = empty_checkpoint()
    made["id"] = f"1ef0000{number}-0000-6000-8000-000000000000"
    made["channel_values"] = {"messages": messages}
    made["channel_versions"] = {"messages": number}
    return made


def config(parent: str | None = None) -> Any:
    conf: dict[str, Any] = {"thread_id": THREAD, "checkpoint_ns": ""}
    if parent is not None:
        conf["checkpoint_id"] = parent
    return {"configurable": conf}


async def put(saver: NousSessionSaver, number: int, messages: list[Any], made: Any = None) -> Any:
    made = made or checkpoint(number, messages)
    return await saver.aput(
        config(), made, {"source": "loop", "step": number}, {"messages": number}
    )


async def surface(store: FailingStore) -> list[str]:
    async with SessionActor.open(session_id=f"langgraph:{THREAD}", store=store) as actor:
        return [message.text for message in actor.messages()]


async def checkpoints(store: FailingStore) -> int:
    async with SessionActor.open(session_id=f"langgraph:{THREAD}", store=store) as actor:
        return sum(event.type == CHECKPOINT_EVENT for event in actor.log.events())


HI, YO, FIXED = (
    HumanMessage("hi", id="h1"),
    AIMessage("yo", id="a1"),
    AIMessage("fixed", id="a1"),
)


@pytest.mark.parametrize("lose", [False, True], ids=["refused", "reply-lost"])
async def test_a_checkpoint_whose_surface_replace_fails_is_stored_and_returns(lose: bool) -> None:
    """The checkpoint committed, then the replace of the surface (a rewritten message) failed:
    a refused one was logged and the call returned, but a lost reply raised
    OutcomeUnknownError, though the checkpoint's commit was known and the surface is a view."""
    store = FailingStore()
    async with NousSessionSaver.open(store) as saver:
        await put(saver, 1, [HI, YO])
        store.fail, store.lose = "replace", lose
        stored = await put(saver, 2, [HI, FIXED])
        got = await saver.aget_tuple(stored)
        assert got is not None
        assert got.checkpoint["channel_values"]["messages"][-1].content == "fixed"
    assert await surface(store) == (["hi", "fixed"] if lose else ["hi", "yo"])
    assert await checkpoints(store) == 2


async def test_a_checkpoint_put_again_after_a_lost_reply_is_stored_once() -> None:
    """The checkpoint's commit landed, its reply lost: putting it again (what LangGraph's own
    savers take as an overwrite by id) shows its messages once on the surface."""
    store = FailingStore()
    async with NousSessionSaver.open(store) as saver:
        await put(saver, 1, [HI])
        store.fail, store.lose = CHECKPOINT_EVENT, True
        made = checkpoint(2, [HI, YO])
        with pytest.raises(OutcomeUnknownError):
            await put(saver, 2, [], made)
        await put(saver, 2, [], made)
        await put(saver, 2, [], made)  # and again, the actor caught up: nothing more
        listed = [item async for item in saver.alist(config())]
        assert [item.checkpoint["id"] for item in listed] == [
            checkpoint(2, [])["id"],
            checkpoint(1, [])["id"],
        ]
    assert await surface(store) == ["hi", "yo"]
    assert await checkpoints(store) == 2
