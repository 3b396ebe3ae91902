"""What the command line's verbs share: its error, its output, and reading a stored session."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO, TypeGuard

from nous_session._json import dumps
from nous_session.event import Event
from nous_session.integrations._listing import lists_sessions
from nous_session.log import Log
from nous_session.message import Message
from nous_session.stores import Store, Stored
from nous_session.stores.base import ListingStore, VacuumingStore, supports

_WIDTH = 96


class CommandError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


def _emit(out: TextIO, value: Any) -> None:
    out.write(dumps(value).decode())
    out.write("\n")


def _clip(text: str, width: int = _WIDTH) -> str:
    text = text.replace("\n", "⏎")
    return text if len(text) <= width else text[: width - 1] + "…"


def _stamp(event: Event) -> str:
    return event.time.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _event_line(event: Event) -> str:
    data = dumps(event.data).decode()
    return _clip(f"{event.seq:>6}  {_stamp(event)}  {event.type:<17}  {data}", 140)


def _message_json(message: Message) -> dict[str, Any]:
    data: dict[str, Any] = {"role": message.role.value}
    data.update(message.to_json())
    data["created_at"] = message.created_at.isoformat()
    return data


def _message_line(index: int, message: Message) -> str:
    text = message.text
    if message.tool_calls:
        calls = ", ".join(f"{call.name}({call.id})" for call in message.tool_calls)
        text = f"{text} -> {calls}" if text else f"-> {calls}"
    if message.tool_call_id:
        text = f"[{message.tool_call_id}] {text}"
    return _clip(f"{index:>4}  {message.role.value:<9}  {text}")


@contextmanager
def _progress(
    total: int, what: str, *, unit: str = "event", least: int = 1000
) -> Iterator[Callable[[int], None]]:
    """A progress bar on a terminal (stderr) when tqdm is there, for ``least`` units or more;
    a no-op otherwise."""
    if total < least or not sys.stderr.isatty():
        yield lambda _done: None
        return
    try:
        from tqdm import tqdm  # the `cli` extra
    except ImportError:
        yield lambda _done: None
        return
    with tqdm(total=total, desc=what, unit=unit, file=sys.stderr, leave=False) as bar:

        def advance(done: int) -> None:
            bar.update(done)

        yield advance


def _fields(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """The ``--where KEY=VALUE`` pairs as one query: every key once, since all must match.

    Raises:
        CommandError: a key given twice (a session has one value per field, so the query
            could match nothing; the last one used to win without a word).
    """
    fields: dict[str, Any] = {}
    for key, value in pairs:
        if key in fields:
            raise CommandError(
                f"--where {key}= is given twice ({fields[key]!r} and {value!r}); every --where "
                "must match, and a session has one {key}: give it once".replace("{key}", key)
            )
        fields[key] = value
    return fields


def _where(store: Store) -> str:
    return str(getattr(store, "url", "the store"))


async def _stored(store: Store, session_id: str) -> Stored:
    stored = await store.read(session_id)
    if not stored.count:
        raise CommandError(f"no session {session_id!r} in {_where(store)}")
    return stored


async def _read(store: Store, session_id: str) -> Log:
    stored = await _stored(store, session_id)
    return Log.restore(stored.events, count=stored.count, horizon=stored.horizon)


def _listing_store(store: Store) -> ListingStore:
    if not lists_sessions(store):
        raise CommandError(f"{_where(store)} cannot list sessions by metadata and time")
    return store


def _vacuums(store: Store) -> TypeGuard[VacuumingStore]:
    """:func:`supports`, as a guard mypy narrows the store by."""
    return supports(store, VacuumingStore)
