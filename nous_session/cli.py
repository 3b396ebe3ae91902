"""The ``nous-session`` command line: look inside stored sessions, and audit and edit history.

Inspecting (these open the store read-only: they create and change nothing)::

    nous-session [--store URL] sessions [--json]
    nous-session [--store URL] sessions [--where KEY=VALUE]... [--tag TAG]...
                 [--order active|created] [--ascending] [--limit N] [--cursor CURSOR] [--json]
    nous-session [--store URL] metadata SESSION [--json]
    nous-session [--store URL] retain (--idle-for 90d | --older-than 365d...) [--delete|--snapshot]
                                      (a dry run: lists what it would do)
    nous-session [--store URL] stats SESSION [--json]
    nous-session [--store URL] events SESSION [--since SEQ] [--json]
    nous-session [--store URL] messages SESSION [--as-of SEQ] [--json]
    nous-session [--store URL] history SESSION [--json]
    nous-session [--store URL] export SESSION [--output FILE]
    nous-session [--store URL] tail SESSION [--since SEQ] [--json] [--interval SECONDS]

Changing (each records what it does as events; nothing is overwritten)::

    nous-session [--store URL] fork SESSION NEW_SESSION [--at SEQ]
    nous-session [--store URL] rewind SESSION TO_SEQ
    nous-session [--store URL] remove SESSION FIRST [LAST]      (surface indexes, as messages shows)
    nous-session [--store URL] import NEW_SESSION [FILE] [--metadata JSON]
                                                                (JSON lines as export writes)
    nous-session [--store URL] metadata SESSION --set JSON
    nous-session [--store URL] retain ... --yes                 (acts, and counts what it did)
    nous-session [--store URL] snapshot SESSION [--yes] [--vacuum]
    nous-session [--store URL] delete SESSION [--yes]
    nous-session [--store URL] erase SESSION [SEQ ...] [--role ROLE] [--name NAME] [--all]
                 [--inherited] --reason TEXT [--yes] [--json]   (overwrites; dry run without --yes)
    nous-session [--store URL] demo [--turns N] [--session ID]

Without ``--store`` the store is ``$NOUS_SESSION_STORE``, else the default SQLite file (for
``demo``: ``nous_session_demo.sqlite3`` in the working directory). Output is
for people by default and JSON (one object per line) with ``--json``. Errors are one line on
stderr and exit status 1. Long work (export, import, snapshot) shows a progress bar on a
terminal when ``tqdm`` is installed (the ``cli`` extra).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from contextlib import aclosing, contextmanager, suppress
from typing import Any, Literal, TextIO, TypeVar

import anyio
import structlog

from nous_session._json import dumps, loads
from nous_session.codec import from_json, to_json
from nous_session.erasure import Erasure, select_events
from nous_session.errors import NousSessionError
from nous_session.event import Event, EventType
from nous_session.listing import SessionEntry, metadata_of
from nous_session.log import Log
from nous_session.message import Message
from nous_session.metadata import SessionMetadata
from nous_session.ops import Remove, Replace, Rewind, Uncompact
from nous_session.retention import RetentionReport
from nous_session.stores import Store, Stored, open_store
from nous_session.stores.base import ErasingStore, ListingStore, VacuumingStore, supports
from nous_session.transcript import estimate_messages_tokens

__all__ = ["main"]

T = TypeVar("T")

_WIDTH = 96


class CommandError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nous-session",
        description="Inspect, audit and maintain nous_session stores.",
    )
    parser.add_argument(
        "--verbose", "-v", action="count", default=0, help="log more (-v info, -vv debug)"
    )
    parser.add_argument(
        "--store",
        metavar="URL",
        help="memory:, sqlite:///path, or postgresql://... "
        "(default: $NOUS_SESSION_STORE, else the default SQLite file)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sessions = commands.add_parser(
        "sessions",
        help="list the stored sessions",
        description="List the stored sessions. Plain, every session by id with its counts; "
        "with --where, --tag, --order, --limit or --cursor, one page of the sessions that match, "
        "newest first, with their metadata and times, and the cursor of the next page.",
    )
    sessions.add_argument("--json", action="store_true", help="one JSON object per line")
    _listing_arguments(sessions)
    sessions.add_argument(
        "--order", choices=("active", "created"), default=None, help="default: active"
    )
    sessions.add_argument("--ascending", action="store_true", help="oldest first")
    sessions.add_argument("--limit", type=_page_size, default=None, help="page size, 1..1000")
    sessions.add_argument("--cursor", default=None, help="the next page, as a page printed it")

    metadata = commands.add_parser(
        "metadata", help="print a session's metadata, or set it (--set: a metadata event)"
    )
    metadata.add_argument("session")
    metadata.add_argument("--set", dest="set", default=None, metavar="JSON", help="the new record")
    metadata.add_argument("--json", action="store_true", help="as one JSON object")

    retain = commands.add_parser(
        "retain",
        help="delete or snapshot sessions idle or created long ago (a dry run without --yes)",
        description="Select the sessions idle for longer than --idle-for (no new events since) "
        "and/or created longer ago than --older-than, and delete them (the default) or snapshot "
        "them. Without --yes, list what would be done and how many, and change nothing. A "
        "session written to after the selection is kept.",
    )
    retain.add_argument("--idle-for", default=None, metavar="DURATION", help="like 90d, 12h, 2w")
    retain.add_argument("--older-than", default=None, metavar="DURATION", help="like 365d")
    action = retain.add_mutually_exclusive_group()
    action.add_argument("--delete", dest="action", action="store_const", const="delete")
    action.add_argument("--snapshot", dest="action", action="store_const", const="snapshot")
    _listing_arguments(retain)
    retain.add_argument("--yes", action="store_true", help="really do it")
    retain.add_argument("--json", action="store_true", help="one JSON object per line")

    events = commands.add_parser("events", help="print a session's events")
    events.add_argument("session")
    events.add_argument("--since", type=_seq, default=0, metavar="SEQ")
    events.add_argument("--json", action="store_true", help="one JSON object per line")

    messages = commands.add_parser("messages", help="print the messages the model sees")
    messages.add_argument("session")
    messages.add_argument(
        "--as-of", type=_seq, default=None, metavar="SEQ", help="as they were when SEQ was newest"
    )
    messages.add_argument("--json", action="store_true", help="one JSON object per line")

    history = commands.add_parser(
        "history", help="the surface operations of a session, with their seqs and times"
    )
    history.add_argument("session")
    history.add_argument("--json", action="store_true", help="one JSON object per line")

    tail = commands.add_parser("tail", help="follow a live session until interrupted")
    tail.add_argument("session")
    tail.add_argument("--since", type=_seq, default=None, metavar="SEQ", help="default: last 10")
    tail.add_argument("--json", action="store_true", help="one JSON object per line")
    tail.add_argument(
        "--interval", type=_positive, default=0.2, help="poll interval in seconds (SQLite)"
    )

    export = commands.add_parser("export", help="write a session's events as JSON lines")
    export.add_argument("session")
    export.add_argument("--output", "-o", metavar="FILE", help="default: standard output")

    fork = commands.add_parser(
        "fork",
        help="make a new session whose history is this one's up to a seq",
        description="Make NEW_SESSION a new, independent session whose history is SESSION's "
        "up to and including --at (default: all of it). The history is shared, not copied; "
        "the fork records its parent and fork point (see `sessions` and `history`).",
    )
    fork.add_argument("session")
    fork.add_argument("new_session")
    fork.add_argument("--at", type=_seq, default=None, metavar="SEQ", help="default: the newest")

    rewind = commands.add_parser(
        "rewind",
        help="make the surface what it was at a seq (an event records it)",
        description="Make SESSION's surface what it was when TO_SEQ was its newest event "
        "(-1: empty). Nothing is deleted: a rewind event records it, the later history stays in "
        "the log, and another rewind (to the seq just before this one) brings it back.",
    )
    rewind.add_argument("session")
    rewind.add_argument("to", type=_rewind_target, metavar="TO_SEQ")
    rewind.add_argument("--json", action="store_true", help="print the rewind event as JSON")

    remove = commands.add_parser(
        "remove",
        help="take messages off the surface (an event records it)",
        description="Take the messages FIRST..LAST (indexes as `messages` prints them) off "
        "SESSION's surface. The events stay in the log; a remove event records the operation.",
    )
    remove.add_argument("session")
    remove.add_argument("first", type=_seq, metavar="FIRST")
    remove.add_argument("last", type=_seq, nargs="?", default=None, metavar="LAST")
    remove.add_argument("--json", action="store_true", help="print the remove event as JSON")

    imported = commands.add_parser(
        "import",
        help="load JSON lines written by export into a new session",
        description="Load the JSON lines `export` writes (from FILE, or standard input) into "
        "NEW_SESSION, which must not exist, then read it back and check it holds exactly "
        "those events.",
    )
    imported.add_argument("new_session")
    imported.add_argument("file", nargs="?", default=None, metavar="FILE")
    imported.add_argument(
        "--metadata", default=None, metavar="JSON", help="then set the session's metadata"
    )

    snapshot = commands.add_parser("snapshot", help="drop what a session's surface no longer needs")
    snapshot.add_argument("session")
    snapshot.add_argument("--yes", action="store_true", help="really drop them")
    snapshot.add_argument("--vacuum", action="store_true", help="then give the space back")
    snapshot.add_argument("--json", action="store_true", help="as one JSON object")

    delete = commands.add_parser("delete", help="delete a session and its events")
    delete.add_argument("session")
    delete.add_argument("--yes", action="store_true", help="really delete it")

    erase = commands.add_parser(
        "erase",
        help="erase events' content for good (a person's messages, or a whole session)",
        description="Replace the content of chosen events by a record of their erasure, in"
        " the session and in every fork holding them, and scrub the store's files or tables."
        " Without --yes, only says what it would erase.",
    )
    erase.add_argument("session")
    erase.add_argument("seqs", nargs="*", type=_seq, metavar="SEQ", help="the events to erase")
    erase.add_argument("--role", help="erase the messages of this role (user, assistant, ...)")
    erase.add_argument("--name", help="erase the messages with this name (an author)")
    erase.add_argument(
        "--all", action="store_true", help="erase every event the session wrote itself"
    )
    erase.add_argument(
        "--inherited",
        action="store_true",
        help="with --all: also what a fork took from its parent (erased there too)",
    )
    erase.add_argument("--reason", required=True, help="why: recorded in every erased event")
    erase.add_argument("--yes", action="store_true", help="really erase")
    erase.add_argument("--json", action="store_true", help="as one JSON object")

    stats = commands.add_parser("stats", help="figures about one session")
    stats.add_argument("session")
    stats.add_argument("--json", action="store_true", help="as one JSON object")

    demo = commands.add_parser(
        "demo",
        help="run the demo conversation on the store (default: nous_session_demo.sqlite3 here)",
    )
    demo.add_argument("--turns", type=_count, default=300)
    demo.add_argument("--session", default=None)
    demo.add_argument("--budget", type=int, default=6000, help="compaction token budget")
    return parser


def _argument(
    convert: Callable[[str], T], accept: Callable[[T], bool], what: str, rule: str
) -> Callable[[str], T]:
    """An argparse type: ``convert`` the text, then check it, naming ``what`` and ``rule``."""

    def parse(text: str) -> T:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"{rule}, got {text}")
        return value

    return parse


def _listing_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--where",
        action="append",
        default=[],
        type=_field,
        metavar="KEY=VALUE",
        help="owner=, app=, title= or an extra field (repeatable; all must match)",
    )
    parser.add_argument("--tag", action="append", default=[], help="a tag (repeatable)")


def _field(text: str) -> tuple[str, Any]:
    """``KEY=VALUE``; an extra field's VALUE is JSON when it parses (``n=3``, ``ok=true``),
    else the text itself."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--where takes KEY=VALUE, got {text!r}")
    if key in ("owner", "app", "title"):
        return key, value
    try:
        parsed = loads(value)
    except ValueError:
        return key, value
    return key, parsed if not isinstance(parsed, dict | list) else value


_positive = _argument(float, lambda value: value > 0, "a number", "must be > 0")
_count = _argument(int, lambda value: value >= 1, "a whole number", "must be >= 1")
_seq = _argument(int, lambda value: value >= 0, "a seq", "a seq is >= 0")
_page_size = _argument(int, lambda value: 1 <= value <= 1000, "a whole number", "1..1000")
_rewind_target = _argument(int, lambda value: value >= -1, "a seq", "a rewind target is >= -1")


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


# Inspecting ---------------------------------------------------------------------------------


def _listing_store(store: Store) -> ListingStore:
    if not supports(store, ListingStore):
        raise CommandError(f"{_where(store)} cannot list sessions by metadata and time")
    return store  # type: ignore[return-value]


def _entry_json(entry: SessionEntry) -> dict[str, Any]:
    row: dict[str, Any] = {
        "session_id": entry.session_id,
        "count": entry.count,
        "created": entry.created.isoformat(),
        "active": entry.active.isoformat(),
        "metadata": entry.metadata.to_json(),
    }
    if entry.parent is not None:
        row["parent"] = entry.parent
    return row


def _entry_line(entry: SessionEntry) -> str:
    record = entry.metadata
    tags = ",".join(sorted(record.tags))
    return (
        f"{_clip(entry.session_id, 32):<32} {entry.count:>7}  "
        f"{entry.active.strftime('%Y-%m-%d %H:%M:%S')}  {_clip(record.owner or '-', 16):<16} "
        f"{_clip(record.app or '-', 12):<12} {_clip(record.title or '', 30)}"
        + (f"  [{_clip(tags, 30)}]" if tags else "")
    ).rstrip()


async def _listing(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    page = await _listing_store(store).list_sessions(
        where=dict(args.where),
        tags=args.tag,
        order=args.order or "active",
        descending=not args.ascending,
        limit=args.limit or 50,
        cursor=args.cursor,
    )
    if args.json:
        for entry in page.sessions:
            _emit(out, _entry_json(entry))
        if page.cursor is not None:
            _emit(out, {"cursor": page.cursor})
        return
    if not page.sessions:
        out.write(f"no matching sessions in {_where(store)}\n")
        return
    out.write(f"{'SESSION':<32} {'COUNT':>7}  {'ACTIVE':<19}  {'OWNER':<16} {'APP':<12} TITLE\n")
    for entry in page.sessions:
        out.write(_entry_line(entry) + "\n")
    if page.cursor is not None:
        out.write(f"more: --cursor {page.cursor}\n")


async def _sessions(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    if args.where or args.tag or args.order or args.limit or args.cursor or args.ascending:
        await _listing(store, args, out)
        return
    infos = await store.sessions()
    if args.json:
        for info in infos:
            row: dict[str, Any] = {
                "session_id": info.session_id,
                "count": info.count,
                "held": info.held,
            }
            if info.horizon:
                row["horizon"] = info.horizon
            if info.parent is not None:
                row.update(parent=info.parent, fork_point=info.fork_point)
            _emit(out, row)
        return
    if not infos:
        out.write(f"no sessions in {_where(store)}\n")
        return
    out.write(f"{'SESSION':<40} {'COUNT':>8} {'HELD':>8}  FORKED FROM\n")
    for info in infos:
        lineage = "" if info.parent is None else f"  {info.parent} @ {info.fork_point}"
        out.write(f"{_clip(info.session_id, 40):<40} {info.count:>8} {info.held:>8}{lineage}\n")


async def _metadata(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    if args.set is not None:
        await _set_metadata(store, args.session, args.set, out)
        return
    log = await _read(store, args.session)
    record = metadata_of(log.events()) or SessionMetadata()
    if args.json:
        _emit(out, record.to_json())
        return
    for key, value in record.to_json().items():
        shown = ", ".join(value) if key == "tags" else value  # type: ignore[arg-type]
        out.write(f"{key + ':':<8} {shown if isinstance(shown, str) else dumps(shown).decode()}\n")


async def _set_metadata(store: Store, session_id: str, text: str, out: TextIO) -> None:
    from nous_session.actor import SessionActor

    try:
        record = SessionMetadata.from_json(loads(text))
    except ValueError as error:
        raise CommandError(f"bad metadata: {error}") from None
    await _stored(store, session_id)
    async with SessionActor.open(session_id=session_id, store=store) as session:
        event = await session.set_metadata(record)
    out.write(f"set the metadata of {session_id!r} (seq {event.seq})\n")


async def _retain(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    from nous_session.retention import apply

    action: Literal["delete", "snapshot"] = args.action or "delete"
    if args.idle_for is None and args.older_than is None:
        raise CommandError("retain needs --idle-for, --older-than or both")
    if args.yes:
        report = await _retain_with_progress(store, args, action)
    else:
        report = await apply(
            store,
            idle_for=args.idle_for,
            older_than=args.older_than,
            action=action,
            where=dict(args.where),
            tags=args.tag,
        )
    if args.json:
        for entry in report.selected if report.dry_run else ():
            _emit(out, _entry_json(entry))
        _emit(
            out,
            {
                "action": report.action,
                "dry_run": report.dry_run,
                "selected": len(report.selected),
                "done": report.done,
                "kept": report.kept,
                "dropped_events": report.dropped_events,
            },
        )
        return
    verb = "delete" if action == "delete" else "snapshot"
    if report.dry_run:
        for entry in report.selected:
            out.write(f"would {verb} " + _entry_line(entry) + "\n")
        out.write(
            f"would {verb} {len(report.selected)} session"
            + ("" if len(report.selected) == 1 else "s")
            + " (dry run: pass --yes to do it)\n"
        )
        return
    done = "deleted" if action == "delete" else "snapshotted"
    out.write(
        f"{done} {report.done} of {len(report.selected)} selected sessions; kept {report.kept}"
        " written to since"
        + (f"; dropped {report.dropped_events} events" if action == "snapshot" else "")
        + "\n"
    )


async def _retain_with_progress(
    store: Store, args: argparse.Namespace, action: Literal["delete", "snapshot"]
) -> RetentionReport:
    from nous_session.retention import apply

    # The selection first (a dry run), so the bar knows its total; then the same policy acts.
    # A session that left the selection meanwhile is simply not selected the second time.
    preview = await apply(
        store,
        idle_for=args.idle_for,
        older_than=args.older_than,
        action=action,
        where=dict(args.where),
        tags=args.tag,
    )
    with _progress(len(preview.selected), f"retain ({action})", unit="session", least=1) as advance:
        return await apply(
            store,
            idle_for=args.idle_for,
            older_than=args.older_than,
            action=action,
            dry_run=False,
            where=dict(args.where),
            tags=args.tag,
            progress=lambda _done, _total: advance(1),
        )


async def _events(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    log = await _read(store, args.session)
    for event in log.since(args.since):
        if args.json:
            _emit(out, to_json(event))
        else:
            out.write(_event_line(event) + "\n")


async def _messages(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    log = await _read(store, args.session)
    if args.as_of is not None:
        if args.as_of >= log.count:
            raise CommandError(f"--as-of {args.as_of} is past the newest seq ({log.count - 1})")
        log = log.upto(args.as_of)  # a ValueError before the horizon: one line, exit 1
    for index, message in enumerate(log.derive_messages()):
        if args.json:
            _emit(out, _message_json(message))
        else:
            out.write(_message_line(index, message) + "\n")


def _describe_op(event: Event) -> str:
    op = event.op
    if type(op) is Replace:
        if event.type is EventType.REPLACE:
            count = len(event.data.get("messages") or ())  # type: ignore[arg-type]
            what = f"{count} message" + ("" if count == 1 else "s")
        else:
            what = f"one {event.type} message"
        source = event.data.get("source")
        return f"replace {op.start}..{op.stop} with {what}" + (f" ({source})" if source else "")
    if type(op) is Remove:
        return f"remove {op.start}..{op.stop}"
    if type(op) is Rewind:
        return f"rewind to seq {op.to}"
    assert type(op) is Uncompact
    return f"uncompact the replace at seq {op.seq}"


async def _history(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    stored = await _stored(store, args.session)
    operations = [event for event in stored.events if event.op is not None]
    if args.json:
        if stored.parent is not None or stored.horizon:
            _emit(
                out,
                {
                    "session_id": args.session,
                    "parent": stored.parent,
                    "fork_point": stored.fork_point,
                    "horizon": stored.horizon,
                },
            )
        for event in operations:
            _emit(out, {**to_json(event), "operation": _describe_op(event)})
        return
    if stored.parent is not None:
        out.write(f"forked from {stored.parent!r} at seq {stored.fork_point}\n")
    if stored.horizon:
        out.write(f"history before seq {stored.horizon - 1} was dropped by a snapshot\n")
    if not operations:
        out.write("no surface operations\n")
    for event in operations:
        out.write(f"{event.seq:>6}  {_stamp(event)}  {_describe_op(event)}\n")


async def _tail(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    from nous_session.stores import follow

    cursor = args.since
    held = await store.load(args.session)
    if not held:
        sys.stderr.write(f"waiting for session {args.session!r} to appear ...\n")
    if cursor is None:
        cursor = held[-10].seq if len(held) >= 10 else 0
    async with aclosing(follow(store, args.session, since=cursor, interval=args.interval)) as feed:
        async for event in feed:
            if args.json:
                _emit(out, to_json(event))
            else:
                out.write(_event_line(event) + "\n")
            out.flush()


async def _export(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    log = await _read(store, args.session)
    events = log.events()
    lines: list[bytes] = []
    with _progress(len(events), "export") as advance:
        for start in range(0, len(events), 1000):
            chunk = events[start : start + 1000]
            lines.extend(dumps(to_json(event)) + b"\n" for event in chunk)
            advance(len(chunk))
    if args.output:
        await anyio.Path(args.output).write_bytes(b"".join(lines))
        sys.stderr.write(f"wrote {len(events)} events to {args.output}\n")
    else:
        for line in lines:
            out.write(line.decode())


async def _stats(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    stored = await _stored(store, args.session)
    log = Log.restore(stored.events, count=stored.count, horizon=stored.horizon)
    events = log.events()
    surface = log.derive_messages()
    figures: dict[str, Any] = {
        "session_id": args.session,
        "count": log.count,
        "held": len(events),
        "horizon": log.horizon,
        "shadowed": len(log.shadowed()),
        "surface_messages": len(surface),
        "surface_tokens": estimate_messages_tokens(surface),
        "first": events[0].time.isoformat() if events else None,
        "last": events[-1].time.isoformat() if events else None,
        "types": dict(sorted(Counter(str(event.type) for event in events).items())),
    }
    if stored.parent is not None:
        figures.update(parent=stored.parent, fork_point=stored.fork_point)
    if args.json:
        _emit(out, figures)
        return
    for key, value in figures.items():
        if key == "types":
            out.write("types:\n")
            assert isinstance(value, dict)
            for name, number in value.items():
                out.write(f"  {name:<18} {number}\n")
        else:
            out.write(f"{key + ':':<18} {value}\n")


# Changing -----------------------------------------------------------------------------------


async def _fork(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    from nous_session.actor import SessionActor

    await _stored(store, args.session)
    async with SessionActor.open(session_id=args.session, store=store) as session:
        at = session.log.count - 1 if args.at is None else args.at
        await session.fork(args.new_session, at=at)
    out.write(f"forked {args.session!r} at seq {at} into {args.new_session!r}\n")


async def _rewind(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    from nous_session.actor import SessionActor

    await _stored(store, args.session)
    async with SessionActor.open(session_id=args.session, store=store) as session:
        event = await session.rewind(args.to)
        size = len(session.messages())
    if args.json:
        _emit(out, to_json(event))
        return
    out.write(f"rewound {args.session!r} to seq {args.to} (seq {event.seq}): {size} messages\n")


async def _remove(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    from nous_session.actor import SessionActor

    await _stored(store, args.session)
    last = args.first if args.last is None else args.last
    if last < args.first:
        raise CommandError(f"LAST ({last}) is before FIRST ({args.first})")
    async with SessionActor.open(session_id=args.session, store=store) as session:
        surface = session.log.surface()
        if last >= len(surface):
            raise CommandError(
                f"the surface has {len(surface)} messages (indexes 0..{len(surface) - 1})"
            )
        start, stop = surface[args.first].position, surface[last].position
        expect = [entry.seq for entry in session.log.range(start, stop)]
        # Only what was on screen: if another writer changed the range, nothing is removed.
        event = await session.remove(start, stop, expect=sorted(set(expect), key=expect.index))
    if args.json:
        _emit(out, to_json(event))
        return
    out.write(f"removed messages {args.first}..{last} of {args.session!r} (seq {event.seq})\n")


def _decode_lines(lines: Iterable[bytes], source: str) -> list[Event]:
    events = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{source} line {number}"
        try:
            value = loads(line)  # exact for ints wider than 64 bits
        except ValueError as error:
            raise CommandError(f"{where}: not JSON ({error})") from None
        events.append(from_json(value, where=where))
    return events


async def _import(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    source = args.file or "standard input"
    if args.metadata is not None:
        try:  # checked before anything is written
            SessionMetadata.from_json(loads(args.metadata))
        except ValueError as error:
            raise CommandError(f"bad --metadata: {error}") from None
    if args.file:
        raw = await anyio.Path(args.file).read_bytes()
    else:
        raw = await anyio.to_thread.run_sync(sys.stdin.buffer.read)
    events = _decode_lines(raw.splitlines(), source)
    if not events:
        raise CommandError(f"{source} holds no events")
    try:
        log = Log.restore(events)
    except NousSessionError as error:
        raise CommandError(f"{source}: {error}") from None
    if (await store.read(args.new_session)).count:
        raise CommandError(f"session {args.new_session!r} exists already in {_where(store)}")
    horizon = _horizon_of(events)
    with _progress(len(events), "import") as advance:
        await store.commit(
            args.new_session,
            expected_count=0,
            events=events,
            horizon=horizon or None,
        )
        advance(len(events))
    back = await store.read(args.new_session)
    if list(back.events) != events or back.count != log.count:
        raise CommandError(
            f"session {args.new_session!r} does not read back as {source}: the store changed it"
        )
    Log.restore(back.events, count=back.count, horizon=back.horizon).derive_messages()
    out.write(f"imported {len(events)} events from {source} into {args.new_session!r}\n")
    if args.metadata is not None:
        await _set_metadata(store, args.new_session, args.metadata, out)


def _horizon_of(events: list[Event]) -> int:
    """The horizon of an export: one past its highest gap in seqs, 0 when it has none.

    An export of a snapshotted session has gaps below its horizon. Found from the events, in
    O(events): the file, not the seqs it names, bounds the work (a seq of 10**9 must not
    make the command walk a billion numbers).
    """
    # The seqs increase (Log.restore checked), so the highest gap sits just below the last
    # event that does not follow its predecessor.
    for index in range(len(events) - 1, 0, -1):
        if events[index].seq != events[index - 1].seq + 1:
            return events[index].seq
    return events[0].seq if events else 0


async def _snapshot(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    from nous_session.actor import SessionActor

    before = await _read(store, args.session)
    dropping = len(before.shadowed())
    if not args.yes:
        raise CommandError(
            f"a snapshot of {args.session!r} would drop {dropping} of its"
            f" {len(before.events())} events for good; pass --yes to drop them"
        )
    with _progress(3 * max(len(before.events()), 1000), "snapshot") as advance:
        advance(len(before.events()))
        async with SessionActor.open(session_id=args.session, store=store) as session:
            after = await session.snapshot()
        advance(len(before.events()))
        if args.vacuum:
            if not supports(store, VacuumingStore):
                raise CommandError("this store has nothing to vacuum")
            await store.vacuum()  # type: ignore[attr-defined]
        advance(len(before.events()))
    dropped = len(before.events()) - len(after.events())
    held = len(after.events())
    if args.json:
        _emit(
            out, {"dropped": dropped, "held": held, "count": after.count, "vacuumed": args.vacuum}
        )
        return
    out.write(f"dropped {dropped} shadowed events; {held} held, count {after.count}\n")
    if args.vacuum:
        out.write("vacuumed\n")


async def _delete(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    stored = await _stored(store, args.session)
    if not args.yes:
        raise CommandError(
            f"deleting {args.session!r} drops its {len(stored.events)} events for good;"
            " pass --yes to delete it"
        )
    await store.delete(args.session)
    out.write(f"deleted {args.session!r}\n")


async def _erase(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    if not supports(store, ErasingStore):
        raise CommandError(f"{_where(store)} cannot erase events")
    chosen = bool(args.seqs) + (args.role is not None or args.name is not None) + args.all
    if chosen != 1:
        raise CommandError("name the events to erase: SEQs, or --role/--name, or --all")
    if args.inherited and not args.all:
        raise CommandError("--inherited goes with --all")
    eraser: Any = store
    dry_run = not args.yes
    if args.all:
        result = await eraser.erase_session(
            args.session, reason=args.reason, inherited=args.inherited, dry_run=dry_run
        )
    else:
        seqs = args.seqs
        if not seqs:
            stored = await _stored(store, args.session)
            seqs = select_events(stored.events, role=args.role, name=args.name)
        result = await eraser.erase(args.session, seqs, reason=args.reason, dry_run=dry_run)
    if args.json:
        _emit(out, result.to_json())
    else:
        _erasure_lines(out, result, args.session)
    if not dry_run and not result.proven:
        raise CommandError(f"erased, but it is not proven that no copy remains: {result.detail}")


def _erasure_lines(out: TextIO, result: Erasure, session_id: str) -> None:
    dry_run = result.dry_run
    verb = "would erase" if dry_run else "erased"
    out.write(f"{verb} {len(result.erased)} events of {session_id!r}: {_seqs(result.erased)}\n")
    if result.already:
        out.write(f"erased before: {_seqs(result.already)}\n")
    if result.absent:
        out.write(f"held nowhere any more (a snapshot dropped them): {_seqs(result.absent)}\n")
    if result.sessions:
        out.write(f"also in: {', '.join(repr(name) for name in result.sessions)}\n")
    if dry_run:
        out.write("dry run: nothing was changed; pass --yes to erase\n")
        return
    if result.proven:
        out.write(f"proven: {result.detail}\n")


def _seqs(seqs: Sequence[int]) -> str:
    return ", ".join(str(seq) for seq in seqs) if seqs else "none"


async def _demo(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    from nous_session.demo import run_demo

    await store.aclose()  # the demo opens its own
    figures = await run_demo(
        store_url=args.store,
        session_id=args.session,
        turns=args.turns,
        token_budget=args.budget,
        out=out,
    )
    if not figures["intact_after_restart"]:
        raise CommandError("the session did not come back intact after the restart")


_Command = Callable[[Store, argparse.Namespace, TextIO], Awaitable[None]]
_READING: dict[str, _Command] = {
    "sessions": _sessions,
    "events": _events,
    "messages": _messages,
    "history": _history,
    "tail": _tail,
    "export": _export,
    "stats": _stats,
}
# Read-only unless asked to write: a dry run and a look at metadata create nothing.
_SOMETIMES_WRITING: dict[str, tuple[_Command, Callable[[argparse.Namespace], bool]]] = {
    "metadata": (_metadata, lambda args: args.set is not None),
    "retain": (_retain, lambda args: bool(args.yes)),
}
_WRITING: dict[str, _Command] = {
    "fork": _fork,
    "rewind": _rewind,
    "remove": _remove,
    "import": _import,
    "snapshot": _snapshot,
    "delete": _delete,
    "erase": _erase,
    "demo": _demo,
}


async def _run(args: argparse.Namespace, out: TextIO, interrupt: _Interrupt | None) -> None:
    reading = args.command in _READING
    command = (_READING if reading else _WRITING).get(args.command)
    if args.command in _SOMETIMES_WRITING:
        command, writes = _SOMETIMES_WRITING[args.command]
        reading = not writes(args)
    assert command is not None
    # Reading never writes: a read-only store creates no file and no table, and refuses a
    # missing file or a database that is not a nous_session store.
    store = open_store(args.store, read_only=reading)
    try:
        async with anyio.create_task_group() as task_group:
            if interrupt is not None:
                task_group.start_soon(interrupt.watch, task_group.cancel_scope)
            await command(store, args, out)
            task_group.cancel_scope.cancel()  # the watcher
    except BaseExceptionGroup as group:
        # Only the command can fail (the watcher waits and cancels): its own error, unwrapped.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
    finally:
        await store.aclose()  # outside the cancelled scope: a Ctrl-C still closes it


class _Interrupt:
    """Ctrl-C for the command line run as a program: the first stops the command, cleanly;
    later ones are ignored.

    The handler never raises: a KeyboardInterrupt raised at whatever bytecode the main thread
    is at can land in the middle of the event loop's or a lock's bookkeeping, and a second one
    landing while the interpreter joins a worker thread at exit makes Python print
    ``Exception ignored in: <module 'threading'>`` and a traceback. Instead the handler ignores
    SIGINT from then on and wakes the event loop through a socket pair, and :meth:`watch`
    cancels the command there, so that the store is closed as at any other end.
    """

    def __init__(self) -> None:
        self.received = False
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        self._previous = signal.signal(signal.SIGINT, self._handler)

    def _handler(self, signum: int, frame: object) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.received = True
        with suppress(OSError):
            self._writer.send(b"\0")

    async def watch(self, scope: anyio.CancelScope) -> None:
        """Cancel ``scope`` at the first Ctrl-C."""
        await anyio.wait_readable(self._reader)
        scope.cancel()

    def close(self) -> None:
        """Close the socket pair; give SIGINT its handler back unless it was received (the
        process is ending: a later Ctrl-C must not interrupt the interpreter's exit)."""
        if not self.received:
            signal.signal(signal.SIGINT, self._previous)
        self._reader.close()
        self._writer.close()


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Run the command line; return the exit status."""
    args = _parser().parse_args(argv)
    output = out or sys.stdout
    if out is None:
        # Run as a program (not called from Python): this process's logging is ours to set.
        level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)]
        structlog.configure(
            wrapper_class=structlog.make_filtering_bound_logger(level),
            logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        )
    interrupt = None
    if out is None and threading.current_thread() is threading.main_thread():
        interrupt = _Interrupt()
    try:
        anyio.run(_run, args, output, interrupt)
        if interrupt is not None and interrupt.received:
            return 130  # as a shell reports a command that Ctrl-C stopped
    except BrokenPipeError:
        # A closed pipe (`| head`) ends the command quietly, as it does for any Unix tool.
        # (Not SIGPIPE's default action: that would also kill the process for a socket a
        # server closed under a database driver.)
        with suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130  # as a shell reports a command that Ctrl-C stopped
    except (CommandError, NousSessionError, ValueError, OSError, ImportError) as error:
        message = " ".join(str(error).split())  # one line, whatever the error holds
        sys.stderr.write(f"nous-session: error: {message}\n")
        return 1
    finally:
        if interrupt is not None:
            interrupt.close()
    return 0
