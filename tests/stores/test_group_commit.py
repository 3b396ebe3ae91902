"""Group commit across sessions (issue 11): many actors on one SQLite store share transactions,
and one session's failing commit fails only that session's batch.

The writer's own tests (test_sqlite_writer.py) show a failing job rolls back only its savepoint;
these go through the whole stack: actors, the store's commit and the writer, so the check is the
one a user relies on, with real conflicts made by a second store on the same file.
"""

from __future__ import annotations

import contextlib
import sqlite3
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from nous_session import ConflictError, CorruptRecordError, SessionActor
from nous_session.codec import encode
from nous_session.event import make_event
from nous_session.stores.sqlite import SQLiteStore
from tests.support.group_commits import append_all

pytestmark = pytest.mark.anyio

SESSIONS = 20
ROUNDS = 6


async def test_a_session_that_lost_to_another_writer_fails_only_its_own_batch(
    tmp_path: Path,
) -> None:
    """Each round, another store advances one session behind its actor's back, then all twenty
    actors commit at once: that one gets ConflictError, the rest commit in shared transactions."""
    path = tmp_path / "group.sqlite3"
    async with SQLiteStore(path) as store, SQLiteStore(path) as other, AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(
                SessionActor.open(session_id=f"s{i}", store=store, follow=False)
            )
            for i in range(SESSIONS)
        ]
        for session in sessions:  # every session exists in the file before the rounds
            await session.append("user_message", {"content": "hello"})
        writer = store._writer_thread()
        before = writer.statistics()
        for round_index in range(ROUNDS):
            victim = sessions[(round_index * 7) % SESSIONS]
            stored = await other.load(victim.session_id)
            sneaked = make_event(len(stored), "user_message", {"content": "from the other store"})
            await other.commit(victim.session_id, expected_count=len(stored), events=[sneaked])
            expected = {s.session_id: s.log.count for s in sessions if s is not victim}

            outcomes = await append_all(sessions, round_index)

            assert isinstance(outcomes[victim.session_id], ConflictError), outcomes
            for session_id, seq in expected.items():
                assert outcomes[session_id] == seq, (session_id, outcomes[session_id])
            # The loser caught up (so a retry lands) and nobody else was touched.
            assert victim.log.count == len(stored) + 1
            await victim.append("user_message", {"content": f"retry {round_index}"})
        after = writer.statistics()

        writes = after.writes - before.writes
        transactions = after.transactions - before.transactions
        assert after.failed_transactions == before.failed_transactions
        assert after.max_group > 1
        assert transactions < writes, (transactions, writes)  # the rounds shared transactions
        for session in sessions:  # memory equals the file, event for event, byte for byte
            stored_events = await other.load(session.session_id)
            assert [encode(e) for e in stored_events] == [encode(e) for e in session.log.events()]


async def test_a_seq_clash_rolls_back_only_its_session_even_after_its_head_moved(
    tmp_path: Path,
) -> None:
    """A clash found after the session's head was advanced in the shared transaction (an event
    row already at that seq) undoes that session's advance and nothing of its batch-mates'."""
    path = tmp_path / "clash.sqlite3"
    async with SQLiteStore(path) as store, AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(
                SessionActor.open(session_id=f"s{i}", store=store, follow=False)
            )
            for i in range(SESSIONS)
        ]
        for session in sessions:
            await session.append("user_message", {"content": "hello"})
        victim = sessions[3]
        # A stray row at the victim's next seq, with the session's count left as it was: the
        # conditional UPDATE of the head succeeds, then the INSERT clashes.
        with contextlib.closing(sqlite3.connect(path)) as raw, raw:
            sid = raw.execute(
                "SELECT id FROM nous_sessions WHERE name = ?", (victim.session_id,)
            ).fetchone()[0]
            stray = make_event(1, "user_message", {"content": "stray"})
            raw.execute(
                "INSERT INTO nous_events (sid, seq, record) VALUES (?, ?, ?)",
                (sid, 1, encode(stray)),
            )
        raw.close()
        before = store._writer_thread().statistics()

        outcomes = await append_all(sessions, 0)

        after = store._writer_thread().statistics()
        # The clash is the store contradicting itself (a row past the session's count): the
        # victim is told so, naming the session, and only the victim.
        error = outcomes[victim.session_id]
        assert isinstance(error, CorruptRecordError), outcomes
        assert "rows past its count" in str(error)
        assert all(outcomes[s.session_id] == 1 for s in sessions if s is not victim), outcomes
        assert after.failed_transactions == before.failed_transactions
        assert after.transactions - before.transactions < after.writes - before.writes
        info = {i.session_id: i.count for i in await store.sessions()}
        assert info[victim.session_id] == 1  # its head is where it was: the advance was undone
        assert all(info[s.session_id] == 2 for s in sessions if s is not victim)
