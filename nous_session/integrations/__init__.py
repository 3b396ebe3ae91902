"""Adapters that let agent frameworks keep their conversations in nous_session.

Each adapter is a module of its own, imported by path, and needs the framework it adapts,
installed through the extra of the same name (``pip install 'nous_session[openai-agents]'``).
Importing an adapter without its framework raises ``ImportError`` naming the extra.
Nothing here is imported by ``nous_session`` itself.
"""

from __future__ import annotations

__all__: list[str] = []
