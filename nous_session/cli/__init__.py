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
                                      (each message's index, and the seq erase takes)
    nous-session [--store URL] history SESSION [--json]
    nous-session [--store URL] export SESSION [--output FILE]
    nous-session [--store URL] tail SESSION [--since SEQ] [--json] [--interval SECONDS]
    nous-session [--store URL] copy [SESSION ...] --to URL [--json]
                                      (writes only to the --to store)

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
                 [--inherited] --reason TEXT [--yes] [--json]   (overwrites; dry run without --yes:
                                                                 it shows what it would erase)
    nous-session [--store URL] demo [--turns N] [--session ID]

Without ``--store`` the store is the one ``$NOUS_SESSION_STORE`` names, as in the library;
with neither, a command says how to name one (and lists the SQLite files in the working
directory), since a program given no store keeps its sessions in memory. ``demo`` writes
``nous_session_demo.sqlite3`` in the working directory. Output is
for people by default and JSON (one object per line) with ``--json``. Errors are one line on
stderr and exit status 1. Long work (export, import, snapshot) shows a progress bar on
stderr when it is a terminal and ``tqdm`` is installed (the ``cli`` extra). Lists of seqs
print as ranges (``1-5, 9, 12-200000``).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from pathlib import Path
from typing import TextIO

import anyio
import structlog

from nous_session.cli._changing import (
    copy_command,
    delete_command,
    demo_command,
    fork_command,
    import_command,
    remove_command,
    rewind_command,
    snapshot_command,
)
from nous_session.cli._common import CommandError
from nous_session.cli._erasing import erase_command
from nous_session.cli._parser import build_parser
from nous_session.cli._reading import (
    events_command,
    export_command,
    history_command,
    messages_command,
    metadata_command,
    retain_command,
    sessions_command,
    stats_command,
    tail_command,
)
from nous_session.errors import NousSessionError
from nous_session.stores import STORE_ENV, Store, open_store

__all__ = ["main"]


_Command = Callable[[Store, argparse.Namespace, TextIO], Awaitable[None]]
_READING: dict[str, _Command] = {
    "sessions": sessions_command,
    "events": events_command,
    "messages": messages_command,
    "history": history_command,
    "tail": tail_command,
    "export": export_command,
    "stats": stats_command,
    "copy": copy_command,  # reads its store; writes only the one --to names
}
# Read-only unless asked to write: a dry run and a look at metadata create nothing.
_SOMETIMES_WRITING: dict[str, tuple[_Command, Callable[[argparse.Namespace], bool]]] = {
    "metadata": (metadata_command, lambda args: args.set is not None or args.update is not None),
    "retain": (retain_command, lambda args: bool(args.yes)),
}
_WRITING: dict[str, _Command] = {
    "fork": fork_command,
    "rewind": rewind_command,
    "remove": remove_command,
    "import": import_command,
    "snapshot": snapshot_command,
    "delete": delete_command,
    "erase": erase_command,
    "demo": demo_command,
}


async def _run(args: argparse.Namespace, out: TextIO, interrupt: _Interrupt | None) -> None:
    reading = args.command in _READING
    command = (_READING if reading else _WRITING).get(args.command)
    if args.command in _SOMETIMES_WRITING:
        command, writes = _SOMETIMES_WRITING[args.command]
        reading = not writes(args)
    assert command is not None
    if args.store is None and not os.environ.get(STORE_ENV) and args.command != "demo":
        # Given none, the library keeps sessions in memory, which no other process can read.
        raise CommandError(
            "no store named: sessions are where a program put them, and one given no store"
            " keeps them in its memory; name the store with --store URL (after the verb or"
            f" before it) or in {STORE_ENV}, which the library reads too ({_sqlite_here()})"
        )
    # Reading never writes: a read-only store creates no file and no table, and refuses a
    # missing file or a database that is not a nous_session store.
    store = open_store(args.store, read_only=reading)
    missing = _missing_store(store) if reading else None
    if missing is not None:
        await store.aclose()
        raise CommandError(missing)
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


def _missing_store(store: Store) -> str | None:
    """What a reading command says when its SQLite file is missing (None when it is there):
    how to name a store, and the SQLite files in the working directory."""
    path = getattr(store, "path", None)
    if not isinstance(path, str) or path == ":memory:" or Path(path).is_file():
        return None
    return (
        f"no store file at {path}; name the store with --store URL (after the verb or"
        f" before it) or in {STORE_ENV} ({_sqlite_here()})"
    )


def _sqlite_here() -> str:
    """The SQLite files in the working directory, as store URLs (each read only as far as its
    16-byte header), or that there is none."""
    found = []
    for candidate in sorted(Path.cwd().iterdir()):
        if candidate.suffix not in (".sqlite3", ".sqlite", ".db") or not candidate.is_file():
            continue
        try:
            with candidate.open("rb") as file:
                if file.read(16) == b"SQLite format 3\x00":
                    found.append(f"sqlite:///{candidate.name}")
        except OSError:
            continue
    if not found:
        return "no SQLite file in this directory"
    return f"SQLite files in this directory: {', '.join(found[:10])}"


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
    args = build_parser().parse_args(argv)
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
        # One line, whatever the error holds, with its notes (how far a retention got).
        notes = "".join(f" ({note})" for note in getattr(error, "__notes__", ()))
        message = " ".join(f"{error}{notes}".split())
        sys.stderr.write(f"nous-session: error: {message}\n")
        return 1
    finally:
        if interrupt is not None:
            interrupt.close()
    return 0
