"""docs/logging.md lists every event the library logs, and nothing it does not: an operator
reads there what an event means, at what level it comes, and what follows from it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "nous_session"
CATALOGUE = (ROOT / "docs" / "logging.md").read_text(encoding="utf-8")

# A logger call and its first argument: the event's name (structlog) or message (stdlib).
_CALL = re.compile(
    r"\b(?:_logger|logger)\.(?:debug|info|warning|error|exception|critical)\(\s*\"([^\"]*)\"",
    re.S,
)
# The standard-library logger of the web app logs plain messages; everything else is a
# structlog event named "nous_session.<what>".
_PLAIN_MESSAGES = PACKAGE / "web"


def _logged() -> dict[str, list[str]]:
    """Each first argument of a logger call in the package -> the files it is in."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in _CALL.findall(path.read_text(encoding="utf-8")):
            found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_event_is_named_in_the_library_namespace() -> None:
    unnamed = {
        name: files
        for name, files in _logged().items()
        if not re.fullmatch(r"nous_session\.[a-z_]+", name)
        and not all(file.startswith(str(_PLAIN_MESSAGES.relative_to(ROOT))) for file in files)
    }
    assert not unnamed, f"events not named nous_session.<what>: {unnamed}"


def test_the_catalogue_lists_every_event_logged_and_no_other() -> None:
    logged = {name for name in _logged() if name.startswith("nous_session.")}
    listed = set(re.findall(r"^\| `(nous_session\.[a-z_]+)`", CATALOGUE, re.M))
    assert logged, "no logger call found: the pattern no longer matches the code"
    assert logged - listed == set(), "logged but not in docs/logging.md"
    assert listed - logged == set(), "in docs/logging.md but never logged"


def test_the_catalogue_has_the_web_apps_messages() -> None:
    plain = [name for name, files in _logged().items() if not name.startswith("nous_session.")]
    assert plain, "the web app logs nothing: the pattern no longer matches the code"
    for message in plain:
        # The catalogue shows a message with its %-placeholders filled in: match its words.
        words = [word for word in re.split(r"%[-.\d]*[a-z]", message) if word.strip()]
        first = words[0].strip().strip("'\"")
        assert first in CATALOGUE, f"the web app's message {message!r} is not in the catalogue"
