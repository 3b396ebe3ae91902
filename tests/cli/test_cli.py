"""The command line, run as a separate process against a real SQLite file."""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import functools
import io
import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import attrs
import orjson
import pytest

from nous_session import CompactionPolicy, Message, SessionActor, ToolCall
from nous_session.codec import from_json
from nous_session.event import Event, make_event
from nous_session.log import Log
from nous_session.stores.sqlite import SQLiteStore
from tests.support.processes import Lines, ending


def argv(*args: str, store: str) -> list[str]:
    """The command line of ``nous-session --store STORE ARGS...``."""
    return [sys.executable, "-m", "nous_session", "--store", store, *args]


def run(
    *args: str,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """``python -m nous_session ARGS...`` as a separate process (in ``cwd``, with ``env``)."""
    return subprocess.run(
        [sys.executable, "-m", "nous_session", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
        env=env,
    )


def cli(*args: str, store: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = run("--store", store, *args)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def rows(out: str) -> list[list[str]]:
    """The rows ``messages`` printed, each as INDEX, SEQ, ROLE and TEXT, once its header is
    checked."""
    header, *lines = out.splitlines()
    assert header.split() == ["INDEX", "SEQ", "ROLE", "TEXT"]
    return [line.split(None, 3) for line in lines]


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """A SQLite file with one conversation: messages, a tool pair, a summary."""
    path = tmp_path_factory.mktemp("cli") / "sessions.sqlite3"

    async def fill() -> None:
        async with (
            SQLiteStore(path) as store,
            SessionActor.open(session_id="chat", store=store) as s,
        ):
            await s.add_message(Message.system("be brief"))
            await s.add_message(Message.user("weather in Paris?"))
            await s.add_message(
                Message.assistant(
                    "checking", tool_calls=[ToolCall("c1", "get_weather", {"city": "Paris"})]
                )
            )
            await s.add_message(Message.tool("c1", {"celsius": 18}, name="get_weather"))
            await s.append("turn_end", {"turn": 1})
            await s.add_message(Message.assistant("18C"))
            await s.replace(1, 5, Message.system("summary: Paris is 18C"))
            await s.add_message(Message.user("thanks"))

    anyio.run(fill)
    return f"sqlite:///{path}", path


def test_sessions_lists_ids_counts_and_held(stored: tuple[str, Path]) -> None:
    url, _ = stored
    out = cli("sessions", store=url).stdout
    assert "chat" in out
    assert out.splitlines()[1].split() == ["chat", "8", "8"]
    assert [
        orjson.loads(line) for line in cli("sessions", "--json", store=url).stdout.splitlines()
    ] == [{"session_id": "chat", "count": 8, "held": 8}]


def test_events_prints_every_event_or_json_from_since(stored: tuple[str, Path]) -> None:
    url, _ = stored
    lines = cli("events", "chat", store=url).stdout.splitlines()
    assert len(lines) == 8
    assert lines[4].split()[0] == "4"
    assert "turn_end" in lines[4]
    records = [
        orjson.loads(line)
        for line in cli("events", "chat", "--since", "6", "--json", store=url).stdout.splitlines()
    ]
    assert [r["seq"] for r in records] == [6, 7]
    assert records[0]["data"]["surface_op"] == ["replace", 1, 5]


def test_messages_shows_the_surface_and_time_travels(stored: tuple[str, Path]) -> None:
    url, _ = stored
    now = [
        orjson.loads(line)
        for line in cli("messages", "chat", "--json", store=url).stdout.splitlines()
    ]
    assert [(m["role"], m["content"]) for m in now] == [
        ("system", "be brief"),
        ("system", "summary: Paris is 18C"),
        ("user", "thanks"),
    ]
    then = rows(cli("messages", "chat", "--as-of", "3", store=url).stdout)
    assert len(then) == 4
    assert "get_weather(c1)" in then[2][3]
    assert "[c1]" in then[3][3]


def test_export_writes_json_lines_that_decode_to_the_events(
    stored: tuple[str, Path], tmp_path: Path
) -> None:
    url, path = stored
    target = tmp_path / "chat.jsonl"
    result = cli("export", "chat", "--output", str(target), store=url)
    assert "wrote 8 events" in result.stderr
    events = [from_json(orjson.loads(line)) for line in target.read_bytes().splitlines()]

    async def load() -> list:  # type: ignore[type-arg]
        async with SQLiteStore(path) as store:
            return list(await store.load("chat"))

    assert events == anyio.run(load)
    assert cli("export", "chat", store=url).stdout.encode() == target.read_bytes()


def test_stats_reports_the_figures(stored: tuple[str, Path]) -> None:
    url, _ = stored
    figures = orjson.loads(cli("stats", "chat", "--json", store=url).stdout)
    assert figures["count"] == 8
    assert figures["held"] == 8
    assert figures["shadowed"] == 5
    assert figures["surface_messages"] == 3
    assert figures["types"]["turn_end"] == 1


def test_snapshot_drops_shadowed_events_in_the_store(
    tmp_path: Path, stored: tuple[str, Path]
) -> None:
    _, source = stored
    copy = tmp_path / "copy.sqlite3"
    copy.write_bytes(source.read_bytes())
    url = f"sqlite:///{copy}"
    asked = cli("snapshot", "chat", "--vacuum", store=url, check=False)
    assert asked.returncode == 1
    assert "would drop 5 of its 8 events for good; pass --yes" in asked.stderr
    assert orjson.loads(cli("stats", "chat", "--json", store=url).stdout)["held"] == 8
    assert (
        "dropped 5 shadowed events; 3 held, count 8"
        in cli("snapshot", "chat", "--vacuum", "--yes", store=url).stdout
    )
    assert orjson.loads(cli("stats", "chat", "--json", store=url).stdout)["held"] == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("events", "nobody"), "no session 'nobody'"),
        (("messages", "chat", "--as-of", "99"), "--as-of 99 is past the newest seq (7)"),
    ],
)
def test_errors_are_one_line_and_a_nonzero_exit(
    stored: tuple[str, Path], args: tuple[str, ...], message: str
) -> None:
    url, _ = stored
    result = cli(*args, store=url, check=False)
    assert result.returncode == 1
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"nous-session: error: {message}")


def test_a_bad_store_url_is_one_clear_line() -> None:
    result = cli("sessions", store="ftp://nowhere", check=False)
    assert result.returncode == 1
    assert result.stderr.startswith("nous-session: error: unknown store URL scheme 'ftp'")


def test_bad_arguments_exit_with_usage() -> None:
    result = cli("events", "chat", "--since", "-4", store="memory:", check=False)
    assert result.returncode == 2
    assert "a seq is >= 0" in result.stderr


def test_tail_follows_appends_from_another_process(tmp_path: Path) -> None:
    path = tmp_path / "live.sqlite3"
    url = f"sqlite:///{path}"

    async def write(contents: list[str]) -> None:
        async with (
            SQLiteStore(path) as store,
            SessionActor.open(session_id="live", store=store) as s,
        ):
            for content in contents:
                await s.append("user_message", {"content": content})

    anyio.run(write, ["one", "two"])
    with (
        subprocess.Popen(
            argv("tail", "live", "--json", "--interval", "0.05", store=url),
            stdout=subprocess.PIPE,
            text=True,
        ) as tail,
        ending(tail),
    ):
        lines = Lines(tail)
        seen = [orjson.loads(lines.next())["data"]["content"] for _ in range(2)]
        assert seen == ["one", "two"]
        anyio.run(write, ["three", "four"])  # this process writes; the tail process follows
        seen += [orjson.loads(lines.next())["data"]["content"] for _ in range(2)]
        assert seen == ["one", "two", "three", "four"]
        tail.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 10
        while tail.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tail.returncode == 130  # interrupted, as a shell reports it


def test_tail_ends_when_its_session_is_deleted_by_another_process(tmp_path: Path) -> None:
    """A tail follows one session: its delete ends the tail with an error that says so (it
    waited for ever before, and would have printed a session made again under the id)."""
    path = tmp_path / "live.sqlite3"
    url = f"sqlite:///{path}"

    async def write() -> None:
        async with SQLiteStore(path) as store:
            await store.commit("live", expected_count=0, events=[_user_event(0, "one")])

    async def delete() -> None:
        async with SQLiteStore(path) as store:
            assert await store.delete("live")

    anyio.run(write)
    with (
        subprocess.Popen(
            argv("tail", "live", "--json", "--interval", "0.05", store=url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as tail,
        ending(tail),
    ):
        lines = Lines(tail)
        assert orjson.loads(lines.next())["data"]["content"] == "one"
        anyio.run(delete)
        assert tail.wait(timeout=30) == 1
        assert tail.stderr is not None
        assert "session 'live' was deleted while it was followed" in tail.stderr.read()


def _user_event(seq: int, content: str) -> Event:
    return make_event(seq, "user_message", {"content": content})


def interrupt_tail(url: str, delay: float) -> tuple[int | None, str]:
    """Start ``tail`` on ``url``; once it has printed, wait ``delay`` seconds (the moment
    varies from run to run), then press Ctrl-C again and again, as an impatient user does,
    until it exits. Its exit status and stderr."""
    with subprocess.Popen(
        argv("tail", "live", "--interval", "0.001", store=url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as tail:
        assert tail.stdout is not None
        assert tail.stderr is not None
        tail.stdout.readline()  # it is following: its first event is printed
        time.sleep(delay)  # the stimulus: a varying moment, not a wait for a condition
        deadline = time.monotonic() + 10
        while tail.poll() is None and time.monotonic() < deadline:
            tail.send_signal(signal.SIGINT)
            time.sleep(0.002)
        if tail.poll() is None:
            tail.kill()
        tail.stdout.read()
        return tail.wait(), tail.stderr.read()


def test_ctrl_c_on_tail_exits_quietly_every_time(tmp_path: Path) -> None:
    # The newcomer saw "Exception ignored in: <module 'threading'...> KeyboardInterrupt" in
    # about 1 of 9 tries: a further Ctrl-C landing while the interpreter joined a worker
    # thread at exit. 20 runs, interrupted at moments spread over 0..38 ms after it started
    # following, a few at a time.
    path = tmp_path / "live.sqlite3"

    async def write() -> None:
        async with (
            SQLiteStore(path) as store,
            SessionActor.open(session_id="live", store=store) as s,
        ):
            await s.append("user_message", {"content": "one"})

    anyio.run(write)
    url = f"sqlite:///{path}"
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda run: interrupt_tail(url, run * 0.002), range(20)))
    for status, stderr in results:
        assert "Traceback" not in stderr, stderr
        assert "Exception ignored" not in stderr, stderr
        assert stderr.strip() == "", stderr
        assert status == 130


def test_demo_writes_where_it_says_in_the_working_directory(tmp_path: Path) -> None:
    home = tmp_path / "home"
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "HOME": str(home)}
    env.pop("NOUS_SESSION_STORE", None)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[2]), env.get("PYTHONPATH", "")]
    )
    result = run("demo", "--turns", "40", "--session", "d", timeout=120, env=env, cwd=work)
    assert result.returncode == 0, result.stderr
    assert "full history intact after the restart: yes" in result.stdout
    demo_file = work / "nous_session_demo.sqlite3"
    # The first line names the file, before anything is written; nothing goes under $HOME.
    first = result.stdout.splitlines()[0]
    assert "sqlite:///nous_session_demo.sqlite3" in first
    assert str(demo_file) in first
    assert demo_file.exists()
    assert not home.exists()
    assert "-m nous_session --store sqlite:///nous_session_demo.sqlite3 stats d" in result.stdout


# Reading never writes, and the audit commands -------------------------------------------------


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_reading_commands_create_and_change_nothing(
    tmp_path: Path, stored: tuple[str, Path]
) -> None:
    _, source = stored
    ours = tmp_path / "ours.sqlite3"
    ours.write_bytes(source.read_bytes())
    foreign = tmp_path / "app.db"
    with contextlib.closing(sqlite3.connect(foreign)) as connection, connection:
        connection.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    before = _tree(tmp_path)
    for args in (
        ("sessions",),
        ("stats", "chat"),
        ("events", "chat"),
        ("messages", "chat"),
        ("history", "chat"),
        ("export", "chat"),
    ):
        cli(*args, store=f"sqlite:///{ours}")
        result = cli(*args, store=f"sqlite:///{foreign}", check=False)
        assert result.returncode == 1
        assert (
            result.stderr.strip() == f"nous-session: error: {foreign} is not a nous_session store"
        )
    missing = tmp_path / "missing.sqlite3"
    result = cli("tail", "chat", store=f"sqlite:///{missing}", check=False)
    assert result.returncode == 1
    assert result.stderr.strip().startswith(
        f"nous-session: error: no store file at {missing}; name the store with --store URL"
    )
    assert _tree(tmp_path) == before


def test_retain_names_a_bad_duration_in_one_line_and_changes_nothing(
    tmp_path: Path, stored: tuple[str, Path]
) -> None:
    # Too long for a timedelta, or reaching back before year 1: one line naming the option,
    # not an OverflowError's traceback; with --yes too, nothing deleted.
    _, source = stored
    ours = tmp_path / "ours.sqlite3"
    ours.write_bytes(source.read_bytes())
    before = _tree(tmp_path)
    for option, named in (
        ("--idle-for=99999999999d", "idle_for"),
        ("--idle-for=1000000000d", "idle_for"),
        ("--older-than=3000000d", "older_than"),
        ("--older-than=-1d", "older_than"),
        ("--idle-for=0d", "idle_for"),
    ):
        for yes in ((), ("--yes",)):
            result = cli("retain", option, *yes, store=f"sqlite:///{ours}", check=False)
            assert result.returncode == 1, result.stdout
            assert len(result.stderr.splitlines()) == 1, result.stderr
            assert result.stderr.startswith(f"nous-session: error: {named}"), result.stderr
            assert result.stdout == ""
    assert _tree(tmp_path) == before


async def _three_sessions(path: Path) -> None:
    """Sessions a, b and c in the SQLite file at ``path``, a message each."""
    async with SQLiteStore(path) as store:
        for name in ("a", "b", "c"):
            async with SessionActor.open(session_id=name, store=store) as s:
                await s.add_message(Message.user(name))


def test_retain_that_fails_midway_says_what_it_did(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from nous_session import retention
    from nous_session.cli import main
    from nous_session.errors import StoreError

    path = tmp_path / "retain.sqlite3"

    anyio.run(_three_sessions, path)
    real = SQLiteStore.delete_idle
    calls = 0

    async def failing(self: SQLiteStore, *args: object, **kwargs: object) -> bool:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise StoreError("cannot delete session: disk I/O error")
        return await real(self, *args, **kwargs)  # type: ignore[arg-type]  # passed through

    monkeypatch.setattr(SQLiteStore, "delete_idle", failing)
    # The policy's clock a day on, so that the sessions just written are idle for 1h.
    later = datetime.now(UTC) + timedelta(days=1)
    monkeypatch.setattr(retention, "apply", functools.partial(retention.apply, now=later))
    url = f"sqlite:///{path}"
    out = io.StringIO()
    assert main(["--store", url, "retain", "--idle-for", "1h", "--yes"], out=out) == 1
    assert capsys.readouterr().err == (
        "nous-session: error: cannot delete session: disk I/O error (retention stopped with"
        " 1 of the 3 selected sessions handled: it had deleted 1 and kept 0; a second run"
        " does the rest)\n"
    )
    monkeypatch.setattr(SQLiteStore, "delete_idle", real)
    assert main(["--store", url, "retain", "--idle-for", "1h", "--yes"], out=out) == 0
    assert out.getvalue().endswith("deleted 2 of 2 selected sessions; kept 0 written to since\n")


# `retain --yes` as a program whose second delete never ends (until Ctrl-C), with the policy's
# clock a day on; it says "deleting" on stderr as the second delete starts.
_RETAIN_STUCK = """
import sys
from datetime import UTC, datetime, timedelta
import anyio
from nous_session import retention
from nous_session.cli import main
from nous_session.stores.sqlite import SQLiteStore

real = SQLiteStore.delete_idle
calls = 0

async def stuck(self, *args, **kwargs):
    global calls
    calls += 1
    if calls == 2:
        sys.stderr.write("deleting\\n")
        sys.stderr.flush()
        await anyio.sleep_forever()
    return await real(self, *args, **kwargs)

SQLiteStore.delete_idle = stuck
later = datetime.now(UTC) + timedelta(days=1)
policy = retention.apply
retention.apply = lambda *args, **kwargs: policy(*args, now=later, **kwargs)
sys.exit(main(["--store", sys.argv[1], "retain", "--idle-for", "1h", "--yes"]))
"""


def test_ctrl_c_on_retain_says_what_it_did(tmp_path: Path) -> None:
    path = tmp_path / "retain.sqlite3"

    anyio.run(_three_sessions, path)
    with (
        subprocess.Popen(
            [sys.executable, "-c", _RETAIN_STUCK, f"sqlite:///{path}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as child,
        ending(child),
    ):
        assert child.stderr is not None
        assert child.stderr.readline() == "deleting\n"
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
    assert child.returncode == 130
    assert out == ""
    assert err == (
        "nous-session: retention stopped with 1 of the 3 selected sessions handled: it had"
        " deleted 1 and kept 0; a second run does the rest\n"
    )
    result = cli("sessions", store=f"sqlite:///{path}")
    assert [line.split()[0] for line in result.stdout.splitlines()[1:]] == ["b", "c"]


def test_a_missing_store_says_how_to_name_one_and_lists_the_files_here(tmp_path: Path) -> None:
    (tmp_path / "chats.sqlite3").write_bytes(b"SQLite format 3\x00" + bytes(84))
    (tmp_path / "notes.db").write_text("not a database")
    result = run("sessions", "--store", "sqlite:///nope.sqlite3", cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "nous-session: error: no store file at nope.sqlite3; name the store with --store URL"
        " (after the verb or before it) or in NOUS_SESSION_STORE (SQLite files in this"
        " directory: sqlite:///chats.sqlite3)"
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["chats.sqlite3", "notes.db"]


def test_no_store_named_says_the_rule_and_lists_the_files_here(tmp_path: Path) -> None:
    # The one rule: a store given none is the one NOUS_SESSION_STORE names, else memory. A
    # command has nothing to read in another program's memory, so it asks for a name, for
    # reading and changing verbs alike, and creates nothing.
    (tmp_path / "chats.sqlite3").write_bytes(b"SQLite format 3\x00" + bytes(84))
    env = {key: value for key, value in os.environ.items() if key != "NOUS_SESSION_STORE"}
    for args in (["sessions"], ["messages", "chat-42"], ["delete", "chat-42", "--yes"]):
        result = run(*args, cwd=tmp_path, env=env)
        assert result.returncode == 1
        assert result.stderr.strip() == (
            "nous-session: error: no store named: sessions are where a program put them, and"
            " one given no store keeps them in its memory; name the store with --store URL"
            " (after the verb or before it) or in NOUS_SESSION_STORE, which the library reads"
            " too (SQLite files in this directory: sqlite:///chats.sqlite3)"
        )
    assert [path.name for path in tmp_path.iterdir()] == ["chats.sqlite3"]
    # Named in the environment, as a program names it: the command reads that store.
    path = tmp_path / "named.sqlite3"

    async def fill() -> None:
        async with SessionActor.open(session_id="chat-42", store=f"sqlite:///{path}") as s:
            await s.add_message(Message.user("hello"))

    anyio.run(fill)
    named = {**env, "NOUS_SESSION_STORE": f"sqlite:///{path}"}
    result = run("messages", "chat-42", env=named)
    assert result.returncode == 0, result.stderr
    assert rows(result.stdout) == [["0", "0", "user", "hello"]]


def test_history_lists_operations_and_lineage(tmp_path: Path) -> None:
    path = tmp_path / "audit.sqlite3"
    url = f"sqlite:///{path}"

    async def fill() -> None:
        async with SQLiteStore(path) as store, SessionActor.open(session_id="a", store=store) as s:
            for index in range(4):
                await s.add_message(Message.user(f"m{index}"))
            await s.replace(0, 1, Message.system("summary"))
            await s.remove(2, 2)
            await s.rewind(4)  # back to just after the summary: the remove undone
            await s.uncompact(4)

    anyio.run(fill)
    lines = cli("history", "a", store=url).stdout.splitlines()
    assert [line.split(None, 3)[3] for line in lines] == [
        "replace 0..1 with one system_message message",
        "remove 2..2",
        "rewind to seq 4",
        "uncompact the replace at seq 4",
    ]
    assert [line.split()[0] for line in lines] == ["4", "5", "6", "7"]
    # An erasure is in the history too: which seqs, and why.
    cli("erase", "a", "0", "1", "--reason", "asked to", "--yes", store=url)
    last = cli("history", "a", store=url).stdout.splitlines()[-1]
    assert last.split()[0] == "8"
    assert last.split(None, 3)[3] == "erase seqs 0, 1, 4 (asked to)"
    cli("fork", "a", "b", "--at", "5", store=url)
    assert cli("history", "b", store=url).stdout.splitlines()[0] == "forked from 'a' at seq 5"
    rows = [orjson.loads(line) for line in cli("sessions", "--json", store=url).stdout.splitlines()]
    assert rows[1] == {"session_id": "b", "count": 6, "held": 6, "parent": "a", "fork_point": 5}
    assert "a @ 5" in cli("sessions", store=url).stdout.splitlines()[2]


def test_compactions_are_dated_when_they_happen(tmp_path: Path) -> None:
    # Messages written now, one after another, and compactions run between them. Each
    # compaction is dated when it was applied, so `events` reads forward in time and `history`
    # shows the compactions in order, none dated to a message it replaced; the summary on the
    # surface keeps the date of the first message it stands for.
    path = tmp_path / "dated.sqlite3"
    url = f"sqlite:///{path}"
    written: list[Message] = []

    async def fill() -> None:
        policy = CompactionPolicy(keep_last=2, every=4)
        async with (
            SQLiteStore(path) as store,
            SessionActor.open(session_id="c", store=store, compaction=policy) as s,
        ):
            for index in range(12):
                written.append(Message.user(f"m{index}"))
                await s.add_message(written[-1])
                await s.wait_for_compaction()
            assert s.statistics().compactions_run == 4

    anyio.run(fill)

    def times(verb: str) -> list[datetime]:
        out = cli(verb, "c", "--json", store=url).stdout.splitlines()
        return [datetime.fromisoformat(orjson.loads(line)["time"]) for line in out]

    assert times("events") == sorted(times("events"))
    dated = times("history")
    assert len(dated) == 4
    assert dated == sorted(set(dated))  # four times, in order
    assert dated[0] > written[4].created_at  # after what it replaced, and what came next
    first = orjson.loads(cli("messages", "c", "--json", store=url).stdout.splitlines()[0])
    assert datetime.fromisoformat(first["created_at"]) == written[0].created_at


def test_fork_rewind_remove_import_and_delete_from_the_shell(
    tmp_path: Path, stored: tuple[str, Path]
) -> None:
    _, source = stored
    path = tmp_path / "edit.sqlite3"
    path.write_bytes(source.read_bytes())
    url = f"sqlite:///{path}"

    def texts(session: str) -> list[str]:
        out = cli("messages", session, "--json", store=url).stdout.splitlines()
        return [orjson.loads(line)["content"] for line in out]

    assert texts("chat") == ["be brief", "summary: Paris is 18C", "thanks"]
    assert "forked 'chat' at seq 7 into 'copy'" in cli("fork", "chat", "copy", store=url).stdout
    assert "removed messages 1..1" in cli("remove", "copy", "1", store=url).stdout
    assert texts("copy") == ["be brief", "thanks"]
    assert texts("chat") == ["be brief", "summary: Paris is 18C", "thanks"]
    rewound = orjson.loads(cli("rewind", "copy", "3", "--json", store=url).stdout)
    assert rewound["type"] == "rewind"
    assert len(texts("copy")) == 4
    exported = tmp_path / "copy.jsonl"
    cli("export", "copy", "--output", str(exported), store=url)
    result = cli("import", "restored", str(exported), store=url)
    assert "imported 10 events" in result.stdout
    assert texts("restored") == texts("copy")
    assert cli("export", "restored", store=url).stdout.encode() == exported.read_bytes()
    again = cli("import", "restored", str(exported), store=url, check=False)
    assert again.returncode == 1
    assert "exists already" in again.stderr
    asked = cli("delete", "restored", store=url, check=False)
    assert (asked.returncode, "pass --yes" in asked.stderr) == (1, True)
    assert "deleted 'restored'" in cli("delete", "restored", "--yes", store=url).stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"seq": 0, "type": "user_message", "time": "nope", "data": {}}\n')
    result = cli("import", "broken", str(bad), store=url, check=False)
    assert result.returncode == 1
    assert "line 1: bad time 'nope'" in result.stderr


def test_as_of_before_the_horizon_is_one_line(tmp_path: Path, stored: tuple[str, Path]) -> None:
    _, source = stored
    path = tmp_path / "snap.sqlite3"
    path.write_bytes(source.read_bytes())
    url = f"sqlite:///{path}"
    cli("snapshot", "chat", "--yes", store=url)
    result = cli("messages", "chat", "--as-of", "2", store=url, check=False)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert "before the horizon 8" in line
    assert len(rows(cli("messages", "chat", "--as-of", "7", store=url).stdout)) == 3


@pytest.mark.parametrize("command", ["fork", "rewind", "remove", "import", "history", "delete"])
def test_the_audit_commands_explain_themselves(command: str) -> None:
    result = cli(command, "--help", store="memory:")
    assert result.stdout.startswith(f"usage: nous-session {command}")


def _events_file(path: Path, seqs: list[int]) -> Path:
    """A JSON-lines export holding one user message per seq."""
    lines = [
        orjson.dumps(
            {
                "seq": seq,
                "type": "user_message",
                "time": "2024-05-01T12:00:00+00:00",
                "data": {"content": f"m{seq}"},
            }
        )
        for seq in seqs
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.mark.parametrize("seq", [10**9, 10**10, 2**63 - 2])
def test_import_costs_what_the_file_holds_not_what_its_seqs_name(tmp_path: Path, seq: int) -> None:
    """One event at a far seq imports at once (it listed every missing seq: a MemoryError at
    10**9, still running at 10**10), and the horizon is the seq itself."""
    url = f"sqlite:///{tmp_path / 'far.sqlite3'}"
    result = cli("import", "far", str(_events_file(tmp_path / "far.jsonl", [seq])), store=url)
    assert "imported 1 events" in result.stdout
    (row,) = [
        orjson.loads(line) for line in cli("sessions", "--json", store=url).stdout.splitlines()
    ]
    assert (row["count"], row["held"]) == (seq + 1, 1)
    assert [
        orjson.loads(line)["content"]
        for line in cli("messages", "far", "--json", store=url).stdout.splitlines()
    ] == [f"m{seq}"]
    before = cli("messages", "far", "--as-of", str(seq - 2), store=url, check=False)
    assert f"before the horizon {seq}" in before.stderr


def test_import_keeps_the_horizon_of_an_export_with_gaps(tmp_path: Path) -> None:
    """The horizon is one past the highest gap, however many gaps there are."""
    url = f"sqlite:///{tmp_path / 'gaps.sqlite3'}"
    cli("import", "gaps", str(_events_file(tmp_path / "gaps.jsonl", [0, 3, 4, 9, 10])), store=url)
    result = cli("messages", "gaps", "--as-of", "7", store=url, check=False)
    assert "before the horizon 9" in result.stderr
    assert len(rows(cli("messages", "gaps", "--as-of", "8", store=url).stdout)) == 3


def test_import_of_a_seq_whose_count_cannot_be_stored_is_one_line(tmp_path: Path) -> None:
    """Seq 2**63 - 1 would make the count 2**63, past every store's 64-bit integer: the
    command says so in one line instead of a driver's OverflowError traceback."""
    url = f"sqlite:///{tmp_path / 'edge.sqlite3'}"
    source = _events_file(tmp_path / "edge.jsonl", [2**63 - 1])
    result = cli("import", "edge", str(source), store=url, check=False)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert f"bad seq {2**63 - 1}" in line


def test_export_and_import_keep_ints_wider_than_64_bits(tmp_path: Path) -> None:
    """orjson refuses such ints on export and reads them as floats on import: the command line
    writes and reads them exactly, and the JSON it prints holds them too."""
    path = tmp_path / "wide.sqlite3"
    url = f"sqlite:///{path}"
    wide = {"amount": 2**70, "debts": [-(2**64), 10**30]}

    async def fill() -> None:
        async with SessionActor.open(session_id="wide", store=url) as session:
            call = ToolCall("c1", "pay", wide)
            await session.add_message(Message.assistant("", tool_calls=[call]))

    anyio.run(fill)
    exported = tmp_path / "wide.jsonl"
    cli("export", "wide", "--output", str(exported), store=url)
    assert str(2**70) in exported.read_text()
    cli("import", "copy", str(exported), store=url)
    assert cli("export", "copy", store=url).stdout.encode() == exported.read_bytes()
    (line,) = cli("messages", "copy", "--json", store=url).stdout.splitlines()
    assert json.loads(line)["tool_calls"][0]["arguments"] == wide


# The first hour (issue 35): options where a newcomer puts them, help for every verb ---------


def test_store_is_taken_after_the_verb_too(stored: tuple[str, Path]) -> None:
    """The README's own line, ``nous-session messages chat-42 --store URL``, failed with
    ``unrecognized arguments``: --store was taken only before the verb."""
    url, _ = stored
    result = run("messages", "chat", "--store", url)
    assert result.returncode == 0, result.stderr
    assert "thanks" in result.stdout
    # Given twice, the one after the verb wins.
    result = run("--store", "sqlite:///nowhere/x.sqlite3", "messages", "chat", "--store", url)
    assert result.returncode == 0, result.stderr


def test_every_verb_describes_itself_and_names_store() -> None:
    """Each verb's --help has a description and the --store option (10 of 17 had none)."""
    from nous_session.cli._parser import build_parser

    parser = build_parser()
    verbs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert len(verbs.choices) >= 17
    for name, verb in verbs.choices.items():
        assert verb.description, f"{name} has no description"
        assert "--store" in verb.format_help(), f"{name} --help does not mention --store"


def test_a_field_given_twice_in_where_is_refused(stored: tuple[str, Path]) -> None:
    """``--where owner=a --where owner=b`` listed b's sessions: the last value silently won,
    though every --where must match."""
    url, _ = stored
    result = cli("sessions", "--where", "owner=a", "--where", "owner=b", store=url, check=False)
    assert result.returncode != 0
    assert "--where owner= is given twice" in result.stderr


def test_metadata_update_keeps_the_other_fields_and_set_says_what_it_drops(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'meta.sqlite3'}"

    async def fill() -> None:
        metadata = {"owner": "ann", "title": "Trip", "tags": ["travel"]}
        async with SessionActor.open(session_id="m", store=url, metadata=metadata) as s:
            await s.add_message(Message.user("hi"))

    anyio.run(fill)
    cli("metadata", "m", "--update", '{"title": "Paris"}', store=url)
    shown = json.loads(cli("metadata", "m", "--json", store=url).stdout)
    assert shown["owner"] == "ann"
    assert shown["title"] == "Paris"
    assert shown["tags"] == ["travel"]
    replaced = cli("metadata", "m", "--set", '{"owner": "bob"}', store=url)
    assert "dropped: tags, title" in replaced.stdout
    bad = cli("metadata", "m", "--set", "{not json", store=url, check=False)
    assert bad.returncode != 0
    assert "the metadata is not JSON" in bad.stderr
    assert "give an object such as" in bad.stderr


def test_every_command_the_demo_suggests_runs(tmp_path: Path) -> None:
    """The demo ends with commands to look inside what it stored; each runs as printed, however
    few turns the demo played (its ``--as-of 40`` failed after ``demo --turns 3``)."""
    demo = run("demo", "--turns", "3", timeout=120, cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr
    suggested = [
        line.split(" -m nous_session ", 1)[1].split(" > ")[0]
        for line in demo.stdout.splitlines()
        if " -m nous_session " in line and " tail " not in line  # tail follows until stopped
    ]
    assert len(suggested) >= 5, demo.stdout
    for command in suggested:
        result = run(*command.split(), cwd=tmp_path)
        assert result.returncode == 0, f"{command}: {result.stderr}"


# Erasing what `messages` shows: seqs, not positions -----------------------------------------


async def travel_chat(path: Path) -> None:
    """The group chat the erasure examples in docs/cli.md and docs/erasure.md use:
    ``chat-42``, where Alice and Bob write, with a summary at seq 11 over Alice's first
    message and its reply, and ``chat-42-fork``, forked at seq 4."""
    async with SessionActor.open(session_id="chat-42", store=f"sqlite:///{path}") as s:
        await s.add_message(Message.system("You are a travel assistant."))
        await s.add_message(
            Message.user(
                "Hi, I'm Alice.\nI live at 12 Rue des Lilas, Lyon; my phone is 06 12 34 56 78.",
                name="alice",
            )
        )
        await s.add_message(Message.assistant("Hello Alice! Where would you like to go?"))
        await s.append("turn_end", {"turn": 1})
        await s.add_message(Message.user("Bob here: two seats to Lisbon, please.", name="bob"))
        call = ToolCall("c1", "find_flights", {"to": "LIS", "seats": 2})
        await s.add_message(Message.assistant("", tool_calls=[call]))
        await s.add_message(Message.tool("c1", {"flights": 3}, name="find_flights"))
        await s.add_message(Message.assistant("Booked: two seats to Lisbon on Tuesday."))
        await s.append("turn_end", {"turn": 2})
        await s.add_message(
            Message.user("Thanks! Send the invoice to alice@example.com.", name="alice")
        )
        await s.add_message(Message.assistant("Sent."))
        # A summary of the first turn, in place of Alice's greeting and the reply: it copies
        # her address.
        await s.replace(
            1, 2, Message.system("Summary: Alice, of 12 Rue des Lilas, wants to travel.")
        )
        await s.fork("chat-42-fork", at=4)


@pytest.fixture(scope="module")
def travel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("travel") / "sessions.db"
    anyio.run(travel_chat, path)
    return path


@pytest.fixture
def chat42(tmp_path: Path, travel: Path) -> str:
    """A copy of the travel chat's store, for a test that changes it: its URL."""
    copy = tmp_path / "sessions.db"
    copy.write_bytes(travel.read_bytes())
    return f"sqlite:///{copy}"


def json_lines(out: str) -> list[dict]:  # type: ignore[type-arg]
    return [orjson.loads(line) for line in out.splitlines()]


def test_messages_shows_the_seq_erase_takes_beside_the_index(chat42: str) -> None:
    """A user erased "row 8" and lost an assistant reply of the first turn: messages numbered
    rows by position, erase takes seqs. Each row now shows both, and the seq of a row erases
    that row's message."""
    shown = rows(cli("messages", "chat-42", store=chat42).stdout)
    assert [(row[0], row[1], row[2]) for row in shown] == [
        ("0", "0", "system"),
        ("1", "11", "system"),  # the summary: its own seq, not those it replaced
        ("2", "4", "user"),
        ("3", "5", "assistant"),
        ("4", "6", "tool"),
        ("5", "7", "assistant"),
        ("6", "9", "user"),
        ("7", "10", "assistant"),
    ]
    as_json = json_lines(cli("messages", "chat-42", "--json", store=chat42).stdout)
    assert [(m["seq"], m["role"]) for m in as_json] == [(int(row[1]), row[2]) for row in shown]
    assert list(as_json[0])[:2] == ["seq", "role"]
    # Row 6 is Alice's thanks, at seq 9: erasing seq 9 erases that row, and only it.
    assert shown[6][3].startswith("Thanks!")
    cli("erase", "chat-42", shown[6][1], "--reason", "request", "--yes", store=chat42)
    after = json_lines(cli("messages", "chat-42", "--json", store=chat42).stdout)
    assert [m["content"] for m in after] == [
        *(m["content"] for m in as_json[:6]),
        "[erased]",
        as_json[7]["content"],
    ]


def test_messages_of_a_replace_event_show_its_seq(tmp_path: Path) -> None:
    path = tmp_path / "edit.sqlite3"

    async def fill() -> None:
        async with SessionActor.open(session_id="e", store=f"sqlite:///{path}") as s:
            for text in ("one", "two", "three"):
                await s.add_message(Message.user(text))
            await s.replace(0, 1, [Message.system("summary"), Message.user("two, kept")])

    anyio.run(fill)
    url = f"sqlite:///{path}"
    shown = rows(cli("messages", "e", store=url).stdout)
    assert [(row[0], row[1], row[3]) for row in shown] == [
        ("0", "3", "summary"),
        ("1", "3", "two, kept"),
        ("2", "2", "three"),
    ]
    assert [m["seq"] for m in json_lines(cli("messages", "e", "--json", store=url).stdout)] == [
        3,
        3,
        2,
    ]
    empty = tmp_path / "empty.sqlite3"

    async def clear() -> None:
        async with SessionActor.open(session_id="gone", store=f"sqlite:///{empty}") as s:
            await s.add_message(Message.user("hi"))
            await s.remove(0, 0)

    anyio.run(clear)
    result = cli("messages", "gone", store=f"sqlite:///{empty}")
    assert result.stdout == "no messages on the surface of 'gone'\n"
    assert cli("messages", "gone", "--json", store=f"sqlite:///{empty}").stdout == ""


def test_the_erase_dry_run_describes_each_event(travel: Path) -> None:
    url = f"sqlite:///{travel}"
    result = cli("erase", "chat-42", "1", "2", "4", "5", "6", "--reason", "r", store=url)
    assert result.stdout.splitlines() == [
        "would erase 6 events of 'chat-42': 1, 2, 4-6, 11",
        "  SEQ  TYPE              NAME          TEXT",
        "    1  user              alice         Hi, I'm Alice. I live at 12 Rue des Lil…",
        "    2  assistant                       Hello Alice! Where would you like to go?",
        "    4  user              bob           Bob here: two seats to Lisbon, please.",
        "    5  assistant                       -> find_flights(c1)",
        '    6  tool              find_flights  [c1] {"flights":3}',
        "   11  system (replace)                Summary: Alice, of 12 Rue des Lilas, wa…",
        "with them, the summaries that cover them: 11",
        "also in: 'chat-42-fork'",
        "dry run: nothing was changed; pass --yes to erase",
    ]
    # An event that is not a message shows its data.
    other = cli("erase", "chat-42", "3", "--reason", "r", store=url).stdout.splitlines()
    assert other[1:3] == ["  SEQ  TYPE      NAME  TEXT", '    3  turn_end        {"turn":1}']
    # The JSON is the result, as before.
    as_json = orjson.loads(
        cli("erase", "chat-42", "1", "2", "--reason", "r", "--json", store=url).stdout
    )
    assert set(as_json) == {
        "session",
        "reason",
        "at",
        "erased",
        "already",
        "absent",
        "sessions",
        "summaries",
        "proven",
        "detail",
        "dry_run",
    }
    assert (as_json["erased"], as_json["summaries"], as_json["dry_run"]) == ([1, 2, 11], [11], True)


def test_snippets_are_one_line_of_forty_characters() -> None:
    from nous_session.cli._common import snippet

    assert snippet("a\nb\tc\r\nd") == "a b c  d"
    assert snippet("x" * 40) == "x" * 40
    assert snippet("x" * 41) == "x" * 39 + "…"
    assert snippet("bell\x07 and \x1b[2J") == "bell\ufffd and \ufffd[2J"


def test_seqs_print_as_ranges() -> None:
    from nous_session.cli._common import seq_ranges

    assert seq_ranges([]) == "none"
    assert seq_ranges([7]) == "7"
    assert seq_ranges([3, 4]) == "3, 4"
    assert seq_ranges([*range(1, 6), 9, *range(12, 200_001)]) == "1-5, 9, 12-200000"
    assert seq_ranges([9, 1, 2, 3, 2, 12, 13, 14, 20]) == "1-3, 9, 12-14, 20"
    assert seq_ranges([0, 2**63 - 2, 2**63 - 1]) == f"0, {2**63 - 2}, {2**63 - 1}"


def test_a_long_erase_prints_ranges_and_details_twenty(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'long.sqlite3'}"
    cli("import", "long", str(_events_file(tmp_path / "long.jsonl", list(range(60)))), store=url)
    seqs = [*range(25), 30, *range(40, 60)]
    result = cli("erase", "long", *map(str, seqs), "--reason", "r", store=url)
    lines = result.stdout.splitlines()
    assert lines[0] == "would erase 46 events of 'long': 0-24, 30, 40-59"
    assert lines[1] == "  SEQ  TYPE  NAME  TEXT"
    assert [line.split() for line in lines[2:22]] == [
        [str(seq), "user", f"m{seq}"] for seq in seqs[:20]
    ]
    assert lines[22:] == [
        "  ... and 26 more (the first line lists them all)",
        "dry run: nothing was changed; pass --yes to erase",
    ]
    done = cli("erase", "long", *map(str, seqs), "--reason", "r", "--yes", store=url)
    assert done.stdout.splitlines()[0] == "erased 46 events of 'long': 0-24, 30, 40-59"
    again = cli("erase", "long", "--all", "--reason", "r", store=url).stdout.splitlines()
    assert again[0] == "would erase 14 events of 'long': 25-29, 31-39"
    assert "erased before: 0-24, 30, 40-59" in again


def test_erase_names_the_summaries_it_erases_with_what_they_cover() -> None:
    """Erasure.summaries (the stores fill it: the summaries that cover an erased event go
    with it), in a dry run and when done, as ranges; no line when there are none."""
    from datetime import UTC, datetime

    from nous_session.cli._erasing import Choice, erasure_lines
    from nous_session.erasure import Erasure

    at = datetime(2026, 1, 1, tzinfo=UTC)
    would = Erasure("s", "r", at, (1, 6, 8, 9, 10), sessions=("f",), dry_run=True)
    would = attrs.evolve(would, summaries=(6, 8, 9, 10))
    lines = list(erasure_lines(would, Choice((1,)), {}))
    assert lines[0] == "would erase 5 events of 's': 1, 6, 8-10"
    assert "with them, the summaries that cover them: 6, 8-10" in lines
    assert lines.index("with them, the summaries that cover them: 6, 8-10") < lines.index(
        "also in: 'f'"
    )
    done = attrs.evolve(would, dry_run=False, proven=True, detail="scrubbed")
    lines = list(erasure_lines(done, Choice((1,)), {}))
    assert lines == [
        "erased 5 events of 's': 1, 6, 8-10",
        "with them, the summaries that covered them: 6, 8-10",
        "also in: 'f'",
        "proven: scrubbed",
    ]
    none = attrs.evolve(done, summaries=())
    assert not [line for line in erasure_lines(none, Choice((1,)), {}) if "summar" in line]


def test_erase_by_role_names_the_summaries_the_store_erases_with_them(
    tmp_path: Path, stored: tuple[str, Path]
) -> None:
    """The summary at seq 6 covers the user's message at seq 1: --role user chooses the user's
    messages, and the store erases the summary with them and names it (it was passed as one of
    the chosen events, and the output did not say why it was there)."""
    _, source = stored
    path = tmp_path / "summary.sqlite3"
    path.write_bytes(source.read_bytes())
    url = f"sqlite:///{path}"
    args = ("erase", "chat", "--role", "user", "--reason", "r")
    found = orjson.loads(cli(*args, "--json", store=url).stdout)
    assert (found["erased"], found["summaries"]) == ([1, 6, 7], [6])
    dry = cli(*args, store=url).stdout.splitlines()
    assert dry[0] == "would erase 3 events of 'chat': 1, 6, 7"
    assert "with them, the summaries that cover them: 6" in dry
    done = cli(*args, "--yes", store=url).stdout.splitlines()
    assert done[:2] == [
        "erased 3 events of 'chat': 1, 6, 7",
        "with them, the summaries that covered them: 6",
    ]
    assert [
        m["content"] for m in json_lines(cli("messages", "chat", "--json", store=url).stdout)
    ] == ["be brief", "[erased]", "[erased]"]


def test_seqs_with_a_name_erase_only_those_that_match(chat42: str) -> None:
    """``erase chat-42 1 4 9 --name alice`` used to be refused with a message that did not
    say why; it erases those of the seqs that are Alice's, and says which were not."""
    args = ("erase", "chat-42", "1", "4", "9", "--name", "alice", "--reason", "request")
    dry = cli(*args, store=chat42).stdout.splitlines()
    assert dry[0] == "would erase 3 events of 'chat-42': 1, 9, 11"
    assert "with them, the summaries that cover them: 11" in dry
    assert "not erased: 4 (not chosen by --name alice)" in dry
    assert orjson.loads(cli(*args, "--json", store=chat42).stdout)["erased"] == [1, 9, 11]
    done = cli(*args, "--yes", store=chat42).stdout.splitlines()
    assert done[:3] == [
        "erased 3 events of 'chat-42': 1, 9, 11",
        "with them, the summaries that covered them: 11",
        "not erased: 4 (not chosen by --name alice)",
    ]
    # Run again: the same answer, nothing more to erase (the erased events have no name to
    # match any more, and are not listed as not chosen).
    again = cli(*args, "--yes", store=chat42).stdout.splitlines()
    assert again[0] == "erased 0 events of 'chat-42': none"
    assert "erased before: 1, 9, 11" in again
    assert "not erased: 4 (not chosen by --name alice)" in again
    contents = {
        event["seq"]: event["data"].get("content")
        for event in json_lines(cli("events", "chat-42", "--json", store=chat42).stdout)
    }
    assert [contents[seq] for seq in (1, 4, 9)] == [
        "[erased]",
        "Bob here: two seats to Lisbon, please.",
        "[erased]",
    ]
    surface = json_lines(cli("messages", "chat-42", "--json", store=chat42).stdout)
    assert [(m["seq"], m["content"]) for m in surface if m["seq"] in (11, 4, 9)] == [
        (11, "[erased]"),
        (4, "Bob here: two seats to Lisbon, please."),
        (9, "[erased]"),
    ]
    # With --role too, both must match.
    both = cli(
        "erase",
        "chat-42",
        "4",
        "7",
        "--role",
        "user",
        "--name",
        "bob",
        "--reason",
        "r",
        store=chat42,
    )
    assert both.stdout.splitlines()[0] == "would erase 1 events of 'chat-42': 4"
    assert "not erased: 7 (not chosen by --role user --name bob)" in both.stdout


def test_seqs_with_a_name_that_match_nothing_or_do_not_exist_are_refused(
    chat42: str, travel: Path
) -> None:
    before = travel.read_bytes()
    nothing = cli(
        "erase",
        "chat-42",
        "2",
        "4",
        "--name",
        "alice",
        "--reason",
        "r",
        "--yes",
        store=chat42,
        check=False,
    )
    assert nothing.returncode == 1
    assert nothing.stderr == (
        "nous-session: error: none of the SEQs given (2, 4) is chosen by --name alice: nothing"
        " to erase (`erase chat-42 --name alice` without SEQs shows the events it chooses)\n"
    )
    missing = cli(
        "erase",
        "chat-42",
        "1",
        "99",
        "--name",
        "alice",
        "--reason",
        "r",
        "--yes",
        store=chat42,
        check=False,
    )
    assert missing.returncode == 1
    assert "cannot erase seq 99" in missing.stderr
    assert (
        cli("events", "chat-42", "--json", store=chat42).stdout
        == cli("events", "chat-42", "--json", store=f"sqlite:///{travel}").stdout
    )
    assert travel.read_bytes() == before


def test_seqs_a_snapshot_dropped_cannot_be_matched(
    tmp_path: Path, stored: tuple[str, Path]
) -> None:
    _, source = stored
    path = tmp_path / "snap.sqlite3"
    path.write_bytes(source.read_bytes())
    url = f"sqlite:///{path}"
    cli("snapshot", "chat", "--yes", store=url)  # drops 1..5: the summary at 6 replaced them
    lines = cli(
        "erase", "chat", "1", "7", "--role", "user", "--reason", "r", store=url
    ).stdout.splitlines()
    assert lines[0] == "would erase 1 events of 'chat': 7"
    assert (
        "not erased: 1 (no longer held by 'chat': a snapshot dropped them, so --role user"
        " cannot be checked)"
    ) in lines


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("3", "--all"),
            "--all erases every event the session wrote itself: give it without SEQs, or SEQs"
            " without --all",
        ),
        (
            ("--all", "--name", "alice"),
            "--all erases every event the session wrote itself, whoever wrote it: give it"
            " without --name alice, or --name alice without --all",
        ),
        (
            (),
            "name the events to erase: SEQs, or --role/--name, or both (only those of the SEQs"
            " that --role/--name choose), or --all",
        ),
        (("3", "--inherited"), "--inherited goes with --all"),
    ],
)
def test_erase_refuses_what_does_not_name_the_events(
    travel: Path, args: tuple[str, ...], message: str
) -> None:
    before = travel.read_bytes()
    result = cli(
        "erase",
        "chat-42",
        *args,
        "--reason",
        "r",
        "--yes",
        store=f"sqlite:///{travel}",
        check=False,
    )
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == f"nous-session: error: {message}\n"
    assert travel.read_bytes() == before


def test_erase_refuses_a_role_that_no_message_has(travel: Path) -> None:
    result = cli(
        "erase",
        "chat-42",
        "--role",
        "usr",
        "--reason",
        "r",
        store=f"sqlite:///{travel}",
        check=False,
    )
    assert result.returncode == 2
    assert "argument --role: invalid choice: 'usr'" in result.stderr


class Terminal(io.StringIO):
    """A stderr that says it is a terminal, and keeps what is written to it."""

    def isatty(self) -> bool:
        return True


def bar_states(written: str) -> list[tuple[str, int, int]]:
    """Each state of the progress bar ``written`` shows: its stage, count and total, in
    order, repeats left out."""
    states: list[tuple[str, int, int]] = []
    for part in written.split("\r"):
        found = re.match(r"(import: [^:]+): +\d+%\|.*?\| (\d+)/(\d+) ", part)
        if found:
            state = (found[1], int(found[2]), int(found[3]))
            if not states or states[-1] != state:
                states.append(state)
    return states


def test_import_shows_its_progress_as_it_reads_writes_and_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bar jumped from 0 to 100%: it was made after every record was read and moved once,
    after the one commit. It advances as records are read and checked; the write, one
    transaction so that an import is all or nothing, is one step, and says so."""
    from nous_session.cli import main

    source = _events_file(tmp_path / "many.jsonl", list(range(5000)))
    url = f"sqlite:///{tmp_path / 'many.sqlite3'}"
    monkeypatch.setenv("TQDM_MININTERVAL", "0")  # tqdm's own settings: show every update
    monkeypatch.setenv("TQDM_MINITERS", "1")
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    out = io.StringIO()
    assert main(["--store", url, "import", "many", str(source)], out=out) == 0
    assert out.getvalue() == f"imported 5000 events from {source} into 'many'\n"
    states = bar_states(terminal.getvalue())
    reading = [(count, total) for stage, count, total in states if stage == "import: reading"]
    assert reading == [(count, 5000) for count in range(0, 5001, 1000)]
    assert [state for state in states if state[0] != "import: reading"] == [
        ("import: writing (one transaction)", 0, 5000),
        ("import: writing (one transaction)", 5000, 5000),
        *(("import: checking", count, 5000) for count in range(0, 5001, 1000)),
    ]
    assert states.index(("import: writing (one transaction)", 0, 5000)) > states.index(
        ("import: reading", 5000, 5000)
    )
    # Not a terminal: no bar, and the same import.
    plain = io.StringIO()
    monkeypatch.setattr(sys, "stderr", plain)
    out = io.StringIO()
    assert main(["--store", url, "import", "again", str(source)], out=out) == 0
    assert out.getvalue() == f"imported 5000 events from {source} into 'again'\n"
    assert plain.getvalue() == ""


@pytest.mark.parametrize("page", ["cli.md", "erasure.md"])
def test_the_console_examples_print_what_the_docs_say(tmp_path: Path, page: str) -> None:
    """Every ``$ nous-session ...`` line of the page's console blocks, run in order on the
    travel chat (``sqlite:///sessions.db`` in the working directory), prints what follows it."""
    text = (Path(__file__).resolve().parents[2] / "docs" / page).read_text(encoding="utf-8")
    steps: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            else:
                steps[-1][1].append(line)
    assert len(steps) >= 2
    anyio.run(travel_chat, tmp_path / "sessions.db")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]
        ),
    }
    for command, expected in steps:
        words = shlex.split(command)
        assert words[0] == "nous-session"
        result = run(*words[1:], cwd=tmp_path, env=env)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines() == expected, command


def test_copy_moves_sessions_to_another_store_and_only_reads_its_own(
    stored: tuple[str, Path], tmp_path: Path
) -> None:
    url, path = stored
    before = {p.name: p.read_bytes() for p in path.parent.iterdir()}
    target = f"sqlite:///{tmp_path / 'moved.sqlite3'}"
    out = cli("copy", "--to", target, store=url).stdout
    assert out == f"copied 1 session to {target}\n"
    assert {p.name: p.read_bytes() for p in path.parent.iterdir()} == before  # only read
    assert cli("events", "chat", "--json", store=target).stdout == (
        cli("events", "chat", "--json", store=url).stdout
    )
    again = orjson.loads(cli("copy", "chat", "--to", target, "--json", store=url).stdout)
    assert again == {
        "copied": [],
        "forked": [],
        "unlinked": {},
        "skipped": {"chat": "the target holds a session of that id"},
    }
    missing = cli("copy", "nope", "--to", target, store=url, check=False)
    assert missing.returncode == 1
    assert missing.stderr == "nous-session: error: no such session in the source: 'nope'\n"


def test_copy_refuses_a_target_that_is_its_source(stored: tuple[str, Path], tmp_path: Path) -> None:
    # A read-only file, named the same way and another: copying a store onto itself would
    # open it for writing (making its -wal and -shm files), to skip every session.
    _, path = stored
    source = tmp_path / "source.sqlite3"
    source.write_bytes(path.read_bytes())
    source.chmod(0o444)
    before = source.read_bytes()
    for to in (f"sqlite:///{source}", f"sqlite:///{tmp_path}/./source.sqlite3"):
        refused = cli("copy", "--to", to, store=f"sqlite:///{source}", check=False)
        assert refused.returncode == 1
        assert refused.stderr == (
            f"nous-session: error: --to names the store the sessions are copied from ({to})\n"
        )
    assert source.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["source.sqlite3"]


def _reads(path: Path, session: str) -> tuple[object, ...]:
    """What a session holds and shows: its events, count, horizon, keys and kept events, its
    surface, and its surface as of every seq (None where that history was dropped)."""

    async def read() -> Any:
        async with SQLiteStore(path) as store:
            return await store.read(session)

    held = anyio.run(read)
    log = Log.restore(held.events, count=held.count, horizon=held.horizon)

    def texts(at: Log) -> list[tuple[int, str]]:
        return [(seq, message.text) for seq, message in at.derive_indexed()]

    as_of: list[object] = []
    for seq in range(log.count):
        try:
            as_of.append(texts(log.upto(seq)))
        except ValueError:
            as_of.append(None)
    return (
        list(held.events),
        held.count,
        held.horizon,
        dict(held.keys),
        list(held.kept),
        texts(log),
        as_of,
    )


def _exported_and_imported(path: Path) -> tuple[object, ...]:
    """Export session "s" of the SQLite file ``path`` and import it as "copy": what "s"
    reads as, checked to be what "copy" reads as and exports as, byte for byte."""
    url = f"sqlite:///{path}"
    exported = path.parent / "s.jsonl"
    cli("export", "s", "--output", str(exported), store=url)
    cli("import", "copy", str(exported), store=url)
    original = _reads(path, "s")
    assert _reads(path, "copy") == original
    assert cli("export", "copy", store=url).stdout.encode() == exported.read_bytes()
    return original


def test_export_and_import_keep_what_a_snapshot_left(tmp_path: Path) -> None:
    """A snapshot that dropped the newest events (a message and the remove that took it off),
    and events it kept aside for an idempotency key: the import has the same count, horizon,
    keys and kept events, so the same as-of reads (it showed a surface at seq 4 that never
    was, took the count back to 8, and dropped the keys, so a retry appended again)."""
    path = tmp_path / "snap.sqlite3"
    url = f"sqlite:///{path}"

    async def fill() -> None:
        async with SessionActor.open(session_id="s", store=url) as session:
            await session.append_many([Message.user(f"m{n}") for n in range(5)], key="k")
            await session.replace(2, 4, Message.system("summary"))  # 5
            await session.append_many([Message.user(f"n{n}") for n in range(3)])  # 6..8
            await session.remove(8, 8)  # 9
            await session.snapshot()

    anyio.run(fill)
    original = _exported_and_imported(path)
    assert original[1:3] == (10, 10)
    assert original[3] == {"k": (0, 5)}

    async def retry() -> int:
        async with SessionActor.open(session_id="copy", store=url) as session:
            await session.append_many([Message.user(f"m{n}") for n in range(5)], key="k")
            return session.log.count

    assert anyio.run(retry) == 10


def test_export_and_import_keep_a_session_a_snapshot_emptied(tmp_path: Path) -> None:
    """A session whose surface was emptied and then snapshotted holds no event: its export is
    the session record alone (with the events kept aside for a key), and it imports as it is
    (it was refused as holding no events); a file with neither is still refused."""
    path = tmp_path / "empty.sqlite3"
    url = f"sqlite:///{path}"

    async def fill() -> None:
        async with SessionActor.open(session_id="s", store=url) as session:
            await session.append_many([Message.user("a"), Message.user("b")], key="k")
            await session.remove(0, 1)  # 2
            await session.snapshot()

    anyio.run(fill)
    original = _exported_and_imported(path)
    assert (original[0], original[1:3]) == ([], (3, 3))
    for name, text in (
        ("nothing", b""),
        ("zero", _record({"session": {"count": 0, "horizon": 0, "keys": []}})),
    ):
        source = tmp_path / f"{name}.jsonl"
        source.write_bytes(text)
        result = cli("import", name, str(source), store=url, check=False)
        assert (result.returncode, "holds no events" in result.stderr) == (1, True)


def _record(value: object) -> bytes:
    return orjson.dumps(value) + b"\n"


_EVENT = {"type": "user_message", "time": "2024-05-01T12:00:00+00:00", "data": {"content": "m"}}


@pytest.mark.parametrize(
    ("records", "error"),
    [
        ([{"session": {"count": 2, "horizon": 3, "keys": []}}], "horizon 3 must be in 0..2"),
        ([{"session": {"count": 1, "horizon": 0, "keys": []}}], "below the events' next seq 2"),
        ([{"session": {"count": 2, "horizon": 0}}], "the session record is an object of"),
        ([{"session": {"count": "2", "horizon": 0, "keys": []}}], "count and horizon are ints"),
        ([{"session": {"count": 2, "horizon": 0, "keys": [["k", 1, 5]]}}], "bad key ['k', 1, 5]"),
        ([{"session": {"count": 2, "horizon": 0, "keys": [["k", 0, 1], ["k", 1, 1]]}}], "bad key"),
        ([{"session": {"count": 2, "horizon": 0, "keys": [["k", 0, 10**9]]}}], "bad key"),
        ([{"kept": {**_EVENT, "seq": 0}}], "line 1: a kept event belongs after the session"),
        (
            [{"session": {"count": 2, "horizon": 2, "keys": []}}, {"kept": {**_EVENT, "seq": 1}}],
            "a kept event is at a seq the session holds",
        ),
        (
            [{"session": {"count": 2, "horizon": 0, "keys": []}}, {"kept": {**_EVENT, "seq": 9}}],
            "or at or past the horizon 0",
        ),
        ([{**_EVENT, "seq": 5}, {"session": {"count": 2, "horizon": 0, "keys": []}}], "line 2"),
    ],
)
def test_import_of_a_tampered_session_record_is_refused_and_makes_nothing(
    tmp_path: Path, records: list[object], error: str
) -> None:
    """A session record (count, horizon, keys) or kept event that does not fit the events is
    refused in one line naming what is wrong, and no session is made."""
    path = tmp_path / "tampered.sqlite3"
    url = f"sqlite:///{path}"
    events = [{**_EVENT, "seq": 0}, {**_EVENT, "seq": 1}]
    source = tmp_path / "tampered.jsonl"
    source.write_bytes(b"".join(map(_record, [*records, *events])))
    result = cli("import", "t", str(source), store=url, check=False)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert error in line
    assert not path.exists() or cli("sessions", "--json", store=url).stdout == ""
