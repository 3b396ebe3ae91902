"""Run one documentation example as a script, as a reader who pasted it into a file would:
``python tests/support/doc_example.py example.py``.

Every history a session shows the model (``SessionActor.messages()``) is also sent to every
provider with ``to_provider(..., strict=True)``: the examples build histories that every
provider takes, with nothing lost.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence

from nous_session.actor import SessionActor
from nous_session.formats import PROVIDERS, to_provider
from nous_session.message import Message

_messages = SessionActor.messages


def _strict_messages(self: SessionActor) -> Sequence[Message]:
    shown = _messages(self)
    for provider in PROVIDERS:
        to_provider(shown, provider, strict=True)
    return shown


SessionActor.messages = _strict_messages  # type: ignore[method-assign]  # the check above
runpy.run_path(sys.argv[1], run_name="__main__")
