"""The README's tour stays true: its example runs and prints what it says, its links lead to
pages that exist, and neither it nor the documentation pages name internal issue numbers."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    assert blocks, "the README has no Python example"
    # In a process of its own, as a reader runs it: its SQLite file goes in tmp_path.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-c", blocks[0]],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[summary] Paris: 18C.", "4 6"]
    assert (tmp_path / "sessions.sqlite3").exists()


def test_links_lead_to_files_that_exist() -> None:
    links = re.findall(r"\]\(([^)#]+)\)", README)
    assert links
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing


def test_no_internal_issue_numbers() -> None:
    pages = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]
    assert len(pages) > 10
    named = [str(page) for page in pages if re.search(r"issue ?\d", page.read_text(), re.I)]
    assert not named
