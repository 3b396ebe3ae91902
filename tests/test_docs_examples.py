"""The documentation's examples run as written: every Python block of README.md and docs/
marked runnable (an ``<!-- run -->`` line right before its fence) is executed as a script of
its own, in an empty directory, so a renamed parameter or a changed result fails here. Every
history those examples show the model goes to every provider with ``strict=True`` (see
tests/support/doc_example.py).

A block is marked when it runs standalone with the test dependencies: no server, no API key,
no other process. Pages other work is rewriting now are left out (LEFT_OUT).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "tests" / "support" / "doc_example.py"
MARKER = "<!-- run -->"
LEFT_OUT = {"docs/cli.md", "docs/erasure.md", "docs/ui-streams.md"}
_BLOCK = re.compile(r"^<!-- run -->\n```python\n(.*?)^```$", re.S | re.M)


def pages() -> list[Path]:
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [page for page in found if page.relative_to(ROOT).as_posix() not in LEFT_OUT]


def examples() -> list[pytest.ParameterSet]:
    out = []
    for page in pages():
        name = page.relative_to(ROOT).as_posix()
        for n, block in enumerate(_BLOCK.findall(page.read_text(encoding="utf-8"))):
            out.append(pytest.param(block, id=f"{name}#{n}"))
    return out


EXAMPLES = examples()


def test_the_marker_always_opens_a_python_block() -> None:
    # A marker that opens nothing (a blank line after it, another language) would skip an
    # example without a word.
    for page in pages():
        text = page.read_text(encoding="utf-8")
        markers = re.findall(rf"^{re.escape(MARKER)}$", text, re.M)
        assert len(markers) == len(_BLOCK.findall(text)), page


def test_the_guides_examples_are_marked() -> None:
    marked = {param.id.split("#")[0] for param in EXAMPLES}  # type: ignore[union-attr]
    assert {
        "README.md",
        "docs/index.md",
        "docs/getting-started.md",
        "docs/compaction.md",
        "docs/formats.md",
        "docs/formats-fidelity.md",
        "docs/history.md",
        "docs/many-sessions.md",
        "docs/metadata.md",
        "docs/retention.md",
    } <= marked


@pytest.mark.parametrize("code", EXAMPLES)
def test_the_example_runs(code: str, tmp_path: Path) -> None:
    result = run(code, tmp_path)
    assert result.returncode == 0, result.stderr


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


def run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        # Where a default store would go: inside the test's directory, never the user's home.
        "NOUS_SESSION_HOME": str(tmp_path / "home"),
    }
    env.pop("NOUS_SESSION_STORE", None)
    return subprocess.run(
        [sys.executable, "-W", "error", str(RUNNER), str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
        check=False,
    )
