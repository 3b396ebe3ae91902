"""What the command line's verbs share: its error, its output, and reading a stored session."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sequence
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


def emit(out: TextIO, value: Any) -> None:
    out.write(dumps(value).decode())
    out.write("\n")


def clip(text: str, width: int = _WIDTH) -> str:
    text = text.replace("\n", "⏎")
    return text if len(text) <= width else text[: width - 1] + "…"


def stamp(event: Event) -> str:
    return event.time.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def event_line(event: Event) -> str:
    data = dumps(event.data).decode()
    return clip(f"{event.seq:>6}  {stamp(event)}  {event.type:<17}  {data}", 140)


def message_json(seq: int, message: Message) -> dict[str, Any]:
    """A surface message as ``messages --json`` prints it: the seq of the event it comes from
    (what ``erase`` takes; a replace event's for each of its messages), its role, its fields."""
    data: dict[str, Any] = {"seq": seq, "role": message.role.value}
    data.update(message.to_json())
    data["created_at"] = message.created_at.isoformat()
    return data


def message_text(message: Message) -> str:
    """What a message says, in one string: its text, its tool calls, the call it answers."""
    text = message.text
    if message.tool_calls:
        calls = ", ".join(f"{call.name}({call.id})" for call in message.tool_calls)
        text = f"{text} -> {calls}" if text else f"-> {calls}"
    if message.tool_call_id:
        text = f"[{message.tool_call_id}] {text}"
    return text


def message_lines(rows: Sequence[tuple[int, Message]]) -> Iterator[str]:
    """The surface as ``messages`` prints it: a header, then one line per message: its
    index on the surface (what ``remove`` takes), the seq of the event it comes from (what
    ``erase`` takes), its role and what it says."""
    index_width = max(len("INDEX"), len(str(len(rows) - 1)))
    seq_width = max([len("SEQ"), *(len(str(seq)) for seq, _ in rows)])
    yield f"{'INDEX':>{index_width}}  {'SEQ':>{seq_width}}  {'ROLE':<9}  TEXT"
    for index, (seq, message) in enumerate(rows):
        line = f"{index:>{index_width}}  {seq:>{seq_width}}  {message.role.value:<9}  "
        yield clip(line + message_text(message), max(_WIDTH, len(line) + 40))


def snippet(text: str, width: int = 40) -> str:
    """The start of ``text`` on one line: every whitespace character (a newline, a tab)
    shown as a space and any other unprintable one as U+FFFD, cut to ``width`` characters
    with an ellipsis."""
    head = text[: width + 1]
    shown = "".join(
        char if char.isprintable() else " " if char.isspace() else "\ufffd" for char in head
    )
    return shown if len(text) <= width else shown[: width - 1] + "…"


def seq_ranges(seqs: Iterable[int]) -> str:
    """Seqs as a person reads them: sorted, each run of three or more consecutive seqs as one
    range (``1-5, 9, 12-200000``; a pair stays ``3, 4``), ``none`` for no seqs. O(n log n)
    in the seqs given, whatever values they hold."""
    ordered = sorted(set(seqs))
    if not ordered:
        return "none"
    parts: list[str] = []
    start = previous = ordered[0]
    for seq in [*ordered[1:], None]:
        if seq is not None and seq == previous + 1:
            previous = seq
            continue
        if previous - start >= 2:
            parts.append(f"{start}-{previous}")
        else:
            parts.extend(str(value) for value in range(start, previous + 1))
        if seq is not None:
            start = previous = seq
    return ", ".join(parts)


class ProgressBar:
    """A progress bar's handle: call it with how many more units are done; :meth:`stage`
    starts the next stage of the same work on the same line (its own name, from zero)."""

    def __init__(self, bar: Any = None) -> None:
        self._bar = bar  # a tqdm bar, or None: nothing is shown

    def __call__(self, done: int) -> None:
        bar = self._bar
        if bar is not None:
            bar.update(done)
            if bar.n >= bar.total:
                bar.refresh()  # a stage's end is shown, however soon after its last update

    def stage(self, what: str, *, total: int | None = None) -> None:
        """Show ``what`` as the bar's name, and count from zero again (to ``total`` when
        given, else to the same total)."""
        if self._bar is not None:
            self._bar.set_description(what, refresh=False)
            self._bar.reset(total=total)


@contextmanager
def progress_bar(
    total: int, what: str, *, unit: str = "event", least: int = 1000
) -> Iterator[ProgressBar]:
    """A progress bar on stderr when it is a terminal and tqdm is there, for ``least`` units
    or more; a handle that shows nothing otherwise. (Only the command line shows one: the
    library never prints.)"""
    stream = sys.stderr
    if total < least or not stream.isatty():
        yield ProgressBar()
        return
    try:
        from tqdm import tqdm  # the `cli` extra
    except ImportError:
        yield ProgressBar()
        return
    with tqdm(total=total, desc=what, unit=unit, file=stream, leave=False) as bar:
        yield ProgressBar(bar)


def where_query(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
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


def store_name(store: Store) -> str:
    return str(getattr(store, "url", "the store"))


async def read_stored(store: Store, session_id: str) -> Stored:
    stored = await store.read(session_id)
    if not stored.count:
        raise CommandError(f"no session {session_id!r} in {store_name(store)}")
    return stored


async def read_log(store: Store, session_id: str) -> Log:
    stored = await read_stored(store, session_id)
    return Log.restore(stored.events, count=stored.count, horizon=stored.horizon)


def listing_store(store: Store) -> ListingStore:
    if not lists_sessions(store):
        raise CommandError(f"{store_name(store)} cannot list sessions by metadata and time")
    return store


def vacuums(store: Store) -> TypeGuard[VacuumingStore]:
    """:func:`supports`, as a guard mypy narrows the store by."""
    return supports(store, VacuumingStore)


def gap_horizon(seqs: Sequence[int]) -> int:
    """One past the highest gap in increasing ``seqs``, 0 when they have none (or none at all).

    O(len(seqs)): the seqs' values, which may be far apart, never bound the work.
    """
    for index in range(len(seqs) - 1, 0, -1):
        if seqs[index] != seqs[index - 1] + 1:
            return seqs[index]
    return seqs[0] if seqs else 0


def export_header(stored: Stored) -> dict[str, Any] | None:
    """The first record of an export, ``{"session": ...}``, when the events alone do not say
    what the session is: its count (a snapshot dropped the newest events), its horizon (one
    past the highest gap in the seqs, unless a snapshot left it higher), its idempotency keys
    and the events a snapshot kept aside for them (each a ``{"kept": event}`` record after
    it). None for a session its events describe, whose export is its events alone."""
    seqs = [event.seq for event in stored.events]
    count = seqs[-1] + 1 if seqs else 0
    described = stored.count == count and stored.horizon == gap_horizon(seqs)
    if described and not stored.keys and not stored.kept:
        return None
    return {
        "count": stored.count,
        "horizon": stored.horizon,
        "keys": [[key, first, size] for key, (first, size) in stored.keys.items()],
    }
