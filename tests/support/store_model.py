"""The Store contract's answers as plain values, for a model that runs the same operation on
several stores and compares what each says (tests/stores/test_store_model.py).

A store's answer is its return value made comparable (events as tuples, mappings as dicts,
times only where the contract makes them comparable) or, when it raised, the exception's type.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import attrs
import pytest

from nous_session import Event, EventType, Message
from nous_session.erasure import Erasure
from nous_session.event import make_event, replace_data
from nous_session.listing import SessionEntry, SessionPage
from nous_session.stores.base import Rebased, SessionInfo, Stored
from nous_session.stores.memory import MemoryStore
from nous_session.stores.sqlite import SQLiteStore

POSTGRES_URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES")
T0 = datetime(2024, 6, 1, 8, 30, tzinfo=UTC)
ERASED_AT = datetime(2024, 7, 1, tzinfo=UTC)
# What the metadata events of the model say: owners and tags repeat, so filters match some.
RECORDS: tuple[dict[str, Any], ...] = (
    {"owner": "ann", "tags": ["red"]},
    {"owner": "bob", "tags": ["red", "blue"], "extra": {"n": 1}},
    {"owner": "ann", "app": "x", "extra": {"n": 2}},
    {},
)


def user(seq: int, text: str) -> Event:
    return make_event(seq, "user_message", {"content": text}, T0 + timedelta(seconds=seq))


def metadata(seq: int, record: int) -> Event:
    return make_event(seq, "session_metadata", {"metadata": RECORDS[record % len(RECORDS)]}, T0)


def summary(seq: int, start: int, text: str) -> Event:
    """A compaction's replace event over positions ``start .. seq - 1`` that quotes ``text``."""
    message = Message.system(f"summary: {text}", created_at=T0)
    return make_event(seq, "replace", replace_data(start, seq - 1, [message]), T0)


SESSION_REASON = "asked for the session"
"""The reason of the model's ``erase_session`` calls, which take no time: each store times
them itself, so an erasure with this reason is compared without its time."""


def _untimed(data: object) -> object:
    """``data`` with the time of every ``erase_session`` record in it left out."""
    if isinstance(data, dict):
        if data.get("reason") == SESSION_REASON:
            return {key: _untimed(item) for key, item in data.items() if key != "at"}
        return {key: _untimed(item) for key, item in data.items()}
    if isinstance(data, list):
        return [_untimed(item) for item in data]
    return data


def event_value(event: Event) -> tuple[Any, ...]:
    """An event as a value: seq, type, data, op and time (an erasure event's is the erasure's
    time: the model's, except for ``erase_session``, whose time is left out)."""
    data = _untimed(dict(event.data))
    untimed = event.type is EventType.ERASURE and event.data.get("reason") == SESSION_REASON
    return (event.seq, str(event.type), data, repr(event.op), None if untimed else event.time)


def events_value(events: Sequence[Event]) -> list[tuple[Any, ...]]:
    return [event_value(event) for event in events]


def stored_value(stored: Stored) -> dict[str, Any]:
    return {
        "events": events_value(stored.events),
        "count": stored.count,
        "horizon": stored.horizon,
        "keys": dict(stored.keys),
        "kept": events_value(stored.kept),
        "parent": stored.parent,
        "fork_point": stored.fork_point,
    }


def rebased_value(rebased: Rebased) -> dict[str, Any]:
    return {
        "shift": rebased.shift,
        "others": events_value(rebased.others),
        "events": events_value(rebased.events),
        "keys": dict(rebased.keys),
        "horizon": rebased.horizon,
    }


def erasure_value(erasure: Erasure) -> dict[str, Any]:
    """What an erasure did, without how the store made sure (``proven``, ``detail``: each
    store's own)."""
    return {
        "erased": erasure.erased,
        "already": erasure.already,
        "absent": erasure.absent,
        "sessions": erasure.sessions,
        "summaries": erasure.summaries,
        "dry_run": erasure.dry_run,
        "at": None if erasure.reason == SESSION_REASON else erasure.at,
    }


def info_value(info: SessionInfo) -> tuple[Any, ...]:
    return attrs.astuple(info)


def entry_value(entry: SessionEntry) -> tuple[Any, ...]:
    """A listing's entry without its times (each store's clock)."""
    return (entry.session_id, entry.metadata.to_json(), entry.count, entry.parent)


def value(answer: object) -> object:
    """Any answer of a store as a comparable value."""
    if isinstance(answer, Stored):
        return stored_value(answer)
    if isinstance(answer, Rebased):
        return rebased_value(answer)
    if isinstance(answer, Erasure):
        return erasure_value(answer)
    if isinstance(answer, SessionPage):
        return [entry_value(entry) for entry in answer.sessions], answer.cursor is not None
    if isinstance(answer, list | tuple) and all(isinstance(item, Event) for item in answer):
        return events_value(answer)
    if isinstance(answer, SessionInfo):
        return info_value(answer)
    if isinstance(answer, list):
        return [value(item) for item in answer]
    return answer


async def _expected_uid(store: Any, session_id: str, identity: str | None) -> dict[str, str]:
    """The ``expected_uid`` argument a model's commit sends: none; the session's own identity
    in this store (``"own"``: one no session has when it has none); another one."""
    if identity is None:
        return {}
    uid = (await store.read(session_id)).uid if identity == "own" else None
    return {"expected_uid": uid or "no-such-session"}


async def committed(
    store: Any, session_id: str, identity: str | None = None, **arguments: Any
) -> str:
    """``store.commit`` (expecting the ``identity`` :func:`_expected_uid` says), whose answer
    must be the session's identity as a read right after gives it: ``"uid"`` stands for it
    (each store makes its own)."""
    arguments.update(await _expected_uid(store, session_id, identity))
    uid = await store.commit(session_id, **arguments)
    assert uid is not None, f"{store!r} names no identity"
    assert uid == (await store.read(session_id)).uid, f"{store!r}: the commit named {uid!r}"
    return "uid"


async def committed_rebased(
    store: Any, session_id: str, identity: str | None = None, **arguments: Any
) -> Rebased:
    """``store.commit_rebased`` (``identity`` as for :func:`committed`), whose answer must
    name the session's identity as a read right after gives it (``Rebased.uid`` is not
    compared by ``==``)."""
    arguments.update(await _expected_uid(store, session_id, identity))
    done: Rebased = await store.commit_rebased(session_id, **arguments)
    assert done.uid is not None, f"{store!r} names no identity"
    assert done.uid == (await store.read(session_id)).uid, f"{store!r}: it named {done.uid!r}"
    return done


async def outcome(call: Callable[[], Awaitable[Any]]) -> tuple[str, object]:
    """``("ok", value)`` or ``("raised", the exception's type name)``."""
    try:
        answer = await call()
    except AssertionError:  # a check of the model's own (see committed), not an answer
        raise
    except Exception as error:  # compared by type: the model says which store was wrong
        return "raised", type(error).__name__
    return "ok", value(answer)


@attrs.define
class Backends:
    """How to make the stores of one example: a MemoryStore (the reference), a SQLiteStore in
    a file of its own and, with ``NOUS_SESSION_TEST_POSTGRES``, a PostgresStore in a schema of
    its own (dropped when the example ends)."""

    directory: Path
    postgres: bool
    schemas: list[str] = attrs.Factory(list)

    def make(self) -> list[tuple[str, Any]]:
        made: list[tuple[str, Any]] = [
            ("memory", MemoryStore()),
            ("sqlite", SQLiteStore(self.directory / f"{uuid.uuid4().hex}.sqlite3")),
        ]
        if self.postgres:
            from nous_session.stores.postgres import PostgresStore

            schema = f"m_{uuid.uuid4().hex[:12]}"
            self.schemas.append(schema)
            assert POSTGRES_URL is not None
            made.append(("postgres", PostgresStore(POSTGRES_URL, schema=schema, max_size=2)))
        return made

    def drop(self) -> None:
        if not self.schemas:
            return
        import psycopg

        assert POSTGRES_URL is not None
        with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
            for schema in self.schemas:
                connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        self.schemas.clear()


def backends(kind: str, directory: Path) -> Iterator[Backends]:
    """The stores to compare: memory and SQLite, and PostgreSQL for ``kind == "postgres"``
    (skipped without a server)."""
    if kind == "postgres":
        if not POSTGRES_URL:
            pytest.skip("no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES")
        pytest.importorskip("psycopg")
    made = Backends(directory, kind == "postgres")
    try:
        yield made
    finally:
        made.drop()
