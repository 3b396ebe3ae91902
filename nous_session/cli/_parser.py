"""The command line's arguments: every verb and its options."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

from nous_session._json import loads
from nous_session.message import Role

T = TypeVar("T")

# The help of a verb's --json flag, by what it prints.
_JSON_LINES = "one JSON object per line"
_JSON_OBJECT = "as one JSON object"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nous-session",
        description="Inspect, audit and maintain nous_session stores.",
    )
    parser.add_argument(
        "--verbose", "-v", action="count", default=0, help="log more (-v info, -vv debug)"
    )
    store_help = (
        "memory:, sqlite:///path, or postgresql://... "
        "(default: the store $NOUS_SESSION_STORE names, as in the library)"
    )
    parser.add_argument("--store", metavar="URL", help=store_help)
    # The same option after the verb (`nous-session messages chat-42 --store URL`): every verb
    # takes it, and says so in its --help; given there, it wins over one given before the verb.
    after_verb = argparse.ArgumentParser(add_help=False)
    after_verb.add_argument("--store", metavar="URL", default=argparse.SUPPRESS, help=store_help)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_parser = commands.add_parser

    def verb(
        name: str, *, session: bool = False, json: str | None = None, **options: Any
    ) -> argparse.ArgumentParser:
        """A verb's parser: it takes --store, and its --help describes it (its one-line help
        as a sentence when it has no longer description); ``session``: it takes the session
        first, ``json``: it has a --json flag, with that help."""
        if "description" not in options and "help" in options:
            text = str(options["help"])
            options["description"] = text[:1].upper() + text[1:] + "."
        parsed = add_parser(name, parents=[after_verb], **options)
        if session:
            parsed.add_argument("session")
        if json is not None:
            parsed.add_argument("--json", action="store_true", help=json)
        return parsed

    sessions = verb(
        "sessions",
        help="list the stored sessions",
        description="List the stored sessions. Plain, every session by id with its counts; "
        "with --where, --tag, --order, --limit or --cursor, one page of the sessions that match, "
        "newest first, with their metadata and times, and the cursor of the next page.",
        json=_JSON_LINES,
    )
    _listing_arguments(sessions)
    sessions.add_argument(
        "--order", choices=("active", "created"), default=None, help="default: active"
    )
    sessions.add_argument("--ascending", action="store_true", help="oldest first")
    sessions.add_argument("--limit", type=_page_size, default=None, help="page size, 1..1000")
    sessions.add_argument("--cursor", default=None, help="the next page, as a page printed it")

    metadata = verb(
        "metadata",
        help="print a session's metadata, or change it (--set or --update: a metadata event)",
        session=True,
        json=_JSON_OBJECT,
    )
    changes = metadata.add_mutually_exclusive_group()
    changes.add_argument(
        "--set",
        dest="set",
        default=None,
        metavar="JSON",
        help="replace the whole record with this one (fields it leaves out are dropped)",
    )
    changes.add_argument(
        "--update",
        dest="update",
        default=None,
        metavar="JSON",
        help="change only the fields given (the others keep their values)",
    )

    retain = verb(
        "retain",
        help="delete or snapshot sessions idle or created long ago (a dry run without --yes)",
        description="Select the sessions idle for longer than --idle-for (no new events since) "
        "and/or created longer ago than --older-than, and delete them (the default) or snapshot "
        "them. Without --yes, list what would be done and how many, and change nothing. A "
        "session written to after the selection is kept.",
        json=_JSON_LINES,
    )
    retain.add_argument("--idle-for", default=None, metavar="DURATION", help="like 90d, 12h, 2w")
    retain.add_argument("--older-than", default=None, metavar="DURATION", help="like 365d")
    action = retain.add_mutually_exclusive_group()
    action.add_argument("--delete", dest="action", action="store_const", const="delete")
    action.add_argument("--snapshot", dest="action", action="store_const", const="snapshot")
    _listing_arguments(retain)
    retain.add_argument("--yes", action="store_true", help="really do it")

    events = verb("events", help="print a session's events", session=True, json=_JSON_LINES)
    events.add_argument("--since", type=_seq, default=0, metavar="SEQ")

    messages = verb(
        "messages",
        help="print the messages the model sees",
        description="Print the messages the model sees, in order: each one's INDEX on the "
        "surface (what `remove` takes), the SEQ of the event it comes from (what `erase` "
        "takes; the messages of a replace event, such as a summary, all show that event's "
        "seq), its role and its text. With --json, one object per message, its seq included.",
        session=True,
        json=_JSON_LINES,
    )
    messages.add_argument(
        "--as-of", type=_seq, default=None, metavar="SEQ", help="as they were when SEQ was newest"
    )

    verb(
        "history",
        help="the surface operations of a session, with their seqs and times",
        session=True,
        json=_JSON_LINES,
    )

    tail = verb(
        "tail", help="follow a live session until interrupted", session=True, json=_JSON_LINES
    )
    tail.add_argument("--since", type=_seq, default=None, metavar="SEQ", help="default: last 10")
    tail.add_argument(
        "--interval", type=_positive, default=0.2, help="poll interval in seconds (SQLite)"
    )

    export = verb("export", help="write a session's events as JSON lines", session=True)
    export.add_argument("--output", "-o", metavar="FILE", help="default: standard output")

    fork = verb(
        "fork",
        help="make a new session whose history is this one's up to a seq",
        description="Make NEW_SESSION a new, independent session whose history is SESSION's "
        "up to and including --at (default: all of it). The history is shared, not copied; "
        "the fork records its parent and fork point (see `sessions` and `history`).",
        session=True,
    )
    fork.add_argument("new_session")
    fork.add_argument("--at", type=_seq, default=None, metavar="SEQ", help="default: the newest")

    rewind = verb(
        "rewind",
        help="make the surface what it was at a seq (an event records it)",
        description="Make SESSION's surface what it was when TO_SEQ was its newest event "
        "(-1: empty). Nothing is deleted: a rewind event records it, the later history stays in "
        "the log, and another rewind (to the seq just before this one) brings it back.",
        session=True,
        json="print the rewind event as JSON",
    )
    rewind.add_argument("to", type=_rewind_target, metavar="TO_SEQ")

    remove = verb(
        "remove",
        help="take messages off the surface (an event records it)",
        description="Take the messages FIRST..LAST (the INDEX column of `messages`) off "
        "SESSION's surface. The events stay in the log; a remove event records the operation.",
        session=True,
        json="print the remove event as JSON",
    )
    remove.add_argument("first", type=_seq, metavar="FIRST")
    remove.add_argument("last", type=_seq, nargs="?", default=None, metavar="LAST")

    copy = verb(
        "copy",
        help="copy sessions to another store, as they are",
        description="Copy the sessions named (every session when none is) from the store to "
        "the one --to names: their events with their seqs and times, erasures, metadata, "
        "idempotency keys and what snapshots left, and forks as forks of their parent's copy "
        "when the parent comes too. A session the target holds already is skipped; each one "
        "is read back and compared. The store copied from is only read.",
        json=_JSON_OBJECT,
    )
    copy.add_argument("sessions", nargs="*", metavar="SESSION")
    copy.add_argument("--to", required=True, metavar="URL", help="the store to copy to")

    imported = verb(
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

    snapshot = verb(
        "snapshot",
        help="drop what a session's surface no longer needs",
        session=True,
        json=_JSON_OBJECT,
    )
    snapshot.add_argument("--yes", action="store_true", help="really drop them")
    snapshot.add_argument("--vacuum", action="store_true", help="then give the space back")

    delete = verb("delete", help="delete a session and its events", session=True)
    delete.add_argument("--yes", action="store_true", help="really delete it")

    erase = verb(
        "erase",
        help="erase events' content for good (a person's messages, or a whole session)",
        description="Replace the content of chosen events by a record of their erasure, in"
        " the session and in every fork holding them, and scrub the store's files or tables."
        " Choose them by SEQ (as `messages` and `events` print them), by --role and/or --name,"
        " by both (only those of the SEQs that --role/--name choose), or --all. Without --yes,"
        " only says what it would erase: each event's seq, type, name and the start of its"
        " text.",
        session=True,
        json=_JSON_OBJECT,
    )
    erase.add_argument(
        "seqs",
        nargs="*",
        type=_seq,
        metavar="SEQ",
        help="the events to erase (the SEQ column of `messages`, not its INDEX)",
    )
    erase.add_argument(
        "--role",
        choices=[role.value for role in Role],
        help="erase the messages of this role",
    )
    erase.add_argument("--name", help="erase the messages with this name (an author)")
    erase.add_argument(
        "--all",
        action="store_true",
        help="erase every event the session wrote itself (not with SEQs, --role or --name)",
    )
    erase.add_argument(
        "--inherited",
        action="store_true",
        help="with --all: also what a fork took from its parent (erased there too)",
    )
    erase.add_argument("--reason", required=True, help="why: recorded in every erased event")
    erase.add_argument("--yes", action="store_true", help="really erase")

    verb("stats", help="figures about one session", session=True, json=_JSON_OBJECT)

    demo = verb(
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
