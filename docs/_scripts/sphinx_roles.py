"""A griffe extension for the docs build: the docstrings' Sphinx roles as mkdocstrings links.

The package's docstrings name other objects the Sphinx way (``:class:`~nous_session.log.Log```,
``:meth:`open```). mkdocstrings reads Markdown, so this rewrites each role into an autorefs
cross-reference (``[`Log`][nous_session.log.Log]``), which the Python handler resolves in the
docstring's scope (``scoped_crossrefs``); one it cannot resolve fails ``mkdocs build --strict``.
Names in other projects (the standard library, anyio, the frameworks) have no page here and
become plain code.
"""

from __future__ import annotations

import builtins
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(class|func|meth|attr|mod|exc|data|obj|const):`(~?)([^`<>]+)`")


def _link(match: re.Match[str]) -> str:
    role, short, target = match.groups()
    target = target.strip().lstrip(".").removesuffix("()")
    shown = target.rsplit(".", 1)[-1] if short else target
    if role in ("func", "meth"):
        shown += "()"
    first = target.split(".", 1)[0]
    private = any(part.startswith("_") and not part.startswith("__") for part in target.split("."))
    theirs = "." in target and first != "nous_session" and first.islower()
    if private or theirs or hasattr(builtins, first):
        # A built-in, another project's (sqlite3.connect, anyio.to_thread) or a private
        # module's: no page here.
        return f"`{shown}`"
    return f"[`{shown}`][{target}]"


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring the loader reads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring, if it has one."""
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_link, obj.docstring.value)
