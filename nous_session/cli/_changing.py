"""The verbs that change stored sessions: each records what it does as events, but for
``delete``, which says what it removes (``erase`` has a module of its own)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import anyio
import attrs

from nous_session._json import loads
from nous_session.cli._common import (
    CommandError,
    ProgressBar,
    emit,
    gap_horizon,
    progress_bar,
    read_log,
    read_stored,
    store_name,
    vacuums,
)
from nous_session.cli._reading import set_metadata
from nous_session.codec import from_json, to_json
from nous_session.errors import NousSessionError
from nous_session.event import Event
from nous_session.log import Log
from nous_session.metadata import SessionMetadata
from nous_session.stores import Store, Stored, copy_sessions, open_store
from nous_session.stores._copy import commit_whole, undo


async def copy_command(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    """Copy sessions from ``store`` (opened read-only) to the store ``--to`` names."""
    target = open_store(args.to)
    if _same_store(store, target):
        await target.aclose()  # before it was used: nothing opened, nothing written
        raise CommandError(f"--to names the store the sessions are copied from ({args.to})")
    try:
        report = await copy_sessions(store, target, args.sessions or None)
    finally:
        await target.aclose()
    if args.json:
        emit(
            out,
            {
                "copied": list(report.copied),
                "forked": list(report.forked),
                "unlinked": dict(report.unlinked),
                "skipped": dict(report.skipped),
            },
        )
        return
    forks = f" ({len(report.forked)} as forks of their parent's copy)" if report.forked else ""
    count = len(report.copied)
    out.write(f"copied {count} session{'' if count == 1 else 's'} to {args.to}{forks}\n")
    for session_id, why in report.unlinked:
        out.write(f"  {session_id!r} is a whole session there, not a fork: {why}\n")
    for session_id, why in report.skipped:
        out.write(f"  skipped {session_id!r}: {why}\n")


def _same_store(one: Store, other: Store) -> bool:
    """Whether two stores are one: the same SQLite file (however named), or the same URL
    (and schema) of another kind; each ``memory:`` store is its own."""
    paths = getattr(one, "path", None), getattr(other, "path", None)
    if all(isinstance(path, str) and path != ":memory:" for path in paths):
        return Path(str(paths[0])).resolve() == Path(str(paths[1])).resolve()
    url = getattr(one, "url", None)
    return (
        url == getattr(other, "url", None)
        and url not in (None, "memory:", "sqlite:///:memory:")
        and getattr(one, "schema", None) == getattr(other, "schema", None)
    )


async def fork_command(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    from nous_session.actor import SessionActor

    await read_stored(store, args.session)
    async with SessionActor.open(session_id=args.session, store=store) as session:
        at = session.log.count - 1 if args.at is None else args.at
        await session.fork(args.new_session, at=at)
    out.write(f"forked {args.session!r} at seq {at} into {args.new_session!r}\n")


async def rewind_command(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    from nous_session.actor import SessionActor

    await read_stored(store, args.session)
    async with SessionActor.open(session_id=args.session, store=store) as session:
        event = await session.rewind(args.to)
        size = len(session.messages())
    if args.json:
        emit(out, to_json(event))
        return
    out.write(f"rewound {args.session!r} to seq {args.to} (seq {event.seq}): {size} messages\n")


async def remove_command(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    from nous_session.actor import SessionActor

    await read_stored(store, args.session)
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
        emit(out, to_json(event))
        return
    out.write(f"removed messages {args.first}..{last} of {args.session!r} (seq {event.seq})\n")


_CHUNK = 1000  # records decoded or checked between two steps of the progress bar


@attrs.define
class _Export:
    """What an export's lines hold: its session record (None when it has none), the events
    kept aside for keys, and the events."""

    header: Any = None
    kept: list[Event] = attrs.Factory(list)
    events: list[Event] = attrs.Factory(list)


async def _decode_lines(lines: Sequence[bytes], source: str, advance: ProgressBar) -> _Export:
    """The records of an export's lines, decoded a chunk at a time: the bar advances as
    records are read, and a Ctrl-C stops the command between two chunks."""
    export = _Export()
    first = True
    for start in range(0, len(lines), _CHUNK):
        for number, line in enumerate(lines[start : start + _CHUNK], start + 1):
            if not line.strip():
                continue
            where = f"{source} line {number}"
            try:
                value = loads(line)  # exact for ints wider than 64 bits
            except ValueError as error:
                raise CommandError(f"{where}: not JSON ({error})") from None
            if first and isinstance(value, dict) and list(value) == ["session"]:
                export.header = value["session"]
            elif isinstance(value, dict) and list(value) == ["kept"]:
                if export.header is None or export.events:
                    raise CommandError(f"{where}: a kept event belongs after the session record")
                export.kept.append(from_json(value["kept"], where=where))
            else:
                export.events.append(from_json(value, where=where))
            first = False
        advance(min(_CHUNK, len(lines) - start))
        await anyio.lowlevel.checkpoint()
    return export


def _session_of(export: _Export, source: str) -> Stored:
    """The session an export describes, checked: its events fold into a log, and its session
    record (if any) fits them.

    Raises:
        CommandError: naming what is wrong.
    """
    events = export.events
    header = export.header
    seqs = [event.seq for event in events]
    count, horizon = (seqs[-1] + 1 if seqs else 0), gap_horizon(seqs)
    keys: dict[str, tuple[int, int]] = {}
    if header is not None:
        fields = {"count", "horizon", "keys"}
        if not isinstance(header, dict) or set(header) != fields:
            raise CommandError(
                f"{source}: the session record is an object of {', '.join(sorted(fields))},"
                f" not {header!r}"
            )
        count, horizon = header["count"], header["horizon"]
        if type(count) is not int or type(horizon) is not int:
            raise CommandError(f"{source}: the session's count and horizon are ints")
        if not isinstance(header["keys"], list):
            raise CommandError(f"{source}: the session's keys are a list")
        stored = {*seqs, *(event.seq for event in export.kept)}
        for entry in header["keys"]:
            if not (
                isinstance(entry, list)
                and len(entry) == 3
                and type(entry[0]) is str
                and all(type(n) is int for n in entry[1:])
                and entry[2] >= 1
                and entry[0] not in keys
                and entry[2] <= len(stored)
                and all(seq in stored for seq in range(entry[1], entry[1] + entry[2]))
            ):
                raise CommandError(
                    f"{source}: bad key {entry!r}: a [key, first seq, size] whose events the"
                    " export holds, each key once"
                )
            keys[entry[0]] = (entry[1], entry[2])
    if not count:  # (a session record alone says what a session a snapshot emptied is)
        raise CommandError(f"{source} holds no events")
    kept = sorted(export.kept, key=lambda event: event.seq)
    held = set(seqs)
    if any(event.seq >= horizon or event.seq in held for event in kept) or len(
        {event.seq for event in kept}
    ) != len(kept):
        raise CommandError(
            f"{source}: a kept event is at a seq the session holds, twice, or at or past the"
            f" horizon {horizon}"
        )
    try:  # the events make a session that opens (they fold), before anything is written
        log = Log.restore(events, count=count, horizon=horizon)
        log.derive_messages()
    except (NousSessionError, ValueError) as error:
        raise CommandError(f"{source}: {error}") from None
    return Stored(events, log.count, log.horizon, keys, kept)


async def import_command(store: Store, args: argparse.Namespace, out: TextIO) -> None:
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
    lines = raw.splitlines()
    # One bar, three stages, each counting the records: reading them (a chunk at a time),
    # writing them (one transaction, so that an import is all or nothing: that stage
    # completes in one step; a session whose snapshot kept events aside or dropped its
    # newest ones takes a second, and is deleted again if that fails), and checking what the
    # store holds (read back in one step, then compared a chunk at a time).
    with progress_bar(len(lines), "import: reading") as advance:
        session = _session_of(await _decode_lines(lines, source, advance), source)
        events = list(session.events)
        if (await store.read(args.new_session)).count:
            raise CommandError(
                f"session {args.new_session!r} exists already in {store_name(store)}"
            )
        advance.stage("import: writing (one transaction)", total=len(events))
        try:
            await commit_whole(store, args.new_session, session)
        except BaseException as error:
            await undo(store, args.new_session, session, error)
            if isinstance(error, ValueError):
                raise CommandError(f"{source}: {error}") from None
            raise
        advance(len(events))
        advance.stage("import: checking", total=len(events))
        back = await store.read(args.new_session)
        held = list(back.events)
        # The same events, count, horizon, keys and kept events: the same session.
        same = (len(held), back.count, back.horizon, dict(back.keys), list(back.kept)) == (
            len(events),
            session.count,
            session.horizon,
            dict(session.keys),
            list(session.kept),
        )
        for start in range(0, len(events), _CHUNK):
            if not same:
                break
            same = held[start : start + _CHUNK] == events[start : start + _CHUNK]
            advance(min(_CHUNK, len(events) - start))
            await anyio.lowlevel.checkpoint()
        if not same:
            raise CommandError(
                f"session {args.new_session!r} does not read back as {source}: the store changed it"
            )
    out.write(f"imported {len(events)} events from {source} into {args.new_session!r}\n")
    if args.metadata is not None:
        await set_metadata(store, args.new_session, args.metadata, out)


async def snapshot_command(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    from nous_session.actor import SessionActor

    before = await read_log(store, args.session)
    dropping = len(before.shadowed())
    if not args.yes:
        raise CommandError(
            f"a snapshot of {args.session!r} would drop {dropping} of its"
            f" {len(before.events())} events for good; pass --yes to drop them"
        )
    with progress_bar(3 * max(len(before.events()), 1000), "snapshot") as advance:
        advance(len(before.events()))
        async with SessionActor.open(session_id=args.session, store=store) as session:
            after = await session.snapshot()
        advance(len(before.events()))
        if args.vacuum:
            if not vacuums(store):
                raise CommandError("this store has nothing to vacuum")
            await store.vacuum()
        advance(len(before.events()))
    dropped = len(before.events()) - len(after.events())
    held = len(after.events())
    if args.json:
        emit(out, {"dropped": dropped, "held": held, "count": after.count, "vacuumed": args.vacuum})
        return
    out.write(f"dropped {dropped} shadowed events; {held} held, count {after.count}\n")
    if args.vacuum:
        out.write("vacuumed\n")


async def delete_command(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    stored = await read_stored(store, args.session)
    if not args.yes:
        raise CommandError(
            f"deleting {args.session!r} drops its {len(stored.events)} events for good;"
            " pass --yes to delete it"
        )
    await store.delete(args.session)
    out.write(f"deleted {args.session!r}\n")


async def demo_command(store: Store, args: argparse.Namespace, out: TextIO) -> None:
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
