"""The verbs that look inside stored sessions (they open the store read-only, but for
``metadata --set`` and ``retain --yes``)."""

from __future__ import annotations

import argparse
import functools
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Any, Literal, TextIO

import anyio

from nous_session._json import dumps, loads
from nous_session.cli._common import (
    CommandError,
    clip,
    emit,
    event_line,
    export_header,
    listing_store,
    message_json,
    message_lines,
    progress_bar,
    read_log,
    read_stored,
    seq_ranges,
    stamp,
    store_name,
    where_query,
)
from nous_session.codec import to_json
from nous_session.event import Event, EventType
from nous_session.listing import SessionEntry, metadata_of
from nous_session.log import Log
from nous_session.metadata import SessionMetadata
from nous_session.ops import Remove, Replace, Rewind, Uncompact
from nous_session.retention import RetentionReport
from nous_session.stores import Store
from nous_session.transcript import estimate_messages_tokens


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
        f"{clip(entry.session_id, 32):<32} {entry.count:>7}  "
        f"{entry.active.strftime('%Y-%m-%d %H:%M:%S')}  {clip(record.owner or '-', 16):<16} "
        f"{clip(record.app or '-', 12):<12} {clip(record.title or '', 30)}"
        + (f"  [{clip(tags, 30)}]" if tags else "")
    ).rstrip()


async def _listing(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    page = await listing_store(store).list_sessions(
        where=where_query(args.where),
        tags=args.tag,
        order=args.order or "active",
        descending=not args.ascending,
        limit=args.limit or 50,
        cursor=args.cursor,
    )
    if args.json:
        for entry in page.sessions:
            emit(out, _entry_json(entry))
        if page.cursor is not None:
            emit(out, {"cursor": page.cursor})
        return
    if not page.sessions:
        out.write(f"no matching sessions in {store_name(store)}\n")
        return
    out.write(f"{'SESSION':<32} {'COUNT':>7}  {'ACTIVE':<19}  {'OWNER':<16} {'APP':<12} TITLE\n")
    for entry in page.sessions:
        out.write(_entry_line(entry) + "\n")
    if page.cursor is not None:
        out.write(f"more: --cursor {page.cursor}\n")


async def sessions_command(store: Store, args: argparse.Namespace, out: TextIO) -> None:
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
            emit(out, row)
        return
    if not infos:
        out.write(f"no sessions in {store_name(store)}\n")
        return
    out.write(f"{'SESSION':<40} {'COUNT':>8} {'HELD':>8}  FORKED FROM\n")
    for info in infos:
        lineage = "" if info.parent is None else f"  {info.parent} @ {info.fork_point}"
        out.write(f"{clip(info.session_id, 40):<40} {info.count:>8} {info.held:>8}{lineage}\n")


async def metadata_command(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    if args.set is not None:
        await set_metadata(store, args.session, args.set, out)
        return
    if args.update is not None:
        await set_metadata(store, args.session, args.update, out, update=True)
        return
    log = await read_log(store, args.session)
    record = metadata_of(log.events()) or SessionMetadata()
    if args.json:
        emit(out, record.to_json())
        return
    for key, value in record.to_json().items():
        shown = ", ".join(sorted(record.tags)) if key == "tags" else value
        out.write(f"{key + ':':<8} {shown if isinstance(shown, str) else dumps(shown).decode()}\n")


async def set_metadata(
    store: Store, session_id: str, text: str, out: TextIO, *, update: bool = False
) -> None:
    """Set the session's metadata to the JSON record ``text`` (``update``: only the fields it
    gives, the others kept)."""
    from nous_session.actor import SessionActor

    try:
        given = loads(text)
    except ValueError as error:
        raise CommandError(
            f"the metadata is not JSON ({error}); give an object such as "
            """'{"owner": "ann", "title": "Trip"}'"""
        ) from None
    if not isinstance(given, dict):
        raise CommandError(f"the metadata must be a JSON object, got {text!r}")
    await read_stored(store, session_id)
    async with SessionActor.open(session_id=session_id, store=store) as session:
        if update:
            current = session.metadata or SessionMetadata()
            given = {**current.to_json(), **given}
        try:
            record = SessionMetadata.from_json(given)
        except ValueError as error:
            raise CommandError(f"bad metadata: {error}") from None
        dropped = sorted(
            key
            for key, value in (session.metadata or SessionMetadata()).to_json().items()
            if key not in given and value
        )
        event = await session.set_metadata(record)
    out.write(f"set the metadata of {session_id!r} (seq {event.seq})\n")
    if dropped:
        out.write(f"dropped: {', '.join(dropped)} (--update changes only the fields it gives)\n")


def _retention(
    store: Store, args: argparse.Namespace, action: Literal["delete", "snapshot"]
) -> Callable[..., Awaitable[RetentionReport]]:
    """``retention.apply`` with the policy the arguments give (a dry run unless told)."""
    from nous_session.retention import apply

    return functools.partial(
        apply,
        store,
        idle_for=args.idle_for,
        older_than=args.older_than,
        action=action,
        where=where_query(args.where),
        tags=args.tag,
    )


async def retain_command(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    action: Literal["delete", "snapshot"] = args.action or "delete"
    if args.idle_for is None and args.older_than is None:
        raise CommandError("retain needs --idle-for, --older-than or both")
    if args.yes:
        report = await _retain_with_progress(store, args, action)
    else:
        report = await _retention(store, args, action)()
    if args.json:
        for entry in report.selected if report.dry_run else ():
            emit(out, _entry_json(entry))
        emit(
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
    # The selection first (a dry run), so the bar knows its total; then the same policy acts.
    # A session that left the selection meanwhile is simply not selected the second time.
    policy = _retention(store, args, action)
    preview = await policy()
    with progress_bar(
        len(preview.selected), f"retain ({action})", unit="session", least=1
    ) as advance:
        try:
            return await policy(dry_run=False, progress=lambda _done, _total: advance(1))
        except anyio.get_cancelled_exc_class() as cancelled:
            # Ctrl-C: the command ends quietly, but for how far the retention got.
            for note in getattr(cancelled, "__notes__", ()):
                sys.stderr.write(f"nous-session: {note}\n")
            raise


async def events_command(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    log = await read_log(store, args.session)
    for event in log.since(args.since):
        if args.json:
            emit(out, to_json(event))
        else:
            out.write(event_line(event) + "\n")


async def messages_command(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    log = await read_log(store, args.session)
    if args.as_of is not None:
        if args.as_of >= log.count:
            raise CommandError(f"--as-of {args.as_of} is past the newest seq ({log.count - 1})")
        log = log.upto(args.as_of)  # a ValueError before the horizon: one line, exit 1
    rows = log.derive_indexed()
    if args.json:
        for seq, message in rows:
            emit(out, message_json(seq, message))
        return
    if not rows:
        out.write(f"no messages on the surface of {args.session!r}\n")
        return
    for line in message_lines(rows):
        out.write(line + "\n")


def _describe_op(event: Event) -> str:
    if event.type is EventType.ERASURE:
        seqs = event.data.get("seqs")
        listed = (
            seq_ranges(seq for seq in seqs if type(seq) is int) if isinstance(seqs, list) else ""
        )
        return f"erase seqs {listed} ({event.data.get('reason')})"
    op = event.op
    if type(op) is Replace:
        if event.type is EventType.REPLACE:
            messages = event.data.get("messages")
            count = len(messages) if isinstance(messages, list) else 0
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


async def history_command(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    stored = await read_stored(store, args.session)
    operations = [
        event for event in stored.events if event.op is not None or event.type is EventType.ERASURE
    ]
    if args.json:
        if stored.parent is not None or stored.horizon:
            emit(
                out,
                {
                    "session_id": args.session,
                    "parent": stored.parent,
                    "fork_point": stored.fork_point,
                    "horizon": stored.horizon,
                },
            )
        for event in operations:
            emit(out, {**to_json(event), "operation": _describe_op(event)})
        return
    if stored.parent is not None:
        out.write(f"forked from {stored.parent!r} at seq {stored.fork_point}\n")
    if stored.horizon:
        out.write(f"history before seq {stored.horizon - 1} was dropped by a snapshot\n")
    if not operations:
        out.write("no surface operations or erasures\n")
    for event in operations:
        out.write(f"{event.seq:>6}  {stamp(event)}  {_describe_op(event)}\n")


async def tail_command(store: Store, args: argparse.Namespace, out: TextIO) -> None:
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
                emit(out, to_json(event))
            else:
                out.write(event_line(event) + "\n")
            out.flush()


async def export_command(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    stored = await read_stored(store, args.session)
    events = Log.restore(stored.events, count=stored.count, horizon=stored.horizon).events()
    lines: list[bytes] = []
    header = export_header(stored)
    if header is not None:  # what the events alone do not say: see export_header
        lines.append(dumps({"session": header}) + b"\n")
        lines.extend(dumps({"kept": to_json(event)}) + b"\n" for event in stored.kept)
    with progress_bar(len(events), "export") as advance:
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


async def stats_command(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    stored = await read_stored(store, args.session)
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
        emit(out, figures)
        return
    for key, value in figures.items():
        if key == "types":
            out.write("types:\n")
            assert isinstance(value, dict)
            for name, number in value.items():
                out.write(f"  {name:<18} {number}\n")
        else:
            out.write(f"{key + ':':<18} {value}\n")
