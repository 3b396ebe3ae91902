"""An HTTP request's ASGI scope, for tests that drive a Starlette app directly (to watch a
response as it streams, or a body as the app reads it), where httpx's ASGI transport answers
only once a response is complete."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from starlette.types import Scope


def http_scope(
    method: str,
    target: str,
    headers: Mapping[str, str] | Sequence[tuple[str, str]] = (),
) -> Scope:
    """The scope of a ``method`` request for ``target`` (a path, with an optional ``?query``)
    from 127.0.0.1 to 127.0.0.1:8000, with ``headers`` after its ``host``."""
    path, _, query = target.partition("?")
    items = headers.items() if isinstance(headers, Mapping) else headers
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": query.encode(),
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            *((key.lower().encode(), value.encode()) for key, value in items),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
