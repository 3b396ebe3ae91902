"""Fault injection for the PostgreSQL store's tests: lost replies, killed backends, restarts.

Three tools, each independent of the test's event loop (they are plain threads and blocking
calls, so asyncio and trio tests use them alike, from a worker thread where they block):

* :class:`ReplyDroppingProxy`: a TCP proxy in front of PostgreSQL that can swallow the
  server's reply to the request that ends a transaction and cut the connection, so the
  transaction *is* committed on the server while the client never hears it. It can also cut
  every connection at once (a network failure).
* :func:`terminate_backends`: ``pg_terminate_backend`` for other backends of a database.
* :class:`PostgresServer`: a private, throwaway cluster that a test can stop and restart under
  a running client.

What the proxy understands of the wire protocol (v3, PostgreSQL's only one since 7.4):

* **Client to server.** The startup phase is untyped messages (int32 length including itself,
  int32 code, body). ``SSLRequest`` (code 80877103) and ``GSSENCRequest`` (80877104) are
  answered ``N`` by the proxy itself and never forwarded, so the conversation stays in clear
  text; ``CancelRequest`` (80877102) is forwarded and the connection is passed through
  unparsed from then on; a ``StartupMessage`` (protocol major 3) is forwarded and begins the
  typed phase. After that every message is one type byte, an int32 length including itself,
  and the body; the proxy reassembles messages across TCP chunks and forwards each one whole.
  It reads: ``Q`` (simple Query: its SQL), ``P`` (Parse: statement name and SQL), ``B``
  (Bind: portal to statement), ``E`` (Execute: a portal, hence a statement's SQL), ``C``
  (Close: forgets a statement or portal), and the messages that the server answers with
  exactly one ``ReadyForQuery``: ``Q``, ``S`` (Sync) and ``F`` (FunctionCall). Every such
  message, and the startup message, opens one *request*; requests are queued in order, so
  pipelined traffic (many Syncs in flight) is matched to its replies.
* **Server to client.** Always typed messages. A *reply* is every server message after the
  previous ``ReadyForQuery`` up to and including the next one (``Z``, whose one-byte body is
  the transaction status: ``I`` idle, ``T`` in a transaction, ``E`` in a failed one). The
  proxy collects ``CommandComplete`` tags (``C``, a NUL-terminated string such as
  ``INSERT 0 1``, ``SELECT 1``, ``COMMIT``) and notes ``ErrorResponse`` (``E``). A message
  that arrives while no request is outstanding (a notification to an idle ``LISTEN``
  connection, a FATAL error before the server closes) is forwarded at once. While a drop
  trigger is armed the proxy holds each reply back until its ``ReadyForQuery`` and then
  either forwards it whole or drops it whole (``CopyInResponse``/``CopyOutResponse``/
  ``CopyBothResponse`` are forwarded at once, since the client must see them to go on). While
  nothing is armed it forwards every message as soon as it is complete.

A statement is *data-modifying* when its SQL text, with string literals, quoted identifiers
and ``--``/``/* */`` comments blanked out and ``FOR [NO KEY] UPDATE`` and ``ON UPDATE`` /
``ON DELETE`` removed, still contains ``INSERT``, ``UPDATE``, ``DELETE`` or ``MERGE`` as a
whole word (case-insensitive). Writes hidden in functions are not seen; use
:meth:`ReplyDroppingProxy.drop_reply_matching` with a predicate of your own for those.
"""

from __future__ import annotations

import collections
import os
import re
import selectors
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = [
    "WRITE_TAGS",
    "PostgresServer",
    "Reply",
    "ReplyDroppingProxy",
    "is_data_modifying",
    "postgres_bindir",
    "postgres_unavailable",
    "terminate_backends",
]

T = TypeVar("T")

_SSL_REQUEST: Final = 80877103
_GSSENC_REQUEST: Final = 80877104
_CANCEL_REQUEST: Final = 80877102
_MAX_STARTUP: Final = 10_000  # the server's own limit on a startup packet
_COMMAND_TIMEOUT: Final = 10.0  # seconds the caller waits for the proxy thread to act

#: The first word of the last ``CommandComplete`` tag of a reply that can end a write
#: transaction (``SELECT`` because a data-modifying CTE, ``WITH ... INSERT ... SELECT``,
#: reports its final SELECT).
WRITE_TAGS: Final = frozenset({"INSERT", "UPDATE", "DELETE", "MERGE", "SELECT", "COMMIT"})

_BLANKED = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|/\*.*?\*/", re.DOTALL)
_NOT_WRITES = re.compile(r"\bFOR\s+(?:NO\s+KEY\s+)?UPDATE\b|\bON\s+(?:UPDATE|DELETE)\b", re.I)
_WRITES = re.compile(r"\b(?:INSERT|UPDATE|DELETE|MERGE)\b", re.IGNORECASE)


def is_data_modifying(statement: str) -> bool:
    """Whether the proxy counts ``statement`` as data-modifying (see the module docstring)."""
    text = _NOT_WRITES.sub(" ", _BLANKED.sub(" ", statement))
    return _WRITES.search(text) is not None


def _cstring(body: bytes, start: int = 0) -> tuple[str, int]:
    """The NUL-terminated string at ``start`` and the offset just past its NUL."""
    end = body.index(b"\0", start)
    return body[start:end].decode("utf-8", "replace"), end + 1


@dataclass(frozen=True)
class Reply:
    """One reply from the server, as the proxy saw it, handed to drop predicates.

    Attributes:
        connection: the proxy's number for the client connection (1, 2, ... in accept order).
        messages: every server message of the reply as ``(type, body)``, ReadyForQuery last.
        tags: the ``CommandComplete`` tags, in order (``("INSERT 0 1",)``, ``("COMMIT",)``).
        status: the ReadyForQuery status: ``"I"`` idle, ``"T"`` in a transaction, ``"E"``
            in a failed transaction.
        failed: the reply holds an ErrorResponse.
        statements: the SQL the client executed in the request this answers (empty for the
            startup reply or a FunctionCall).
        transaction: the SQL executed since the connection was last idle, this request's too.
        wrote: one of ``transaction`` is data-modifying (:func:`is_data_modifying`).
    """

    connection: int
    messages: tuple[tuple[str, bytes], ...]
    tags: tuple[str, ...]
    status: str
    failed: bool
    statements: tuple[str, ...]
    transaction: tuple[str, ...]
    wrote: bool

    @property
    def commits(self) -> bool:
        """It carries a ``CommandComplete`` whose tag is ``COMMIT`` (an explicit COMMIT or
        END that did commit; one that rolled back reports ``ROLLBACK``)."""
        return "COMMIT" in self.tags

    @property
    def ends_write_transaction(self) -> bool:
        """It closes a transaction that wrote: status ``I``, no error, the last tag's first
        word in :data:`WRITE_TAGS`, and a data-modifying statement in the transaction."""
        return (
            self.status == "I"
            and not self.failed
            and self.wrote
            and bool(self.tags)
            and self.tags[-1].split(" ", 1)[0] in WRITE_TAGS
        )


@dataclass
class _Request:
    statements: list[str] = field(default_factory=list)
    wrote: bool = False


@dataclass
class _Trigger:
    predicate: Callable[[Reply], bool]
    remaining: int


class _Protocol(Exception):
    """The peer broke the wire protocol's framing; the connection is closed."""


class _Connection:
    """One client connection and its upstream connection, with what the proxy tracks."""

    def __init__(self, number: int, client: socket.socket, server: socket.socket) -> None:
        self.number = number
        self.client = client
        self.server = server
        self.to_client = bytearray()
        self.to_server = bytearray()
        self.from_client = bytearray()
        self.from_server = bytearray()
        self.startup = True
        self.raw = False  # after a CancelRequest or an unknown startup code: no parsing
        self.closed = False
        self.statements: dict[str, tuple[str, bool]] = {}
        self.portals: dict[str, tuple[str, bool]] = {}
        self.request = _Request()  # extended-protocol messages since the last Sync
        self.requests: collections.deque[_Request] = collections.deque()
        self.transaction: list[str] = []
        self.wrote = False
        self.reply: list[tuple[str, bytes]] = []
        self.held = bytearray()  # the reply so far, while a trigger is armed
        self.startup_message = b""  # the client's StartupMessage (user, database, options)


class ReplyDroppingProxy:
    """A TCP proxy on 127.0.0.1 in front of a PostgreSQL server that can lose replies.

    ``ReplyDroppingProxy(target_url)`` listens on a free port at once and serves from its own
    daemon thread (one ``selectors`` loop for every connection) until :meth:`close`; use it as
    a context manager. Point clients at :attr:`url`: the target URL with host and port
    replaced (user, database and query kept). Each accepted connection opens its own
    connection to the target; if that is refused the client is closed at once.

    Modes (switch at any time, from any thread; a new trigger replaces the armed one):

    * :meth:`pass_through`: forward everything (the initial mode).
    * :meth:`drop_reply_matching` ``(predicate, n)``: for the next ``n`` replies for which
      ``predicate(reply)`` is true (see :class:`Reply`), forward nothing of the reply and
      close both sides of that connection; then back to pass-through.
    * :meth:`drop_after_commit` ``(n)``: the same for replies carrying ``CommandComplete``
      ``COMMIT`` (:attr:`Reply.commits`).
    * :meth:`drop_after_write` ``(n)``: the same for replies that end a write transaction
      (:attr:`Reply.ends_write_transaction`): an explicit COMMIT, a single autocommit
      INSERT/UPDATE/DELETE, a data-modifying CTE, a pipelined BEGIN ... COMMIT.
    * :meth:`cut_all`: close every current client connection (and its upstream).

    A reply is only dropped at its ReadyForQuery, after the server has finished the request,
    so a dropped COMMIT did commit. Predicates run on the proxy's thread: keep them quick; one
    that raises counts as false and is recorded in :attr:`errors`.

    Counters: :attr:`connections` (accepted so far), :attr:`open_connections`,
    :attr:`dropped` (replies dropped so far), :attr:`dropped_replies`, :attr:`cuts`
    (connections closed by :meth:`cut_all`); :attr:`errors` lists anything unexpected that
    happened on the proxy's thread (a test should find it empty).
    """

    def __init__(self, target_url: str) -> None:
        parts = urlsplit(target_url)
        if parts.scheme not in ("postgresql", "postgres") or not parts.hostname:
            raise ValueError(f"need a postgresql://host[:port]/... URL, got {target_url!r}")
        self.target: tuple[str, int] = (parts.hostname, parts.port or 5432)
        self._lock = threading.Lock()
        self._trigger: _Trigger | None = None
        self._connections: dict[int, _Connection] = {}
        self._accepted = 0
        self._dropped: list[Reply] = []
        self._cuts = 0
        self._errors: list[str] = []
        self._commands: collections.deque[tuple[Callable[[], Any], threading.Event, list[Any]]]
        self._commands = collections.deque()
        self._stopping = False
        self._released = False
        self._selector = selectors.DefaultSelector()
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._wake_reader, self._wake_writer = socket.socketpair()
        try:
            self._listener.bind(("127.0.0.1", 0))
            self._listener.listen(128)
            self._listener.setblocking(False)
            self._wake_reader.setblocking(False)
            self._wake_writer.setblocking(False)
            self._selector.register(self._listener, selectors.EVENT_READ, "accept")
            self._selector.register(self._wake_reader, selectors.EVENT_READ, "wake")
        except BaseException:
            self._release()
            raise
        self.port: int = self._listener.getsockname()[1]
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@127.0.0.1:{self.port}" if userinfo else f"127.0.0.1:{self.port}"
        self.url: str = urlunsplit(parts._replace(netloc=netloc))
        self._thread = threading.Thread(
            target=self._serve, name=f"ReplyDroppingProxy:{self.port}", daemon=True
        )
        self._thread.start()

    def __repr__(self) -> str:
        return f"<ReplyDroppingProxy 127.0.0.1:{self.port} -> {self.target[0]}:{self.target[1]}>"

    # Modes ------------------------------------------------------------------------------------

    def pass_through(self) -> None:
        """Disarm any trigger: forward everything from now on."""
        with self._lock:
            self._trigger = None

    def drop_reply_matching(self, predicate: Callable[[Reply], bool], n: int = 1) -> None:
        """Drop the next ``n`` replies for which ``predicate`` is true, cutting each one's
        connection; replaces any armed trigger."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        with self._lock:
            self._trigger = _Trigger(predicate, n)

    def drop_after_commit(self, n: int = 1) -> None:
        """Drop the reply carrying ``CommandComplete COMMIT`` of the next ``n`` transactions."""
        self.drop_reply_matching(lambda reply: reply.commits, n)

    def drop_after_write(self, n: int = 1) -> None:
        """Drop the reply that ends each of the next ``n`` write transactions (see
        :attr:`Reply.ends_write_transaction`)."""
        self.drop_reply_matching(lambda reply: reply.ends_write_transaction, n)

    def cut_all(self) -> int:
        """Close every current client connection and its upstream (a network failure);
        returns how many. New connections are accepted as before."""
        return self._call(self._cut_all)

    def stall_all(self, matching: bytes = b"") -> int:
        """Stop forwarding on every current connection (whose startup message contains
        ``matching``: an application name, say), in both directions, without closing either
        side (a silent drop: a NAT or firewall that forgot the flow sends no FIN or RST);
        returns how many. New connections are accepted and served as before; stalled ones
        stay open until the proxy closes."""
        return self._call(lambda: self._stall_all(matching))

    # Counters ---------------------------------------------------------------------------------

    @property
    def armed(self) -> int:
        """How many more replies the armed trigger will drop (0: passing through)."""
        with self._lock:
            return 0 if self._trigger is None else self._trigger.remaining

    @property
    def connections(self) -> int:
        with self._lock:
            return self._accepted

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._connections)

    @property
    def dropped(self) -> int:
        with self._lock:
            return len(self._dropped)

    @property
    def dropped_replies(self) -> list[Reply]:
        with self._lock:
            return list(self._dropped)

    @property
    def cuts(self) -> int:
        with self._lock:
            return self._cuts

    @property
    def errors(self) -> list[str]:
        with self._lock:
            return list(self._errors)

    # Lifecycle --------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the thread and close every socket. Idempotent."""
        if self._released:
            return
        if self._thread.is_alive():
            self._stopping = True
            self._wake()
            self._thread.join(_COMMAND_TIMEOUT)
            if self._thread.is_alive():  # pragma: no cover - a bug in the loop
                raise RuntimeError(f"{self!r}: the proxy thread did not stop")
        self._release()

    def __enter__(self) -> ReplyDroppingProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _release(self) -> None:
        self._released = True
        for connection in list(self._connections.values()):
            self._close(connection)
        self._selector.close()
        for sock in (self._listener, self._wake_reader, self._wake_writer):
            sock.close()

    # The proxy's thread -----------------------------------------------------------------------

    def _wake(self) -> None:
        with suppress(OSError):  # closed, or full: a wake-up is pending anyway
            self._wake_writer.send(b"\0")

    def _call(self, function: Callable[[], T]) -> T:
        """Run ``function`` on the proxy's thread (which owns the sockets) and return its
        result."""
        if threading.current_thread() is self._thread:
            return function()
        if not self._thread.is_alive():
            raise RuntimeError(f"{self!r} is closed")
        done = threading.Event()
        box: list[Any] = []
        self._commands.append((function, done, box))
        self._wake()
        if not done.wait(_COMMAND_TIMEOUT):  # pragma: no cover - a bug in the loop
            raise TimeoutError(f"{self!r}: the proxy thread did not answer")
        if box and isinstance(box[0], BaseException):
            raise box[0]
        return box[1]  # type: ignore[no-any-return]

    def _serve(self) -> None:
        try:
            while not self._stopping:
                for key, mask in self._selector.select():
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        self._run_commands()
                    else:
                        connection, side = key.data
                        self._ready(connection, side, mask)
        except BaseException as error:  # pragma: no cover - a bug in the loop
            self._record(error)
        finally:
            for connection in list(self._connections.values()):
                self._close(connection)
            self._run_commands()

    def _run_commands(self) -> None:
        with suppress(OSError):
            while self._wake_reader.recv(4096):
                pass
        while self._commands:
            function, done, box = self._commands.popleft()
            try:
                box[:] = [None, function()]
            except BaseException as error:  # handed back to the caller
                box[:] = [error]
            done.set()

    def _record(self, error: BaseException) -> None:
        with self._lock:
            self._errors.append(f"{type(error).__name__}: {error}")

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        with self._lock:
            self._accepted += 1
            number = self._accepted
        try:
            server = socket.create_connection(self.target, timeout=5)
        except OSError:
            client.close()  # the server is down: the client sees the connection close
            return
        try:
            for sock in (client, server):
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:  # the client has gone already
            client.close()
            server.close()
            return
        connection = _Connection(number, client, server)
        with self._lock:
            self._connections[number] = connection
        self._selector.register(client, selectors.EVENT_READ, (connection, "client"))
        self._selector.register(server, selectors.EVENT_READ, (connection, "server"))

    def _ready(self, connection: _Connection, side: str, mask: int) -> None:
        if connection.closed:
            return
        try:
            if mask & selectors.EVENT_WRITE:
                self._flush(connection, side)
            if mask & selectors.EVENT_READ and not connection.closed:
                sock = connection.client if side == "client" else connection.server
                try:
                    data = sock.recv(65536)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError:
                    data = b""
                if not data:
                    self._peer_closed(connection, side)
                elif side == "client":
                    connection.from_client += data
                    self._from_client(connection)
                else:
                    connection.from_server += data
                    self._from_server(connection)
        except _Protocol as error:
            self._record(error)
            self._close(connection)
        except OSError:
            self._close(connection)
        except Exception as error:  # a bug: keep serving the other connections
            self._record(error)
            self._close(connection)

    def _peer_closed(self, connection: _Connection, side: str) -> None:
        """One side hung up: hand the other what it is owed (best effort), then close."""
        if side == "server":
            connection.to_client += connection.held
            connection.held.clear()
        with suppress(OSError):
            if side == "client" and connection.to_server:
                connection.server.send(connection.to_server)
            if side == "server" and connection.to_client:
                connection.client.send(connection.to_client)
        self._close(connection)

    def _send(self, connection: _Connection, side: str, data: bytes | bytearray) -> None:
        if not data or connection.closed:
            return
        buffer = connection.to_client if side == "client" else connection.to_server
        buffer += data
        self._flush(connection, side)

    def _flush(self, connection: _Connection, side: str) -> None:
        sock, buffer = (
            (connection.client, connection.to_client)
            if side == "client"
            else (connection.server, connection.to_server)
        )
        if buffer:
            try:
                sent = sock.send(buffer)
            except (BlockingIOError, InterruptedError):
                sent = 0
            del buffer[:sent]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if buffer else 0)
        if self._selector.get_key(sock).events != events:
            self._selector.modify(sock, events, (connection, side))

    def _close(self, connection: _Connection) -> None:
        if connection.closed:
            return
        connection.closed = True
        for sock in (connection.client, connection.server):
            with suppress(OSError, KeyError):  # KeyError: stalled, no longer registered
                self._selector.unregister(sock)
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        with self._lock:
            self._connections.pop(connection.number, None)

    def _stall_all(self, matching: bytes) -> int:
        connections = [
            connection
            for connection in self._connections.values()
            if matching in connection.startup_message
        ]
        for connection in connections:
            for sock in (connection.client, connection.server):
                with suppress(OSError, KeyError):
                    self._selector.unregister(sock)
        return len(connections)

    def _cut_all(self) -> int:
        connections = list(self._connections.values())
        for connection in connections:
            self._close(connection)
        with self._lock:
            self._cuts += len(connections)
        return len(connections)

    # Client to server -------------------------------------------------------------------------

    def _from_client(self, connection: _Connection) -> None:
        buffer = connection.from_client
        while buffer and not connection.closed:
            if connection.raw:
                self._send(connection, "server", bytes(buffer))
                buffer.clear()
            elif connection.startup:
                if len(buffer) < 8:
                    return
                length, code = struct.unpack_from("!ii", buffer)
                if not 8 <= length <= _MAX_STARTUP:
                    raise _Protocol(f"connection {connection.number}: startup length {length}")
                if len(buffer) < length:
                    return
                message = bytes(buffer[:length])
                del buffer[:length]
                if code in (_SSL_REQUEST, _GSSENC_REQUEST):
                    self._send(connection, "client", b"N")  # no encryption: we must read it
                    continue
                self._send(connection, "server", message)
                if code >> 16 == 3:
                    connection.startup = False
                    connection.startup_message = message
                    connection.requests.append(_Request())  # answered by the first Z
                else:  # CancelRequest, or a protocol we do not speak: pass it through
                    connection.raw = True
            else:
                if len(buffer) < 5:
                    return
                (length,) = struct.unpack_from("!i", buffer, 1)
                if length < 4:
                    raise _Protocol(f"connection {connection.number}: message length {length}")
                if len(buffer) < 1 + length:
                    return
                kind = chr(buffer[0])
                body = bytes(buffer[5 : 1 + length])
                message = bytes(buffer[: 1 + length])
                del buffer[: 1 + length]
                self._observe_client(connection, kind, body)
                self._send(connection, "server", message)

    @staticmethod
    def _observe_client(connection: _Connection, kind: str, body: bytes) -> None:
        if kind == "Q":
            statement, _ = _cstring(body)
            connection.requests.append(_Request([statement], is_data_modifying(statement)))
        elif kind == "P":
            name, offset = _cstring(body)
            statement, _ = _cstring(body, offset)
            connection.statements[name] = (statement, is_data_modifying(statement))
        elif kind == "B":
            portal, offset = _cstring(body)
            name, _ = _cstring(body, offset)
            connection.portals[portal] = connection.statements.get(name, ("", False))
        elif kind == "E":
            portal, _ = _cstring(body)
            statement, wrote = connection.portals.get(portal, ("", False))
            connection.request.statements.append(statement)
            connection.request.wrote = connection.request.wrote or wrote
        elif kind == "C" and body[:1] in (b"S", b"P"):
            name, _ = _cstring(body, 1)
            (connection.statements if body[:1] == b"S" else connection.portals).pop(name, None)
        elif kind in ("S", "F"):
            connection.requests.append(connection.request)
            connection.request = _Request()

    # Server to client -------------------------------------------------------------------------

    def _from_server(self, connection: _Connection) -> None:
        buffer = connection.from_server
        while len(buffer) >= 5 and not connection.closed:
            (length,) = struct.unpack_from("!i", buffer, 1)
            if length < 4:
                raise _Protocol(f"connection {connection.number}: server message length {length}")
            if len(buffer) < 1 + length:
                return
            kind = chr(buffer[0])
            body = bytes(buffer[5 : 1 + length])
            message = bytes(buffer[: 1 + length])
            del buffer[: 1 + length]
            self._observe_server(connection, kind, body, message)

    def _observe_server(
        self, connection: _Connection, kind: str, body: bytes, message: bytes
    ) -> None:
        if not connection.requests:  # asynchronous: a notification, a notice, a FATAL error
            self._send(connection, "client", message)
            return
        connection.reply.append((kind, body))
        if self._trigger is not None and kind not in ("G", "H", "W"):
            connection.held += message
        else:
            connection.held += message
            self._send(connection, "client", connection.held)
            connection.held.clear()
        if kind == "Z":
            self._end_of_reply(connection, body)

    def _end_of_reply(self, connection: _Connection, body: bytes) -> None:
        request = connection.requests.popleft()
        connection.transaction.extend(request.statements)
        connection.wrote = connection.wrote or request.wrote
        reply = Reply(
            connection=connection.number,
            messages=tuple(connection.reply),
            tags=tuple(_cstring(b)[0] for k, b in connection.reply if k == "C"),
            status=body[:1].decode("ascii", "replace"),
            failed=any(k == "E" for k, _ in connection.reply),
            statements=tuple(request.statements),
            transaction=tuple(connection.transaction),
            wrote=connection.wrote,
        )
        connection.reply = []
        if reply.status == "I":
            connection.transaction = []
            connection.wrote = False
        if self._should_drop(reply):
            connection.held.clear()
            with suppress(OSError):  # earlier replies still owed to the client
                if connection.to_client:
                    connection.client.send(connection.to_client)
            self._close(connection)
        else:
            self._send(connection, "client", connection.held)
            connection.held.clear()

    def _should_drop(self, reply: Reply) -> bool:
        trigger = self._trigger
        if trigger is None:
            return False
        try:
            matches = trigger.predicate(reply)
        except Exception as error:
            self._record(error)
            return False
        if not matches:
            return False
        with self._lock:
            if self._trigger is not trigger or trigger.remaining <= 0:
                return False  # re-armed or disarmed meanwhile
            trigger.remaining -= 1
            if trigger.remaining == 0:
                self._trigger = None
            self._dropped.append(reply)
        return True


# Backends -------------------------------------------------------------------------------------


def _libpq_url(url: str) -> str:
    """``url`` without nous_session's own ``schema=`` parameter, which libpq refuses."""
    parts = urlsplit(url)
    query = [(key, value) for key, value in parse_qsl(parts.query) if key != "schema"]
    return urlunsplit(parts._replace(query=urlencode(query)))


def terminate_backends(
    url: str,
    application_name: str | None = None,
    *,
    timeout: float = 10.0,
    slow_ok: bool = False,
) -> int:
    """``pg_terminate_backend`` every other client backend of ``url``'s database.

    Only client backends (never autovacuum or other background workers) connected to the same
    database, other than the one this function uses; with ``application_name``, only those
    whose ``application_name`` is exactly that (nous_session's pool uses ``nous_session``, its
    listener ``nous_session listener``). Waits, up to ``timeout`` seconds for each, until
    every one has exited (``pg_terminate_backend(pid, timeout)``, PostgreSQL 14+), so the
    next query on a terminated connection fails. Returns how many were terminated; raises
    RuntimeError if one did not exit in time, unless ``slow_ok`` (a killer that goes on
    killing: the backend was signalled, and exits when the server gets to it; on a loaded
    machine that has taken longer than ten seconds).

    Needs psycopg; ``url`` may carry nous_session's ``schema=`` parameter.
    """
    import psycopg

    with psycopg.connect(_libpq_url(url), autocommit=True) as connection:
        rows = connection.execute(
            """SELECT pid, pg_terminate_backend(pid, %(timeout)s) FROM pg_stat_activity
               WHERE datname = current_database() AND pid <> pg_backend_pid()
               AND backend_type = 'client backend'
               AND (%(name)s::text IS NULL OR application_name = %(name)s::text)""",
            {"timeout": int(timeout * 1000), "name": application_name},
        ).fetchall()
    stuck = [pid for pid, gone in rows if not gone]
    if stuck and not slow_ok:
        raise RuntimeError(f"backends {stuck} did not exit within {timeout}s")
    return len(rows)


# A private server -----------------------------------------------------------------------------


def postgres_bindir() -> Path | None:
    """The directory of PostgreSQL's server binaries (``initdb``, ``pg_ctl``, ``createdb``):
    ``$NOUS_PGBIN``, else the newest ``/usr/lib/postgresql/*/bin``, else ``pg_ctl`` on the
    PATH; None when there is none."""
    candidates: list[Path] = []
    if os.environ.get("NOUS_PGBIN"):
        candidates.append(Path(os.environ["NOUS_PGBIN"]))
    versions = [p for p in Path("/usr/lib/postgresql").glob("*/bin") if p.parent.name.isdigit()]
    candidates += sorted(versions, key=lambda p: int(p.parent.name), reverse=True)
    on_path = shutil.which("pg_ctl")
    if on_path:
        candidates.append(Path(on_path).parent)
    for candidate in candidates:
        if all((candidate / name).is_file() for name in ("initdb", "pg_ctl", "createdb")):
            return candidate
    return None


def postgres_unavailable() -> str | None:
    """Why :class:`PostgresServer` cannot run here, or None when it can."""
    if postgres_bindir() is None:
        return "no PostgreSQL server binaries (initdb, pg_ctl); set NOUS_PGBIN"
    if os.geteuid() == 0:
        import pwd

        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres OS user to run the server"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PostgresServer:
    """A private PostgreSQL cluster in a temporary directory, on 127.0.0.1 and a free port.

    ``with PostgresServer() as server:`` runs ``initdb`` (trust authentication, superuser
    ``postgres``), starts the server with ``pg_ctl start -w`` (listening on 127.0.0.1 only,
    its Unix socket in the temporary directory, ``fsync=off``: a test server), creates the
    database ``database`` and yields; on exit it stops the server (``-m immediate``) and
    deletes the directory. When running as root, every server command runs as the ``postgres``
    OS user (PostgreSQL refuses root), as ``.ci/postgres`` does.

    :meth:`stop` and :meth:`restart` take a ``pg_ctl`` shutdown mode: ``fast`` (the default:
    backends are terminated, a shutdown checkpoint is written) or ``immediate`` (a crash:
    recovery replays the WAL at the next start). The port, hence :attr:`url`, stays the same
    across restarts, so a client (a store, a pool, a :class:`ReplyDroppingProxy`) keeps its
    URL and reconnects to the new server. Every call blocks until the server is up or down;
    from async code run it in a worker thread (``anyio.to_thread.run_sync``).
    """

    def __init__(
        self,
        *,
        database: str = "nous_test",
        bindir: Path | None = None,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        found = bindir or postgres_bindir()
        if found is None:
            raise RuntimeError(postgres_unavailable() or "no PostgreSQL binaries")
        self.bindir = found
        self.database = database
        self.settings = {"fsync": "off", "max_connections": "100", **(settings or {})}
        self.port = 0
        self.directory: Path | None = None
        self.running = False
        self._created = False

    @property
    def url(self) -> str:
        if not self.port:
            raise RuntimeError("the server has not been started")
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.database}"

    @property
    def data(self) -> Path:
        if self.directory is None:
            raise RuntimeError("the server has not been started")
        return self.directory / "data"

    def log(self) -> str:
        """The server's log so far (for a failing test's message)."""
        if self.directory is None:
            return ""
        path = self.directory / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _run(self, *args: str, as_server: bool = True) -> None:
        extra: dict[str, Any] = {}
        if as_server and os.geteuid() == 0:
            extra = {"user": "postgres", "group": "postgres", "extra_groups": []}
        command = [str(self.bindir / args[0]), *args[1:]]
        result = subprocess.run(
            command,
            cwd=self.directory,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            **extra,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}"
                f"{result.stderr}\n{self.log()[-4000:]}"
            )

    def start(self) -> None:
        """Create the cluster on first use, then start the server and wait until it accepts
        connections. A no-op when it runs."""
        if self.running:
            return
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="nous-faultkit-pg-"))
            if os.geteuid() == 0:
                shutil.chown(self.directory, "postgres", "postgres")
            self._run(
                "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust",
                "-E", "UTF8", "--locale=C", "--no-sync",
            )  # fmt: skip
        attempts = 1 if self.port else 5  # a first start may lose its free port to a race
        for attempt in range(attempts):
            port = self.port or _free_port()
            options = f"-c listen_addresses=127.0.0.1 -p {port} -k {self.directory}"
            options += "".join(f" -c {name}={value}" for name, value in self.settings.items())
            try:
                self._run(
                    "pg_ctl", "-D", str(self.data), "-l", str(self.directory / "server.log"),
                    "-w", "-t", "60", "-o", options, "start",
                )  # fmt: skip
            except RuntimeError:
                if attempt == attempts - 1:
                    raise
                continue
            self.port = port
            break
        self.running = True
        if not self._created:
            self._run(
                "createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                self.database, as_server=False,
            )  # fmt: skip
            self._created = True

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``pg_ctl stop -m mode -w``): ``smart``, ``fast`` or ``immediate``.
        A no-op when it is not running."""
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"mode must be smart, fast or immediate, got {mode!r}")
        if not self.running:
            return
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")
        self.running = False

    def restart(self, mode: str = "fast") -> None:
        """Stop (``mode``) and start again on the same port; returns once it accepts
        connections."""
        self.stop(mode)
        self.start()

    def close(self) -> None:
        """Stop the server if it runs and delete its directory. Idempotent."""
        try:
            self.stop("immediate")
        finally:
            if self.directory is not None:
                shutil.rmtree(self.directory, ignore_errors=True)
                self.directory = None

    def __enter__(self) -> PostgresServer:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
