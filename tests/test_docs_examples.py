"""The documentation's examples run as written: every block of README.md and docs/ marked
runnable (an ``<!-- run -->`` line right before its fence) is executed, so a renamed parameter
or a changed result fails here.

* A Python block runs as a script of its own, in an empty directory; a block whose fence names
  a file (```` ```python title="bot.py" ````, as the site shows it) is saved under that name
  first. Every history those examples show the model goes to every provider with
  ``strict=True`` (see tests/support/doc_example.py).
* A ``sh`` block runs in ``sh -e``, with ``nous-session`` and ``python`` on the PATH standing
  for this interpreter (``python -m nous_session``, ``python``), warnings as errors.
* The pages in STEPS are walk-throughs: their blocks run in order, in one directory, each
  finding what the blocks before it left there.
* A block marked ``<!-- run: postgres -->`` needs a PostgreSQL server: it runs only when
  NOUS_SESSION_TEST_POSTGRES is set, with every ``postgresql://localhost/bot`` in it standing
  for that server, in a schema of the test's own (dropped after it). Without a server the
  test skips at the first such block, once the blocks before it have run.

A block is marked when it runs with the test dependencies: no API key, no other process, and
no server but PostgreSQL. Pages other work is rewriting now are left out (LEFT_OUT).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "tests" / "support" / "doc_example.py"
LEFT_OUT = {"docs/cli.md", "docs/erasure.md", "docs/ui-streams.md"}
STEPS = {"docs/tutorial.md"}
POSTGRES_IN_DOCS = "postgresql://localhost/bot"
_MARKER = re.compile(r"^<!-- run\b.*$", re.M)
_BLOCK = re.compile(
    r"^<!-- run(?P<postgres>: postgres)? -->\n"
    r"```(?P<lang>python|sh)(?P<attrs>(?: [^\n]*)?)\n(?P<code>.*?)^```$",
    re.S | re.M,
)
_TITLE = re.compile(r'\btitle="([\w.-]+)"')


@dataclass(frozen=True)
class Block:
    """One runnable block: ``lang`` python or sh; ``file``, the name a Python block is saved
    under; ``postgres``, whether it needs the server."""

    where: str
    lang: str
    code: str
    file: str
    postgres: bool


def pages() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [page for page in found if page.relative_to(ROOT).as_posix() not in LEFT_OUT]


def blocks(page: Path) -> list[Block]:
    name = page.relative_to(ROOT).as_posix()
    out = []
    for n, match in enumerate(_BLOCK.finditer(page.read_text(encoding="utf-8"))):
        title = _TITLE.search(match["attrs"])
        out.append(
            Block(
                where=f"{name}#{n}",
                lang=match["lang"],
                code=match["code"],
                file=title[1] if title else "example.py",
                postgres=bool(match["postgres"]),
            )
        )
    return out


def examples() -> list[pytest.ParameterSet]:
    out = []
    for page in pages():
        name = page.relative_to(ROOT).as_posix()
        found = blocks(page)
        if name in STEPS:
            out.append(pytest.param(found, id=name))
        else:
            out.extend(pytest.param([block], id=block.where) for block in found)
    return out


EXAMPLES = examples()


def test_the_marker_always_opens_a_block() -> None:
    # A marker that opens nothing (a blank line after it, another language, a misspelt
    # marker) would skip an example without a word.
    for page in pages():
        text = page.read_text(encoding="utf-8")
        assert len(_MARKER.findall(text)) == len(_BLOCK.findall(text)), page


def test_the_guides_examples_are_marked() -> None:
    marked = {param.id.split("#")[0] for param in EXAMPLES}  # type: ignore[union-attr]
    assert {
        "README.md",
        "docs/index.md",
        "docs/getting-started.md",
        "docs/tutorial.md",
        "docs/compaction.md",
        "docs/formats.md",
        "docs/formats-fidelity.md",
        "docs/history.md",
        "docs/many-sessions.md",
        "docs/metadata.md",
        "docs/retention.md",
    } <= marked


def test_the_tutorial_has_every_kind_of_step() -> None:
    steps = blocks(ROOT / "docs" / "tutorial.md")
    assert {(block.lang, block.postgres) for block in steps} == {
        ("python", False),
        ("sh", False),
        ("python", True),
        ("sh", True),
    }
    # The PostgreSQL steps come last: without a server, the test runs all the others.
    first = next(n for n, block in enumerate(steps) if block.postgres)
    assert all(block.postgres for block in steps[first:])


@pytest.mark.parametrize("steps", EXAMPLES)
def test_the_example_runs(steps: Sequence[Block], tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    needs_server = any(block.postgres for block in steps)
    with postgres_schema() if needs_server else nullcontext() as url:
        for block in steps:
            code = block.code
            if block.postgres:
                if url is None:
                    pytest.skip(
                        f"{block.where} and after need PostgreSQL: set NOUS_SESSION_TEST_POSTGRES"
                    )
                assert POSTGRES_IN_DOCS in code, f"{block.where} names no {POSTGRES_IN_DOCS}"
                code = code.replace(
                    POSTGRES_IN_DOCS, shlex.quote(url) if block.lang == "sh" else url
                )
            if block.lang == "sh":
                result = run_sh(code, tmp_path, cwd=work)
            else:
                result = run(code, tmp_path, cwd=work, file=block.file)
            assert result.returncode == 0, f"{block.where}:\n{result.stdout}\n{result.stderr}"


def test_a_history_a_provider_would_reject_fails_the_example(tmp_path: Path) -> None:
    code = """
import anyio
from nous_session import Message, SessionActor, ToolCall

async def main():
    async with SessionActor.open(session_id="s") as session:
        await session.add_message(Message.user("Weather?"))
        await session.add_message(Message.assistant(tool_calls=[ToolCall("c1", "f", {})]))
        await session.add_message(Message.user("Hello?"))
        session.messages()

anyio.run(main)
"""
    result = run(code, tmp_path)
    assert result.returncode == 1
    assert "InvalidHistoryError: openai-chat would reject this history" in result.stderr


def test_a_failing_shell_step_fails_the_example(tmp_path: Path) -> None:
    # Each command counts (sh -e), and nous-session is this interpreter's, not one installed.
    ok = run_sh(
        'test "$(command -v nous-session)" = "$PWD/bin/nous-session"\n'
        "nous-session --store memory: sessions\n",
        tmp_path,
    )
    assert ok.returncode == 0, ok.stderr
    failed = run_sh(
        "nous-session --store memory: sessions\nnous-session no-such-verb\necho after\n", tmp_path
    )
    assert failed.returncode != 0
    assert "after" not in failed.stdout


def environment(tmp_path: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        # Where a default store would go: inside the test's directory, never the user's home.
        "NOUS_SESSION_HOME": str(tmp_path / "home"),
    }
    env.pop("NOUS_SESSION_STORE", None)
    return env


def run(
    code: str, tmp_path: Path, *, cwd: Path | None = None, file: str = "example.py"
) -> subprocess.CompletedProcess[str]:
    """Save ``code`` as ``file`` in ``cwd`` (default ``tmp_path``) and run it there."""
    cwd = cwd or tmp_path
    script = cwd / file
    script.write_text(code, encoding="utf-8")
    return subprocess.run(
        [sys.executable, "-W", "error", str(RUNNER), str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=environment(tmp_path),
        check=False,
    )


def run_sh(
    code: str, tmp_path: Path, *, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with ``sh -e`` in ``cwd`` (default ``tmp_path``); ``nous-session`` and
    ``python`` are this interpreter's (commands in ``tmp_path/bin``, first on the PATH)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    python = shlex.quote(sys.executable)
    for name, command in [
        ("nous-session", f"{python} -W error -m nous_session"),
        ("python", f"{python} -W error"),
    ]:
        shim = bin_dir / name
        shim.write_text(f'#!/bin/sh\nexec {command} "$@"\n', encoding="utf-8")
        shim.chmod(0o755)
    env = environment(tmp_path)
    env["PATH"] = os.pathsep.join([str(bin_dir), env.get("PATH", "")])
    return subprocess.run(
        ["sh", "-e", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd or tmp_path,
        env=env,
        check=False,
    )


@contextmanager
def postgres_schema() -> Iterator[str | None]:
    """The test server's URL with a schema of its own (dropped after), or None without one."""
    base = os.environ.get("NOUS_SESSION_TEST_POSTGRES")
    if not base:
        yield None
        return
    schema = f"docs_{uuid.uuid4().hex[:12]}"
    parts = urlsplit(base)
    query = f"{parts.query}&schema={schema}" if parts.query else f"schema={schema}"
    try:
        yield urlunsplit(parts._replace(query=query))
    finally:
        import psycopg

        with psycopg.connect(base, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
