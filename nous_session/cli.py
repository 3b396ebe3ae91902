"""The ``nous-session`` command line: look inside stored sessions from the shell.

    nous-session [--store URL] sessions [--json]
    nous-session [--store URL] events SESSION [--since SEQ] [--json]
    nous-session [--store URL] messages SESSION [--as-of SEQ] [--json]
    nous-session [--store URL] tail SESSION [--since SEQ] [--json] [--interval SECONDS]
    nous-session [--store URL] export SESSION [--output FILE]
    nous-session [--store URL] snapshot SESSION [--vacuum]
    nous-session [--store URL] stats SESSION [--json]
    nous-session [--store URL] demo [--turns N] [--session ID]

Without ``--store`` the store is ``$NOUS_SESSION_STORE``, else the default SQLite file. Output is
for people by default and JSON (one object per line) with ``--json``. Errors are one line on
stderr and a non-zero exit status.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from contextlib import aclosing, suppress
from typing import Any, TextIO, TypeVar

import anyio
import orjson
import structlog

from nous_session.codec import to_json
from nous_session.errors import NousSessionError
from nous_session.event import Event
from nous_session.log import Log
from nous_session.message import Message
from nous_session.stores import Store, open_store
from nous_session.stores.base import VacuumingStore, supports
from nous_session.transcript import estimate_messages_tokens

__all__ = ["main"]

T = TypeVar("T")

_WIDTH = 96


class CommandError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nous-session",
        description="Inspect and maintain nous_session stores.",
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

    sessions = commands.add_parser("sessions", help="list the stored sessions")
    sessions.add_argument("--json", action="store_true", help="one JSON object per line")

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

    snapshot = commands.add_parser("snapshot", help="drop a session's shadowed events")
    snapshot.add_argument("session")
    snapshot.add_argument("--vacuum", action="store_true", help="then give the space back")
    snapshot.add_argument("--json", action="store_true", help="as one JSON object")

    stats = commands.add_parser("stats", help="figures about one session")
    stats.add_argument("session")
    stats.add_argument("--json", action="store_true", help="as one JSON object")

    demo = commands.add_parser("demo", help="run the demo conversation on the store")
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


_positive = _argument(float, lambda value: value > 0, "a number", "must be > 0")
_count = _argument(int, lambda value: value >= 1, "a whole number", "must be >= 1")
_seq = _argument(int, lambda value: value >= 0, "a seq", "a seq is >= 0")


def _emit(out: TextIO, value: Any) -> None:
    out.write(orjson.dumps(value, default=dict).decode())
    out.write("\n")


def _clip(text: str, width: int = _WIDTH) -> str:
    text = text.replace("\n", "⏎")
    return text if len(text) <= width else text[: width - 1] + "…"


def _event_line(event: Event) -> str:
    data = orjson.dumps(event.data, default=dict).decode()
    stamp = event.time.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return _clip(f"{event.seq:>6}  {stamp}  {event.type:<17}  {data}", 140)


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


async def _read(store: Store, session_id: str) -> Log:
    events = await store.load(session_id)
    if not events:
        raise CommandError(f"no session {session_id!r} in {getattr(store, 'url', 'the store')}")
    return Log.restore(events)


async def _sessions(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    infos = await store.sessions()
    if args.json:
        for info in infos:
            _emit(out, {"session_id": info.session_id, "count": info.count, "held": info.held})
        return
    if not infos:
        out.write(f"no sessions in {getattr(store, 'url', 'the store')}\n")
        return
    out.write(f"{'SESSION':<40} {'COUNT':>8} {'HELD':>8}\n")
    for info in infos:
        out.write(f"{_clip(info.session_id, 40):<40} {info.count:>8} {info.held:>8}\n")


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
        log = log.upto(args.as_of)
    for index, message in enumerate(log.derive_messages()):
        if args.json:
            _emit(out, _message_json(message))
        else:
            out.write(_message_line(index, message) + "\n")


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
    if args.output:
        lines = [orjson.dumps(to_json(e), option=orjson.OPT_APPEND_NEWLINE) for e in log.events()]
        await anyio.Path(args.output).write_bytes(b"".join(lines))
        sys.stderr.write(f"wrote {len(log.events())} events to {args.output}\n")
    else:
        for event in log.events():
            _emit(out, to_json(event))


async def _snapshot(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    from nous_session.actor import SessionActor

    before = await _read(store, args.session)
    async with SessionActor.open(session_id=args.session, store=store) as session:
        after = await session.snapshot()
    dropped = len(before.events()) - len(after.events())
    held = len(after.events())
    if args.vacuum:
        if not supports(store, VacuumingStore):
            raise CommandError("this store has nothing to vacuum")
        await store.vacuum()  # type: ignore[attr-defined]
    if args.json:
        _emit(
            out, {"dropped": dropped, "held": held, "count": after.count, "vacuumed": args.vacuum}
        )
        return
    out.write(f"dropped {dropped} shadowed events; {held} held, count {after.count}\n")
    if args.vacuum:
        out.write("vacuumed\n")


async def _stats(store: Store, args: argparse.Namespace, out: TextIO) -> None:
    log = await _read(store, args.session)
    events = log.events()
    surface = log.derive_messages()
    figures = {
        "session_id": args.session,
        "count": log.count,
        "held": len(events),
        "shadowed": len(log.shadowed()),
        "surface_messages": len(surface),
        "surface_tokens": estimate_messages_tokens(surface),
        "first": events[0].time.isoformat(),
        "last": events[-1].time.isoformat(),
        "types": dict(sorted(Counter(str(event.type) for event in events).items())),
    }
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


_CREATES = frozenset({"demo", "tail"})  # commands that may start from an empty store

_COMMANDS: dict[str, Callable[[Store, argparse.Namespace, TextIO], Awaitable[None]]] = {
    "sessions": _sessions,
    "events": _events,
    "messages": _messages,
    "tail": _tail,
    "export": _export,
    "snapshot": _snapshot,
    "stats": _stats,
    "demo": _demo,
}


async def _run(args: argparse.Namespace, out: TextIO) -> None:
    store = open_store(args.store)
    path = getattr(store, "path", None)
    # Reading commands never create a database: a mistyped path is an error, not a new file.
    if (
        args.command not in _CREATES
        and isinstance(path, str)
        and path != ":memory:"
        and not await anyio.Path(path).exists()
    ):
        await store.aclose()
        raise CommandError(f"no store file at {path}")
    try:
        await _COMMANDS[args.command](store, args, out)
    finally:
        await store.aclose()


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
        # A closed pipe (`| head`) ends the command quietly, as it does for any Unix tool.
        with suppress(AttributeError, ValueError):
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        anyio.run(_run, args, output)
    except KeyboardInterrupt:
        return 130 if args.command != "tail" else 0
    except (CommandError, NousSessionError, ValueError, OSError, ImportError) as error:
        sys.stderr.write(f"nous-session: error: {error}\n")
        return 1
    return 0
