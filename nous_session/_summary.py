"""Structural summaries: the system message that stands for older messages of a transcript
(one line per message), how to recognise one, and how a new one absorbs it. Re-exported by
:mod:`nous_session.transcript`, which decides when and what to compact."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from nous_session._json import JSON
from nous_session.message import Message, Role

PREVIEW_CHARS = 101
"""How many characters of a message's text its summary line shows."""

SUMMARY_LINES: Final = 200
"""How many lines (the newest) a structural summary keeps by default: enough to read what
happened, and a summary that does not grow with the session (each compaction writes it anew)."""

SUMMARY_METADATA: Final = "compaction"
"""The metadata key that marks a compaction summary (see :func:`summary_info`)."""

STRUCTURAL: Final = "structural"


def summary_line(message: Message) -> str:
    """The line :func:`summarize` writes for one message (see there)."""
    role = message.role
    if role is Role.TOOL:
        return f'  [tool] <result for "{message.name or "unknown"}" omitted from summary>'
    preview = message.text[:PREVIEW_CHARS].replace("\n", " ")
    return f"  [{role}] {preview}"  # a StrEnum formats as its value


def summary_text(lines: Sequence[str]) -> str:
    """The summary's text for the given :func:`summary_line` lines (one per message)."""
    return "\n".join([f"[Compacted {len(lines)} earlier messages]", *lines])


def summary_info(message: Message) -> Mapping[str, Any] | None:
    """What a compaction summary's metadata says about it, or None for any other message.

    A summary made by :func:`summarize` or by a session's compaction is a system message whose
    ``metadata["compaction"]`` is an object with ``"messages"``, the number of original
    messages it covers (an int >= 1, counting through the earlier summaries it absorbed), and
    ``"summarizer"``: ``"structural"`` for :func:`summarize`'s text (then also
    ``"lines_dropped"``), ``"custom"`` for a policy's own summarizer.
    """
    if message.role is not Role.SYSTEM:
        return None
    info = message.metadata.get(SUMMARY_METADATA)
    if not isinstance(info, Mapping):
        return None
    covers = info.get("messages")
    if type(covers) is not int or covers < 1:
        return None
    return info


def summary_covers(messages: Sequence[Message]) -> int:
    """How many original messages a summary of ``messages`` covers: an earlier summary counts
    for the messages it covers (see :func:`summary_info`), any other message for one."""
    total = 0
    for message in messages:
        info = summary_info(message)
        total += 1 if info is None else info["messages"]
    return total


class SummaryBuilder:
    """Builds :func:`summarize`'s text from the newest message back, one message at a time.

    Lines are collected newest first until ``max_lines`` (or ``max_bytes`` of UTF-8) are held;
    older messages are then only counted, so a summary over a long history costs its kept
    lines, not the history. An earlier summary in the input is merged, not nested: a
    structural one gives its own lines (and its count of dropped lines), any other (a custom
    summarizer's) one ``"  [summary] TEXT"`` line with its whole text.
    """

    __slots__ = ("_bytes", "_full", "_kept", "_max_bytes", "_max_lines", "dropped", "messages")

    def __init__(self, max_lines: int = SUMMARY_LINES, max_bytes: int | None = None) -> None:
        if not isinstance(max_lines, int) or isinstance(max_lines, bool) or max_lines < 0:
            raise ValueError(f"max_lines must be an int >= 0, got {max_lines!r}")
        self._max_lines = max_lines
        self._max_bytes = max_bytes
        self._kept: list[str] = []  # newest first
        self._bytes = 0
        self._full = max_lines == 0
        self.messages = 0
        self.dropped = 0

    def _line(self, line: str) -> None:
        if not self._full:
            size = len(line.encode()) + 1
            if len(self._kept) < self._max_lines and (
                self._max_bytes is None or self._bytes + size <= self._max_bytes
            ):
                self._kept.append(line)
                self._bytes += size
                return
            self._full = True
        self.dropped += 1

    def add(self, message: Message) -> None:
        """Add ``message``, older than every message added so far."""
        info = summary_info(message)
        if info is None:
            self.messages += 1
            if self._full:
                self.dropped += 1
            else:
                self._line(summary_line(message))
            return
        self.messages += info["messages"]
        text = message.text
        dropped = info.get("lines_dropped")
        dropped = dropped if type(dropped) is int and dropped > 0 else 0
        if info.get("summarizer") == STRUCTURAL and text.startswith("[Compacted "):
            # Its lines after the header (and after the dropped-lines note, when it has one).
            self.dropped += dropped
            skip = 2 if dropped else 1
            if self._full:
                self.dropped += max(0, text.count("\n") + 1 - skip)
                return
            for line in reversed(text.split("\n")[skip:]):
                self._line(line)
            return
        self._line("  [summary] " + " ".join(text.split("\n")))

    def message(self, created_at: datetime) -> Message:
        """The summary: a system message dated ``created_at``, marked in its metadata."""
        head = [f"[Compacted {self.messages} earlier messages]"]
        if self.dropped:
            head.append(f"  [... {self.dropped} older lines not kept]")
        info: dict[str, JSON] = {
            "messages": self.messages,
            "summarizer": STRUCTURAL,
            "lines_dropped": self.dropped,
        }
        return Message.system(
            "\n".join([*head, *reversed(self._kept)]),
            metadata={SUMMARY_METADATA: info},
            created_at=created_at,
        )


def summarize(old: Sequence[Message], *, max_lines: int = SUMMARY_LINES) -> Message:
    """The structural summary of ``old``: a system message, dated to the first message.

    ``"[Compacted N earlier messages]"``, then one line per message: ``"  [ROLE] PREVIEW"``
    (the first 101 characters of its text, newlines turned into spaces), or
    ``'  [tool] <result for "NAME" omitted from summary>'`` for tool results, whose output
    routinely carries keys and personal data. N counts original messages: an earlier summary
    in ``old`` counts for the messages it covers, and is merged rather than nested (its lines
    are kept once, as they were; a custom summarizer's summary becomes one
    ``"  [summary] TEXT"`` line). Only the newest ``max_lines`` lines are kept; when older ones
    are dropped, a second line says how many: ``"  [... K older lines not kept]"``.

    The result's ``metadata["compaction"]`` marks it as a summary (see :func:`summary_info`),
    so that the next compaction recognises and merges it.

    Raises:
        ValueError: ``old`` is empty, or ``max_lines`` is not an int >= 0.
    """
    if not old:
        raise ValueError("nothing to summarise")
    builder = SummaryBuilder(max_lines)
    for message in reversed(old):
        builder.add(message)
    return builder.message(old[0].created_at)
