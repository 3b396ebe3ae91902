"""Waiting for a follower to catch up, in the tests of following."""

from __future__ import annotations

import anyio

from nous_session import SessionActor


async def until(actor: SessionActor, count: int) -> None:
    """Wait (at most 10 s: a follower that misses a commit fails, never hangs) until the
    actor's log holds ``count`` events."""
    with anyio.fail_after(10):
        async with actor.subscribe(0) as events:
            async for event in events:
                if event.seq + 1 >= count:
                    return
