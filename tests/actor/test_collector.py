"""The collector: opening, using and closing sessions leaves no reference cycle of ours.

An actor that left cycles behind would make every full collection walk them: in a bot server
that opens and closes sessions all day, those collections are long pauses. So the session's
parts hold one another only one way (or, for the compaction runner, weakly), and the ones that
must point back let go when the session closes. Runs on memory, SQLite and PostgreSQL
(``NOUS_SESSION_TEST_POSTGRES``), on asyncio and trio.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nous_session
from nous_session import CompactionPolicy, Message, SessionActor
from nous_session.stores.base import Store

pytestmark = pytest.mark.anyio


@pytest.fixture
def collector() -> Iterator[None]:
    """Automatic collection off (so that the test counts what a collection finds), and what
    it finds kept for the message."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()


_OURS = str(Path(nous_session.__file__).parent)


def _ours(thing: object) -> bool:
    """Whether ``thing`` is of our making: an instance of a class of ours, or a function,
    coroutine, generator or frame running our code."""
    if type(thing).__module__.startswith("nous_session"):
        return True
    code = getattr(thing, "__code__", None) or getattr(thing, "cr_code", None)
    code = code or getattr(thing, "gi_code", None) or getattr(thing, "ag_code", None)
    code = code or getattr(thing, "f_code", None)
    return code is not None and str(code.co_filename).startswith(_OURS)


def _found() -> tuple[int, list[tuple[str, int]]]:
    """How many objects a collection found in cycles of ours (a cycle holding an object of
    ours), and the commonest kinds of everything it found. Cycles a library left behind on
    its own (a database driver's connection that another test's pool closed meanwhile, say)
    are not ours to count."""
    gc.collect()
    ours = sum(1 for o in gc.garbage if _ours(o))
    kinds = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage)
    gc.garbage.clear()
    return ours, kinds.most_common(10)


async def _use(store: Store, session_id: str, compaction: CompactionPolicy | None) -> None:
    async with SessionActor.open(session_id=session_id, store=store, compaction=compaction) as s:
        async with s.subscribe(0) as events:
            await s.add_message(Message.user("hello"))
            await events.__anext__()
        for index in range(6):
            await s.add_message(Message.assistant(f"reply {index}"))
        await s.wait_for_compaction()
        assert s.log.count >= 7


@pytest.mark.parametrize("compacting", [False, True], ids=["plain", "compacting"])
async def test_open_append_subscribe_compact_close_leaves_no_cycle(
    store: Any, collector: None, compacting: bool
) -> None:
    policy = CompactionPolicy(keep_last=2, every=4) if compacting else None
    await _use(store, "warm-up", policy)  # first use: caches, module state, the store's pool
    _found()
    for index in range(5):
        await _use(store, f"s{index}", policy)
    found, kinds = _found()
    assert found == 0, f"{found} objects of ours in reference cycles: {kinds}"
