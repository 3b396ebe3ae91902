"""Helpers for tests that run child processes."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import uuid
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import pytest

WORKER = Path(__file__).parent / "store_worker.py"


class Lines:
    """A child's stdout, read line by line with a deadline (a stuck child fails, never hangs)."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self._queue: queue.Queue[str] = queue.Queue()
        assert process.stdout is not None
        stdout = process.stdout
        threading.Thread(target=self._pump, args=(stdout,), daemon=True).start()

    def _pump(self, stdout: object) -> None:
        try:
            for line in stdout:  # type: ignore[attr-defined]
                self._queue.put(line)
        except (ValueError, OSError):
            # The test closed the pipe (after killing the child) while this thread was still
            # reading it: that is the end of the output too, not an error of the thread's.
            pass
        self._queue.put("")  # end of output

    def next(self, timeout: float = 30) -> str:
        """The next line ("" at the end of output); raises queue.Empty after ``timeout``."""
        return self._queue.get(timeout=timeout)


@contextmanager
def ending(process: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """Kill ``process`` if it still runs when the block ends: a test that fails while a
    child follows a store fails, where ``Popen``'s own exit would wait for the child forever
    (``with Popen(...) as child, ending(child):``)."""
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()


def spawn_worker(*args: str) -> subprocess.Popen[str]:
    """Start ``store_worker.py`` with ``args`` (see its docstring)."""
    return subprocess.Popen([sys.executable, str(WORKER), *args], stdout=subprocess.PIPE, text=True)


def run_writers(
    url: str, session_id: str, writers: int, producers: int, each: int, mode: str = "raise"
) -> list[tuple[int, str]]:
    """Run ``writers`` processes appending to one session; return every (seq, content) acked."""
    children = [
        spawn_worker("write", url, session_id, f"w{i}", str(producers), str(each), mode)
        for i in range(writers)
    ]
    acks: list[tuple[int, str]] = []
    try:
        for child in children:
            lines = Lines(child)
            while line := lines.next(timeout=120):
                if line.startswith("ack "):
                    _, seq, content = line.rstrip("\n").split(" ", 2)
                    acks.append((int(seq), content))
    finally:
        for child in children:
            child.wait(timeout=120)
            assert child.stdout is not None
            child.stdout.close()
    assert all(child.returncode == 0 for child in children)
    return acks


def check_shared_session(
    acks: list[tuple[int, str]], stored: list[tuple[int, str]], producers: int, each: int
) -> None:
    """Each acked event stored once as acked, seqs contiguous, per-producer order kept."""
    assert [seq for seq, _ in stored] == list(range(len(stored))), "seqs must be contiguous"
    assert sorted(acks) == stored, "every acknowledged event is stored once, as acknowledged"
    order: dict[str, list[int]] = defaultdict(list)
    for _, content in stored:
        writer, producer, n = content.split()
        order[f"{writer} {producer}"].append(int(n))
    assert all(ns == list(range(each)) for ns in order.values()), "each producer's order is kept"
    assert len(order) * each == len(stored)


def shared_store_url(kind: str, tmp_path: Path, name: str) -> Iterator[str]:
    """A store URL every process of a test reaches, for a fixture to yield from: a SQLite
    file, a PostgreSQL schema of the test's own (dropped after it), or the same through
    PgBouncer in transaction pooling mode (its change feed connects directly). Skips when the
    server is not given (``NOUS_SESSION_TEST_POSTGRES``, ``NOUS_SESSION_TEST_PGBOUNCER``)."""
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / f'{name}.sqlite3'}"
        return
    postgres = os.environ.get("NOUS_SESSION_TEST_POSTGRES")
    pgbouncer = os.environ.get("NOUS_SESSION_TEST_PGBOUNCER")
    if not postgres:
        pytest.skip("no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES")
    if kind == "pgbouncer" and not pgbouncer:
        pytest.skip("no PgBouncer: set NOUS_SESSION_TEST_PGBOUNCER")
    psycopg = pytest.importorskip("psycopg")
    schema = f"{name[0]}_{uuid.uuid4().hex[:12]}"
    if kind == "postgres":
        separator = "&" if "?" in postgres else "?"
        yield f"{postgres}{separator}schema={schema}"
    else:
        assert pgbouncer is not None
        separator = "&" if "?" in pgbouncer else "?"
        direct = quote(postgres, safe="")
        yield f"{pgbouncer}{separator}schema={schema}&pooled=true&direct_url={direct}"
    with psycopg.connect(postgres, autocommit=True) as connection:
        connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
