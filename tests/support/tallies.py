"""How much the models ran, summed over pytest-xdist's workers, for the terminal summary."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest


class Tallies:
    """Lines for the terminal summary that say how much a model ran ("engine model (ci
    profile): 4,000 steps ..."): CI prints them, a test itself prints nothing.

    A test adds counts under a line's template; under pytest-xdist each worker hands its
    counts to the controller when it finishes, which sums them before it prints.
    """

    name = "nous-session-tallies"
    key = "nous_session_tallies"

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.lines: dict[str, Counter[str]] = {}

    def add(self, template: str, **counts: int) -> None:
        """Add ``counts`` to the line ``template.format(**counts)`` will print."""
        self.lines.setdefault(template, Counter()).update(counts)

    def pytest_sessionfinish(self) -> None:
        output = getattr(self.config, "workeroutput", None)  # set on an xdist worker
        if output is not None:
            output[self.key] = {template: dict(c) for template, c in self.lines.items()}

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        for template, counts in getattr(node, "workeroutput", {}).get(self.key, {}).items():
            self.add(template, **counts)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        for template, counts in self.lines.items():
            terminalreporter.write_line(template.format_map(counts))
