"""The verbs that change stored sessions: each records what it does as events, but for
``delete``, which says what it removes (``erase`` has a module of its own)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import anyio

from nous_session._json import loads
from nous_session.cli._common import (
    CommandError,
    _Bar,
    _emit,
    _progress,
    _read,
    _stored,
    _vacuums,
    _where,
)
from nous_session.cli._reading import _set_metadata
from nous_session.codec import from_json, to_json
from nous_session.errors import NousSessionError
from nous_session.event import Event
from nous_session.log import Log
from nous_session.metadata import SessionMetadata
from nous_session.stores import Store, copy_sessions, open_store


async def _copy(store: Store, args: argparse.Namespace, out: TextIO) -> None:
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
        _emit(
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


_CHUNK = 1000  # records decoded or checked between two steps of the progress bar


async def _decode_lines(lines: Sequence[bytes], source: str, advance: _Bar) -> list[Event]:
    """The events of an export's lines, decoded a chunk at a time: the bar advances as
    records are read, and a Ctrl-C stops the command between two chunks."""
    events = []
    for start in range(0, len(lines), _CHUNK):
        for number, line in enumerate(lines[start : start + _CHUNK], start + 1):
            if not line.strip():
                continue
            where = f"{source} line {number}"
            try:
                value = loads(line)  # exact for ints wider than 64 bits
            except ValueError as error:
                raise CommandError(f"{where}: not JSON ({error})") from None
            events.append(from_json(value, where=where))
        advance(min(_CHUNK, len(lines) - start))
        await anyio.lowlevel.checkpoint()
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
    lines = raw.splitlines()
    # One bar, three stages, each counting the records: reading them (a chunk at a time),
    # writing them (one transaction, so that an import is all or nothing: that stage
    # completes in one step), and checking what the store holds (read back in one step, then
    # compared a chunk at a time).
    with _progress(len(lines), "import: reading") as advance:
        events = await _decode_lines(lines, source, advance)
        if not events:
            raise CommandError(f"{source} holds no events")
        horizon = _horizon_of(events)
        try:  # the events make a session that opens (they fold), before anything is written
            log = Log.restore(events, horizon=horizon)
            log.derive_messages()
        except (NousSessionError, ValueError) as error:
            raise CommandError(f"{source}: {error}") from None
        if (await store.read(args.new_session)).count:
            raise CommandError(f"session {args.new_session!r} exists already in {_where(store)}")
        advance.stage("import: writing (one transaction)", total=len(events))
        await store.commit(
            args.new_session,
            expected_count=0,
            events=events,
            horizon=horizon or None,
        )
        advance(len(events))
        advance.stage("import: checking", total=len(events))
        back = await store.read(args.new_session)
        held = list(back.events)
        # The same events, count and horizon as the log folded above: the same session.
        same = (len(held), back.count, back.horizon) == (len(events), log.count, log.horizon)
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
            if not _vacuums(store):
                raise CommandError("this store has nothing to vacuum")
            await store.vacuum()
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
