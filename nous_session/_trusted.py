"""Building a :class:`~nous_session.message.Message` without its checks or copies, from
fields already validated: the projection of a logged event, and the constructors' common
case (see docs/internals.md, "Values, formats and integrations")."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from nous_session._json import JSON
    from nous_session.message import Message, Role, ToolCall
    from nous_session.parts import Part, ProviderData

__all__ = ["trusted_builder"]

_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})

# Message's fields, in the order the builder takes them.
_SLOTS: Final = (
    "role",
    "content",
    "reasoning_content",
    "tool_calls",
    "tool_call_id",
    "name",
    "metadata",
    "created_at",
    "is_error",
    "provider_data",
)


def trusted_builder(message_class: type[Message]) -> Callable[..., Message]:
    """A function that builds a ``message_class`` value from its ten fields in :data:`_SLOTS`
    order (``is_error`` and ``provider_data`` optional), without checks or copies: every
    argument must already have the type and form the constructor would give it. Each module
    that needs one makes its own (message.py for its constructors, event.py for the
    projection)."""
    # The slots' own descriptors set a frozen value's fields faster than object.__setattr__,
    # and closure cells are the fastest way to reach them. This is the projection's hot path.
    new = object.__new__
    (
        set_role,
        set_content,
        set_reasoning,
        set_calls,
        set_call_id,
        set_name,
        set_metadata,
        set_created_at,
        set_is_error,
        set_provider_data,
    ) = (getattr(message_class, slot).__set__ for slot in _SLOTS)

    def trusted(
        role: Role,
        content: str | tuple[Part, ...] | None,
        reasoning_content: str | None,
        tool_calls: tuple[ToolCall, ...],
        tool_call_id: str | None,
        name: str | None,
        metadata: Mapping[str, JSON],
        created_at: datetime,
        is_error: bool = False,
        provider_data: ProviderData = _EMPTY,
    ) -> Message:
        message: Message = new(message_class)
        set_role(message, role)
        set_content(message, content)
        set_reasoning(message, reasoning_content)
        set_calls(message, tool_calls)
        set_call_id(message, tool_call_id)
        set_name(message, name)
        set_metadata(message, metadata)
        set_created_at(message, created_at)
        set_is_error(message, is_error)
        set_provider_data(message, provider_data)
        return message

    return trusted
