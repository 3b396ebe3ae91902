"""A LISTEN connection that dies silently (no FIN, no RST: a NAT or firewall forgot the flow)
is found by the listener's own liveness check, and followers catch up within a bound."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import anyio
import pytest

from nous_session import Message, SessionActor

psycopg = pytest.importorskip("psycopg")
from nous_session.stores.postgres import PostgresStore  # noqa: E402
from nous_session.stores.postgres._feed import PING_AFTER, PING_TIMEOUT  # noqa: E402
from tests.support.faultkit import ReplyDroppingProxy  # noqa: E402

URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES", "")

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.faults,
    pytest.mark.skipif(not URL, reason="no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES"),
]

# The documented bound: a liveness check's wait, its timeout, a poll, and a catch-up read.
BOUND = PING_AFTER + PING_TIMEOUT + 2.0


@pytest.fixture
def schema() -> Iterator[str]:
    name = f"l_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(URL, autocommit=True) as connection:
        connection.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


async def test_followers_catch_up_after_a_silent_drop_of_the_listen_connection(
    schema: str,
) -> None:
    with ReplyDroppingProxy(URL) as proxy:
        async with (
            PostgresStore(proxy.url, schema=schema) as followed,
            PostgresStore(URL, schema=schema) as straight,
            SessionActor.open(session_id="s", store=straight, follow=False) as writer,
            SessionActor.open(session_id="s", store=followed, follow=True) as follower,
            follower.subscribe(0) as events,
        ):
            await writer.add_message(Message.user("before the drop"))
            with anyio.fail_after(10):
                first = await events.__anext__()
            assert first.data["content"] == "before the drop"
            # Only the LISTEN connection goes silent; the pool's reads still get through.
            assert proxy.stall_all(matching=b"nous_session listener") == 1
            await writer.add_message(Message.user("after the drop"))
            started = time.monotonic()
            with anyio.fail_after(BOUND + 10):
                second = await events.__anext__()
            waited = time.monotonic() - started
            assert second.data["content"] == "after the drop"
            assert waited <= BOUND, f"caught up after {waited:.1f} s, bound {BOUND} s"
        assert proxy.errors == []
