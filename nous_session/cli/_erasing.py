"""The ``erase`` verb: which events it chooses, what its dry run shows of them, and what it
says it did (seqs as ranges, the summaries erased with what they cover)."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator, Mapping, Sequence
from typing import TextIO, TypeGuard

import attrs

from nous_session._json import dumps
from nous_session.cli._common import (
    CommandError,
    emit,
    message_text,
    read_stored,
    seq_ranges,
    snippet,
    store_name,
)
from nous_session.erasure import Erasure, check_seqs, erase_event, now, select_events
from nous_session.event import Event, EventType, replace_entries, to_message
from nous_session.ops import OP_KEY
from nous_session.stores import Store, Stored
from nous_session.stores.base import ErasingStore, supports

DETAILED = 20
"""How many events a dry run describes one by one (the first line lists them all)."""

TEXT_WIDTH = 40
"""How much of an event's text a dry run shows."""


@attrs.frozen
class Choice:
    """The events to erase, as the arguments chose them.

    Attributes:
        seqs: the seqs to erase (None: every event the session wrote itself, ``--all``).
        unmatched: seqs given that ``--role``/``--name`` do not choose: not erased.
        unheld: seqs given that the session no longer holds (a snapshot dropped them), so
            that ``--role``/``--name`` cannot be checked: not erased.
        criteria: ``--role``/``--name`` as given, for the messages (empty without them).
    """

    seqs: tuple[int, ...] | None
    unmatched: tuple[int, ...] = ()
    unheld: tuple[int, ...] = ()
    criteria: str = ""


def _erases(store: Store) -> TypeGuard[ErasingStore]:
    """:func:`supports`, as a guard mypy narrows the store by."""
    return supports(store, ErasingStore)


def _criteria(args: argparse.Namespace) -> str:
    given = [("--role", args.role), ("--name", args.name)]
    return " ".join(f"{flag} {shlex.quote(value)}" for flag, value in given if value is not None)


def _check_arguments(args: argparse.Namespace) -> None:
    """Refuse a combination of arguments that does not say which events to erase.

    Raises:
        CommandError: naming what is wrong and what to give instead.
    """
    by_person = args.role is not None or args.name is not None
    if args.all and args.seqs:
        raise CommandError(
            "--all erases every event the session wrote itself: give it without SEQs,"
            " or SEQs without --all"
        )
    if args.all and by_person:
        raise CommandError(
            "--all erases every event the session wrote itself, whoever wrote it: give it"
            f" without {_criteria(args)}, or {_criteria(args)} without --all"
        )
    if not (args.all or args.seqs or by_person):
        raise CommandError(
            "name the events to erase: SEQs, or --role/--name, or both (only those of the"
            " SEQs that --role/--name choose), or --all"
        )
    if args.inherited and not args.all:
        raise CommandError("--inherited goes with --all")


def _choose(args: argparse.Namespace, stored: Stored | None) -> Choice:
    """The events the arguments choose; ``stored``: the session, read (needed for
    ``--role``/``--name``).

    Raises:
        ValueError: a SEQ given with ``--role``/``--name`` is not one of the session's.
        CommandError: SEQs were given with ``--role``/``--name`` and none of them matches.
    """
    if args.all:
        return Choice(None)
    criteria = _criteria(args)
    if not criteria:
        return Choice(tuple(args.seqs))
    assert stored is not None
    # The summaries that copy the chosen messages: alone, the store adds them and names them
    # (Erasure.summaries); with SEQs, a SEQ that is one of them is chosen too, so that no SEQ
    # is listed as not erased while the store erases it as a summary.
    chosen = set(
        select_events(stored.events, role=args.role, name=args.name, summaries=bool(args.seqs))
    )
    if not args.seqs:
        return Choice(tuple(sorted(chosen)), criteria=criteria)
    # Both: only those of the SEQs that --role/--name choose (what "erase 3 5 9 --name alice"
    # means). A seq the session does not have is an error, as it is without --role/--name.
    given = check_seqs(args.seqs, stored.count, session_id=args.session)
    held = {event.seq: event for event in stored.events}
    # An event erased before no longer has a name to match: it goes to the store, which
    # changes nothing and lists it as erased before (so the same command run twice agrees).
    at = now()
    chosen.update(
        seq
        for seq in given
        if seq in held and erase_event(held[seq], reason=args.reason, at=at) is held[seq]
    )
    choice = Choice(
        tuple(seq for seq in given if seq in chosen),
        unmatched=tuple(seq for seq in given if seq not in chosen and seq in held),
        unheld=tuple(seq for seq in given if seq not in held),
        criteria=criteria,
    )
    if not choice.seqs:
        raise CommandError(
            f"none of the SEQs given ({seq_ranges(given)}) is chosen by {criteria}:"
            f" nothing to erase (`erase {shlex.quote(args.session)} {criteria}` without SEQs"
            " shows the events it chooses)"
        )
    return choice


async def erase_command(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    if not _erases(store):
        raise CommandError(f"{store_name(store)} cannot erase events")
    _check_arguments(args)
    dry_run = not args.yes
    stored = None
    if dry_run or args.role is not None or args.name is not None:
        stored = await read_stored(store, args.session)  # what a dry run describes
    choice = _choose(args, stored)
    if choice.seqs is None:
        result = await store.erase_session(
            args.session, reason=args.reason, inherited=args.inherited, dry_run=dry_run
        )
    else:
        result = await store.erase(args.session, choice.seqs, reason=args.reason, dry_run=dry_run)
    if args.json:
        emit(out, result.to_json())
    else:
        events = {} if stored is None else {event.seq: event for event in stored.events}
        for line in erasure_lines(result, choice, events):
            out.write(line + "\n")
    if not dry_run and not result.proven:
        raise CommandError(f"erased, but it is not proven that no copy remains: {result.detail}")


def erasure_lines(result: Erasure, choice: Choice, events: Mapping[int, Event]) -> Iterator[str]:
    """What ``erase`` prints: the seqs (as ranges), in a dry run each event described (the
    first :data:`DETAILED`), the summaries erased with the events they cover, the seqs given
    but not erased, the other sessions, and what was proven.

    Args:
        result: what the store did, or would do.
        choice: how the arguments chose the events.
        events: the session's events by seq, to describe them (a dry run).
    """
    session = repr(result.session_id)
    if result.dry_run:
        yield f"would erase {len(result.erased)} events of {session}: {seq_ranges(result.erased)}"
        yield from _detail(result.erased, events)
    else:
        yield f"erased {len(result.erased)} events of {session}: {seq_ranges(result.erased)}"
    if result.summaries:
        cover = "cover" if result.dry_run else "covered"
        yield f"with them, the summaries that {cover} them: {seq_ranges(result.summaries)}"
    if choice.unmatched:
        yield f"not erased: {seq_ranges(choice.unmatched)} (not chosen by {choice.criteria})"
    if choice.unheld:
        yield (
            f"not erased: {seq_ranges(choice.unheld)} (no longer held by {session}: a snapshot"
            f" dropped them, so {choice.criteria} cannot be checked)"
        )
    if result.already:
        yield f"erased before: {seq_ranges(result.already)}"
    if result.absent:
        yield f"held nowhere any more (a snapshot dropped them): {seq_ranges(result.absent)}"
    if result.sessions:
        yield f"also in: {', '.join(repr(name) for name in result.sessions)}"
    if result.dry_run:
        yield "dry run: nothing was changed; pass --yes to erase"
    elif result.proven:
        yield f"proven: {result.detail}"


def _detail(seqs: Sequence[int], events: Mapping[int, Event]) -> Iterator[str]:
    """A table of the first :data:`DETAILED` events at ``seqs``: seq, type (a message's role),
    the message's name, and the start of its text; then how many more there are."""
    if not seqs:
        return
    rows = [(str(seq), *_describe(events.get(seq))) for seq in seqs[:DETAILED]]
    header = ("SEQ", "TYPE", "NAME", "TEXT")
    widths = [max(len(row[column]) for row in [header, *rows]) for column in range(3)]
    for row in [header, *rows]:
        seq, kind, name, text = row
        yield (f"  {seq:>{widths[0]}}  {kind:<{widths[1]}}  {name:<{widths[2]}}  {text}".rstrip())
    if len(seqs) > DETAILED:
        yield f"  ... and {len(seqs) - DETAILED} more (the first line lists them all)"


def _describe(event: Event | None) -> tuple[str, str, str]:
    """An event as a dry run shows it: its type (a message's role), the message's name, and
    the first :data:`TEXT_WIDTH` characters of what it says, on one line."""
    if event is None:
        return "?", "", "(held by another session, not this one)"
    if event.is_surface:
        message = to_message(event)
        kind, name, text = message.role.value, message.name or "", message_text(message)
        if event.op is not None:
            kind += " (replace)"  # one message over a range: an edit or a summary
    elif event.type is EventType.REPLACE:
        messages = [to_message(entry) for entry in replace_entries(event)]
        kind = "replace"
        name = ", ".join(dict.fromkeys(message.name for message in messages if message.name))
        text = " | ".join(message_text(message) for message in messages)
        if len(messages) != 1:
            text = f"({len(messages)} messages) {text}"
    else:
        kind, name = str(event.type), ""
        data = {key: value for key, value in event.data.items() if key != OP_KEY}
        text = dumps(data).decode() if data else ""
    return snippet(kind, 20), snippet(name, 20), snippet(text, TEXT_WIDTH)
