"""Encryption at rest and crypto-erasure, on SQLite and PostgreSQL
(``NOUS_SESSION_TEST_POSTGRES``; the page scan needs ``pageinspect``), on asyncio and trio."""

from __future__ import annotations

import base64
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from nous_session import (
    CorruptRecordError,
    Encryption,
    EventType,
    KeyProvider,
    LocalKeyFile,
    Message,
    SessionActor,
    StoreError,
    ToolCall,
    open_store,
)
from nous_session.encryption import rewrap
from nous_session.erasure import ERASED_CONTENT
from nous_session.stores.sqlite import SQLiteStore
from tests.support.erasure import _pages

pytestmark = pytest.mark.anyio

POSTGRES_URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES")
AAD = b"nous_session/v1"


class Backend:
    """An encrypting store under test: how to make one (with any encryption), and how to
    read its raw rows, keys and bytes."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.path = tmp_path / "enc.sqlite3"
        self.schema = f"x_{uuid.uuid4().hex[:12]}"
        self.provider = LocalKeyFile.create(tmp_path / "master.key")

    def make(self, encryption: Encryption | str | None = "default") -> Any:
        chosen = Encryption(self.provider) if encryption == "default" else encryption
        assert not isinstance(chosen, str)
        if self.kind == "sqlite":
            return SQLiteStore(self.path, encryption=chosen)
        from nous_session.stores.postgres import PostgresStore

        assert POSTGRES_URL is not None
        return PostgresStore(POSTGRES_URL, schema=self.schema, max_size=4, encryption=chosen)

    def query(self, statement: str, parameters: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run SQL on the store's tables (``{t}`` is the table prefix: the schema on PG)."""
        if self.kind == "sqlite":
            with closing(sqlite3.connect(self.path)) as connection:
                found = connection.execute(statement.format(t=""), parameters).fetchall()
                connection.commit()
                return found
        import psycopg

        assert POSTGRES_URL is not None
        with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
            cursor = connection.execute(
                statement.format(t=f"{self.schema}.").replace("?", "%s"),  # type: ignore[arg-type]
                parameters,
            )
            return cursor.fetchall() if cursor.description else []

    def record(self, session: str, seq: int) -> bytes:
        """The raw stored record of an event (the session's own row)."""
        column = "sid = (SELECT id FROM {t}nous_sessions WHERE name = ?)"
        if self.kind == "postgres":
            column = "session = ?"
        (found,) = self.query(
            f"SELECT record FROM {{t}}nous_events WHERE {column} AND seq = ?", (session, seq)
        )
        return bytes(found[0])

    def data_keys(self) -> list[tuple[bytes, str, bytes]]:
        return [
            (bytes(kid), name, bytes(wrapped))
            for kid, name, wrapped in self.query(
                "SELECT kid, provider, wrapped FROM {t}nous_data_keys"
            )
        ]

    def holders(self) -> set[tuple[bytes, str]]:
        """The key holders table: (kid, session name)."""
        if self.kind == "sqlite":
            found = self.query(
                "SELECT h.kid, s.name FROM nous_key_holders h"
                " LEFT JOIN nous_sessions s ON s.id = h.sid"
            )
        else:
            found = self.query("SELECT kid, session FROM {t}nous_key_holders")
        return {(bytes(kid), name) for kid, name in found}

    def sealed_rows(self) -> set[tuple[bytes, str]]:
        """(kid, session name) of every sealed row in the events and kept tables, from the
        records' own headers; asserts each row's kid column says the same."""
        found: set[tuple[bytes, str]] = set()
        for table in ("nous_events", "nous_kept"):
            if self.kind == "sqlite":
                rows = self.query(
                    f"SELECT s.name, t.record, t.kid FROM {table} t"
                    " LEFT JOIN nous_sessions s ON s.id = t.sid"
                )
            else:
                rows = self.query(f"SELECT session, record, kid FROM {{t}}{table}")
            for name, record, kid in rows:
                record = bytes(record)
                if record[0] == 1:
                    assert kid is not None, (table, name)
                    assert bytes(kid) == record[1:17], (table, name)
                    found.add((record[1:17], name))
                else:
                    assert kid is None
        return found

    def raw_hits(self, needle: bytes) -> int:
        """How often ``needle`` is in the store's raw bytes (files, or table pages)."""
        if self.kind == "sqlite":
            return sum(
                Path(f"{self.path}{suffix}").read_bytes().count(needle)
                for suffix in ("", "-wal")
                if Path(f"{self.path}{suffix}").exists()
            )
        return sum(_pages(self.schema, needle).values())

    def hits(self, text: str) -> int:
        """How often ``text`` is in the store's raw bytes (files, or table pages)."""
        return self.raw_hits(text.encode())

    def drop(self) -> None:
        if self.kind == "postgres":
            import psycopg

            assert POSTGRES_URL is not None
            with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
                connection.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    if request.param == "postgres":
        if not POSTGRES_URL:
            pytest.skip("no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES")
        pytest.importorskip("psycopg")
    made = Backend(request.param, tmp_path)
    yield made
    made.drop()


def _secret() -> str:
    return f"SECRET-{uuid.uuid4().hex}"


def _opens(ciphertext: bytes, seq: int, key: bytes) -> bool:
    """Whether a sealed record opens under the data key ``key``."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        AESGCM(key).decrypt(ciphertext[17:29], ciphertext[29:], AAD + seq.to_bytes(8, "big"))
    except InvalidTag:
        return False
    return True


async def _chat(store: Any, session_id: str, secret: str, *, summary: bool = True) -> list[Any]:
    """A session of every kind of event, with ``secret`` in one user message (at seq 1), and
    a summary over it (unless not ``summary``); its events."""
    call = ToolCall("call-1", "lookup", {"query": "weather"})
    async with SessionActor.open(session_id=session_id, store=store) as session:
        await session.add_message(Message.system("be brief"))
        await session.add_message(Message.user(f"my code is {secret}", name="alice"))
        await session.add_message(Message.assistant("checking", tool_calls=(call,)))
        await session.add_message(Message.tool("call-1", {"celsius": 18}, name="lookup"))
        await session.add_message(Message.assistant("18C"))
        if summary:
            first = session.log.surface()[1].position
            await session.replace(first, first + 1, Message.system("[summary] asked, checked"))
        return list(session.log.events())


# Writing and reading --------------------------------------------------------------------------


async def test_a_round_trip_reads_back_every_event_and_no_text_is_in_the_raw_bytes(
    backend: Backend, store: Any
) -> None:
    secret = _secret()
    written = await _chat(store, "s", secret)
    assert list(await store.load("s")) == written
    assert list(await store.load("s", since=3)) == written[3:]
    assert list((await store.read("s")).events) == written
    # Every row is sealed, under the session's key, and says so in its kid column.
    (kid,) = {kid for (kid,) in backend.query("SELECT kid FROM {t}nous_sessions")}
    assert kid is not None
    for event in written:
        record = backend.record("s", event.seq)
        assert record[0] == 1
        assert record[1:17] == bytes(kid)
    assert [bytes(k) for (k,) in backend.query("SELECT DISTINCT kid FROM {t}nous_events")] == [
        bytes(kid)
    ]
    # The text is in none of the store's bytes; the session's records are (the scan sees them).
    await store.aclose()
    assert backend.hits(secret) == 0
    assert backend.hits("lookup") == 0
    reopened = backend.make()
    async with reopened, SessionActor.open(session_id="s", store=reopened) as session:
        assert list(session.log.events()) == written


async def test_a_plain_store_is_read_and_written_on_in_sealed_records(backend: Backend) -> None:
    plain_secret, sealed_secret = _secret(), _secret()
    async with backend.make(None) as plain:
        before = await _chat(plain, "old", plain_secret)
    async with backend.make() as store:
        assert list(await store.load("old")) == before
        async with SessionActor.open(session_id="old", store=store) as session:
            added = await session.add_message(Message.user(sealed_secret))
        assert backend.record("old", 0)[:1] == b"["  # plain as it was
        assert backend.record("old", added.seq)[0] == 1
        assert list(await store.load("old")) == [*before, added]
    assert backend.hits(plain_secret) > 0  # the scan sees plain text
    assert backend.hits(sealed_secret) == 0


async def test_an_encrypted_store_opened_without_encryption_says_it_needs_it(
    backend: Backend, store: Any
) -> None:
    await _chat(store, "s", _secret())
    async with backend.make(None) as plain:
        with pytest.raises(
            CorruptRecordError, match="encrypted: open the store with its encryption"
        ):
            await plain.load("s")
        with pytest.raises(CorruptRecordError, match="encrypted"):
            async with SessionActor.open(session_id="s", store=plain):
                pass
        if backend.kind == "sqlite":
            # Nor does it write plain text into the encrypted session.
            with pytest.raises(StoreError, match="encrypted"):
                await plain.commit("s", expected_count=6, events=[_event(6)])
    assert len(await store.load("s")) == 6


def _event(seq: int) -> Any:
    from datetime import UTC, datetime

    from nous_session.event import EventType, make_event

    return make_event(seq, EventType.USER_MESSAGE, {"content": "x"}, datetime.now(UTC))


async def test_another_master_key_or_a_damaged_one_is_a_clear_error(
    backend: Backend, store: Any, tmp_path: Path
) -> None:
    written = await _chat(store, "s", _secret())
    other = LocalKeyFile.create(tmp_path / "other.key")
    async with backend.make(Encryption(other)) as wrong:
        with pytest.raises(StoreError, match=f"master key {backend.provider.name!r}.*not given"):
            await wrong.load("s")

    class Impostor:
        """Claims the right name, holds another key."""

        name = backend.provider.name

        def wrap(self, key: bytes) -> bytes:
            return other.wrap(key)

        def unwrap(self, wrapped: bytes) -> bytes:
            return other.unwrap(wrapped)

    assert isinstance(Impostor(), KeyProvider)
    async with backend.make(Encryption(Impostor())) as damaged:
        with pytest.raises(StoreError, match="could not unwrap"):
            await damaged.load("s")
    assert list(await store.load("s")) == written


def test_key_files_are_made_once_private_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "k"
    made = LocalKeyFile.create(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert len(base64.b64decode(path.read_bytes())) == 32
    assert LocalKeyFile(path).name == made.name
    assert made.name.startswith("local:")
    assert base64.b64encode(made._key).decode() not in repr(made)
    assert made.unwrap(made.wrap(b"k" * 32)) == b"k" * 32
    with pytest.raises(FileExistsError, match="never overwritten"):
        LocalKeyFile.create(path)
    with pytest.raises(FileNotFoundError, match=r"LocalKeyFile\.create"):
        LocalKeyFile(tmp_path / "missing")
    short = tmp_path / "short"
    short.write_bytes(base64.b64encode(b"x" * 16))
    short.chmod(0o600)
    with pytest.raises(ValueError, match="holds 16 bytes"):
        LocalKeyFile(short)
    garbage = tmp_path / "garbage"
    garbage.write_text("not base64 !")
    garbage.chmod(0o600)
    with pytest.raises(ValueError, match="base64"):
        LocalKeyFile(garbage)
    path.chmod(0o644)
    with pytest.raises(ValueError, match="readable by every user"):
        LocalKeyFile(path)
    path.chmod(0o640)
    assert LocalKeyFile(path).name == made.name  # a group may read it
    with pytest.raises(ValueError, match="cannot unwrap"):
        LocalKeyFile.create(tmp_path / "k2").unwrap(made.wrap(b"k" * 32))
    with pytest.raises(TypeError, match="key provider"):
        Encryption(object())  # type: ignore[arg-type]


def test_importing_needs_no_cryptography_and_using_it_without_says_how_to_install() -> None:
    script = (
        "import sys\n"
        "import nous_session, nous_session.encryption, nous_session.stores.sqlite\n"
        "assert 'cryptography' not in sys.modules, 'imported cryptography'\n"
        "sys.modules['cryptography'] = None\n"
        "from nous_session import Encryption, LocalKeyFile\n"
        "try:\n"
        "    LocalKeyFile.create(sys.argv[1])\n"
        "except ImportError as error:\n"
        "    print(error)\n"
    )
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"never-{uuid.uuid4().hex}.key"
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, check=True
    )
    assert "pip install 'nous_session[crypto]'" in done.stdout, done.stdout + done.stderr
    assert not path.exists()


async def test_a_memory_store_takes_no_encryption(tmp_path: Path) -> None:
    encryption = Encryption(LocalKeyFile.create(tmp_path / "k"))
    with pytest.raises(ValueError, match="holds nothing at rest"):
        open_store("memory:", encryption=encryption)
    store = open_store(f"sqlite:///{tmp_path / 's.db'}", encryption=encryption)
    async with store:
        assert isinstance(store, SQLiteStore)
        assert store.encryption is encryption


# Forks ----------------------------------------------------------------------------------------


async def test_forks_that_share_or_copy_read_fine_and_seal_under_their_own_key(
    backend: Backend, store: Any
) -> None:
    secret = _secret()
    written = await _chat(store, "root", secret)
    await store.fork("root", "sharing", at=3)
    await store.fork("root", "copying", at=4)
    async with SessionActor.open(session_id="root", store=store) as session:
        await session.remove(0, 0)
        await session.snapshot()  # the forks get their own (byte) copies first
    for name, at in (("sharing", 3), ("copying", 4)):
        async with SessionActor.open(session_id=name, store=store) as fork:
            assert list(fork.log.events()) == written[: at + 1]
            mine = await fork.add_message(Message.user(f"{name} goes on"))
        assert list(await store.load(name)) == [*written[: at + 1], mine]
    kids = {
        name: bytes(kid) for name, kid in backend.query("SELECT name, kid FROM {t}nous_sessions")
    }
    assert len(set(kids.values())) == 3  # one key per session
    # The copies keep the root's key, and the kid column says so.
    copied = backend.record("copying", 1)
    assert copied[1:17] == kids["root"]
    assert backend.hits(secret) == 0
    # Both forks hold rows (events, and the kept ones the summary set aside) under the root's
    # key now, and the key holders table says so.
    assert {name for kid, name in backend.holders() if kid == kids["root"]} == {
        "root",
        "sharing",
        "copying",
    }
    _holders_right(backend)


async def test_a_fork_before_a_metadata_change_reads_the_sealed_metadata_event_back(
    store: Any,
) -> None:
    async with SessionActor.open(session_id="p", store=store, metadata={"owner": "ann"}) as s:
        await s.add_message(Message.user("hi"))  # seq 1
        await s.set_metadata({"owner": "bob", "title": "later"})  # seq 2
        await s.add_message(Message.user("later"))
    await store.fork("p", "early", at=1)  # the metadata it had then is sealed in seq 0
    async with SessionActor.open(session_id="early", store=store) as fork:
        assert fork.metadata.owner == "ann"
        assert fork.metadata.title is None
    (entry,) = (await store.list_sessions(where={"owner": "ann"})).sessions
    assert (entry.session_id, entry.metadata.owner) == ("early", "ann")


# Erasure --------------------------------------------------------------------------------------


def _relfilenode(backend: Backend, table: str) -> int:
    (found,) = backend.query(f"SELECT pg_relation_filenode('{{t}}{table}')")
    return int(found[0])


async def test_erasing_destroys_the_key_of_the_old_record_and_nothing_else_is_lost(
    backend: Backend, store: Any
) -> None:
    secret = _secret()
    written = await _chat(store, "s", secret, summary=False)
    await store.fork("s", "fork", at=4)
    async with SessionActor.open(session_id="fork", store=store) as fork:
        await fork.add_message(Message.user("the fork goes on"))
    async with SessionActor.open(session_id="s", store=store) as session:
        await session.remove(0, 0)
        await session.snapshot()  # the fork holds byte copies under the root's key
    before = {event.seq: event for event in await store.load("s")}
    await _chat(store, "other", _secret())  # another session: its key is not touched
    said = written[1].seq
    old = backend.record("s", said)
    old_kid = old[1:17]
    other_keys = {kid for kid, _, _ in backend.data_keys() if kid != old_kid}
    events_file = _relfilenode(backend, "nous_events") if backend.kind == "postgres" else 0

    result = await store.erase("s", [said], reason="request 9")

    assert result.erased == (said,)
    assert result.sessions == ("fork",)
    assert result.proven, result.detail
    assert result.detail.startswith("crypto-erasure: 1 data key(s) destroyed"), result.detail
    # The key is gone; no key the store still has opens the old record.
    keys = backend.data_keys()
    assert old_kid not in {kid for kid, _, _ in keys}
    assert other_keys < {kid for kid, _, _ in keys}
    for _, _, wrapped in keys:
        assert not _opens(old, said, backend.provider.unwrap(wrapped))
    # Every row of the old key was re-sealed, in both sessions: they read back as before.
    assert not backend.query("SELECT seq FROM {t}nous_events WHERE kid = ?", (old_kid,))
    loaded = list(await store.load("s"))
    held = {event.seq: event for event in loaded}
    (record,) = held.keys() - before.keys()  # the erasure's own event
    assert held[record].type is EventType.ERASURE
    assert held[said].data["content"] == ERASED_CONTENT
    assert {seq: e for seq, e in held.items() if seq not in (said, record)} == {
        seq: e for seq, e in before.items() if seq != said
    }
    fork_events = list(await store.load("fork"))
    assert fork_events[said].data["content"] == ERASED_CONTENT
    assert fork_events[-2].data["content"] == "the fork goes on"
    assert fork_events[-1].type is EventType.ERASURE
    # A key-table scrub only: the events table was not rewritten.
    if backend.kind == "postgres":
        assert _relfilenode(backend, "nous_events") == events_file
        assert "VACUUM FULL rewrote" in result.detail
        assert "nous_data_keys" in result.detail
        assert "nous_events" not in result.detail
    else:
        assert "no VACUUM" in result.detail
    # The sessions go on under their new keys, in this store and in a new one.
    async with SessionActor.open(session_id="s", store=store) as session:
        after = await session.add_message(Message.user("after"))
    async with backend.make() as again:
        assert list(await again.load("s")) == [*loaded, after]
    assert backend.hits(secret) == 0


async def test_a_store_holding_the_old_key_commits_under_the_new_one(
    backend: Backend, store: Any
) -> None:
    written = await _chat(store, "s", _secret())
    async with backend.make() as other:
        async with SessionActor.open(session_id="s", store=other) as session:
            await session.add_message(Message.user("before"))  # knows the old key now
            result = await store.erase("s", [written[1].seq], reason="r")
            assert result.proven, result.detail
            # Sealed under the old key first: the commit moves nothing, reads the new key
            # and lands under it.
            after = await session.add_message(Message.user("after"))
        events = list(await store.load("s"))
        assert events[-1] == after
        (kid,) = backend.query("SELECT kid FROM {t}nous_sessions WHERE name = ?", ("s",))
        assert backend.record("s", after.seq)[1:17] == bytes(kid[0])


async def test_erasing_a_plain_record_rewrites_the_tables_as_before(backend: Backend) -> None:
    secret = _secret()
    async with backend.make(None) as plain:
        written = await _chat(plain, "s", secret)
    assert backend.hits(secret) > 0
    async with backend.make() as store:
        result = await store.erase("s", [written[1].seq], reason="r")
    assert result.proven, result.detail
    assert "a copy was in plain text" in result.detail
    assert backend.hits(secret) == 0


async def test_rewrap_lets_the_old_master_key_go(
    backend: Backend, store: Any, tmp_path: Path
) -> None:
    written = await _chat(store, "a", _secret())
    await _chat(store, "b", _secret())
    old_wrapped = {wrapped for _, _, wrapped in backend.data_keys()}
    new = LocalKeyFile.create(tmp_path / "new.key")
    assert await rewrap(store, new) == 2
    keys = backend.data_keys()
    assert {name for _, name, _ in keys} == {new.name}
    assert not old_wrapped & {wrapped for _, _, wrapped in keys}
    async with SessionActor.open(session_id="c", store=store) as session:  # wrapped by the new
        await session.add_message(Message.user("new"))
    assert {name for _, name, _ in backend.data_keys()} == {new.name}
    (tmp_path / "master.key").unlink()  # the old master key is destroyed
    async with backend.make(Encryption(new)) as reopened:
        assert list(await reopened.load("a")) == written
        assert len(await reopened.load("c")) == 1
    async with backend.make(Encryption(backend.provider)) as stale:
        with pytest.raises(StoreError, match="not given"):
            await stale.load("a")
    if backend.kind == "sqlite":
        # No page of the file keeps a key wrapped by the old master key.
        raw = backend.path.read_bytes()
        assert not any(wrapped in raw for wrapped in old_wrapped)
    async with backend.make(None) as plain:
        with pytest.raises(TypeError, match="without encryption"):
            await rewrap(plain, new)


# The key holders table and deletes ----------------------------------------------------------


def _holders_right(backend: Backend) -> set[bytes]:
    """Check the key holders table against the rows: every sealed row's session holds its
    key, every session holds its current key, and every key held or sealed under is in the
    key table. Returns the key table's kids."""
    keys = {kid for kid, _, _ in backend.data_keys()}
    holders = backend.holders()
    rows = backend.sealed_rows()
    assert rows <= holders, rows - holders
    current = {
        (bytes(kid), name)
        for name, kid in backend.query("SELECT name, kid FROM {t}nous_sessions")
        if kid is not None
    }
    assert current <= holders, current - holders
    assert {kid for kid, _ in holders} <= keys
    assert None not in {name for _, name in holders}  # no deleted session holds anything
    return keys


async def _all(store: Any, names: list[str]) -> dict[str, list[Any]]:
    return {name: list(await store.load(name)) for name in names}


async def test_the_key_holders_follow_forks_snapshots_erasures_and_deletes(
    backend: Backend, store: Any
) -> None:
    secret = _secret()
    await _chat(store, "root", secret, summary=False)
    await store.fork("root", "f1", at=3)  # shares the root's rows
    await store.fork("root", "f2", at=4)
    for name in ("f1", "f2"):
        async with SessionActor.open(session_id=name, store=store) as fork:
            await fork.add_message(Message.user(f"{name} goes on"))
    kid = {name: bytes(k) for name, k in backend.query("SELECT name, kid FROM {t}nous_sessions")}
    # Sharing forks hold only their own rows: the root's are read through the root.
    assert backend.holders() == {(kid[name], name) for name in ("root", "f1", "f2")}
    _holders_right(backend)

    async with SessionActor.open(session_id="root", store=store) as session:
        await session.remove(0, 0)
        await session.snapshot()  # the forks get byte copies, under the root's key
    assert backend.holders() == {
        *((kid[name], name) for name in ("root", "f1", "f2")),
        (kid["root"], "f1"),
        (kid["root"], "f2"),
    }
    _holders_right(backend)

    await store.fork("f1", "g", at=4)  # shares f1's rows: the root's copies and its own
    async with SessionActor.open(session_id="g", store=store) as fork:
        await fork.add_message(Message.user("g goes on"))
    kid["g"] = bytes(backend.query("SELECT kid FROM {t}nous_sessions WHERE name = ?", ("g",))[0][0])
    names = ["root", "f1", "f2", "g"]
    before = await _all(store, names)

    said = 1
    result = await store.erase("root", [said], reason="r")
    assert result.proven, result.detail
    assert set(result.sessions) == {"f1", "f2", "g"}
    keys = _holders_right(backend)
    assert kid["root"] not in keys
    assert kid["root"] not in {k for k, _ in backend.sealed_rows()}  # no row left under it
    successor = bytes(
        backend.query("SELECT kid FROM {t}nous_sessions WHERE name = ?", ("root",))[0][0]
    )
    assert {name for k, name in backend.holders() if k == successor} == {"root", "f1", "f2"}
    after = await _all(store, names)
    for name in names:  # nothing else changed: the erased event, and each its erasure record
        (erased,) = [e for e in after[name] if e.seq == said]
        assert erased.data["content"] == ERASED_CONTENT
        assert after[name][-1].type is EventType.ERASURE
        kept = [e for e in after[name][:-1] if e.seq != said]
        assert kept == [e for e in before[name] if e.seq != said]

    assert await store.delete("f1")  # g gets its own copy first; f1's keys are g's too now
    names.remove("f1")
    assert {k for k, name in backend.holders() if name == "g"} == {successor, kid["f1"], kid["g"]}
    assert kid["f1"] in _holders_right(backend)
    assert await _all(store, names) == {name: after[name] for name in names}

    # Deleting: a key goes only with its last holder.
    assert await store.delete("root")
    keys = _holders_right(backend)
    assert successor in keys  # f2 and g hold rows under it
    assert await store.delete("f2")
    keys = _holders_right(backend)
    assert kid["f2"] not in keys
    assert {successor, kid["f1"], kid["g"]} <= keys
    assert list(await store.load("g")) == after["g"]
    assert await store.delete("g")
    assert _holders_right(backend) == set()
    assert backend.holders() == set()
    assert backend.hits(secret) == 0


async def test_deleting_a_session_destroys_its_key_and_scrubs_the_key_table(
    backend: Backend, store: Any
) -> None:
    await _chat(store, "a", _secret())
    kept = await _chat(store, "b", _secret())
    (a_kid,) = backend.query("SELECT kid FROM {t}nous_sessions WHERE name = ?", ("a",))
    old = {kid: wrapped for kid, _, wrapped in backend.data_keys()}
    wrapped = old[bytes(a_kid[0])]
    assert backend.raw_hits(wrapped) > 0  # the scan sees the wrapped key

    assert await store.delete("a")
    assert set({kid for kid, _, _ in backend.data_keys()}) == set(old) - {bytes(a_kid[0])}
    assert backend.raw_hits(wrapped) == 0  # no page of the key table keeps it
    assert list(await store.load("b")) == kept
    assert not await store.delete("a")
    # The name starts over as a new session under a new key.
    async with SessionActor.open(session_id="a", store=store) as session:
        again = await session.add_message(Message.user("again"))
    assert list(await store.load("a")) == [again]
    new_kid = {kid for kid, _, _ in backend.data_keys()} - set(old)
    assert len(new_kid) == 1
    _holders_right(backend)

    # delete_idle too, and a store without encryption destroys the keys all the same.
    (entry,) = [e for e in (await store.list_sessions()).sessions if e.session_id == "a"]
    assert await store.delete_idle("a", count=entry.count, active=entry.active)
    assert {kid for kid, _, _ in backend.data_keys()} == set(old) - {bytes(a_kid[0])}
    async with backend.make(None) as plain:
        assert await plain.delete("b")
    assert backend.data_keys() == []
    assert backend.holders() == set()
