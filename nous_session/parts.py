"""Content parts: the typed, ordered pieces of a message's content.

A :class:`~nous_session.message.Message` whose content is not a plain string holds a tuple of
parts, in the order the model saw or wrote them:

* :class:`TextPart`: text.
* :class:`ImagePart`: an image by URL, by base64 data with its media type, or by a provider's
  file id; OpenAI's ``detail`` rides along.
* :class:`ThinkingPart`: the model's reasoning, with the opaque signature (Anthropic's
  ``signature``, Gemini's ``thoughtSignature``, OpenAI's ``encrypted_content``) of the provider
  that issued it, and OpenAI's reasoning summary and item id.
* :class:`RedactedThinkingPart`: reasoning the provider handed over only as opaque data.
* :class:`ToolCallPart`: where the message's ``tool_calls[index]`` sits among the other parts
  (Anthropic and Gemini interleave text, thinking and tool calls).
* :class:`ProviderPart`: a block of one provider's own format that has no neutral equivalent
  (an Anthropic document, an OpenAI file input, a Gemini code execution result...), verbatim.
* :class:`OtherPart`: any other JSON object with a string ``type``, kept exactly as given. This
  is what content parts of earlier versions that are none of the above become.

Every part is a frozen value and also a read-only ``Mapping`` of its JSON form (the form the
log stores, ``part.to_json()``), so ``part["type"]``, ``part.get("text")`` and ``dict(part)``
work as they did for plain mappings, and a part equals a mapping with the same JSON.

``provider_data`` on a part (and on messages and tool calls) holds, per provider name, the
fields of that provider's form which have no neutral field (Anthropic's ``cache_control``, an
OpenAI annotation list, a Gemini ``thoughtSignature`` on a text part...). A provider's entry is
sent back only to that provider; see :mod:`nous_session.formats`.
"""

from __future__ import annotations

from collections.abc import Mapping

from nous_session._part_types import (
    PART_TYPES,
    ImagePart,
    OtherPart,
    Part,
    ProviderData,
    ProviderPart,
    RedactedThinkingPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
)
from nous_session._part_types import optional_str as optional_str
from nous_session._part_types import provider_data as provider_data
from nous_session._part_types import provider_data_json as provider_data_json
from nous_session._part_types import read_only_json_object as read_only_json_object
from nous_session._parts_stored import stored_part as stored_part

__all__ = [
    "ImagePart",
    "OtherPart",
    "Part",
    "ProviderData",
    "ProviderPart",
    "RedactedThinkingPart",
    "TextPart",
    "ThinkingPart",
    "ToolCallPart",
    "as_part",
]


def as_part(value: object, what: str = "content part") -> Part:
    """Return ``value`` as a content part.

    A part is returned as is. A mapping is copied as JSON and read like the log reads stored
    parts: the typed part when it is exactly one's JSON form (``{"type": "text", "text": "hi"}``
    is a :class:`TextPart`), else an :class:`OtherPart` holding it.

    Args:
        value: a part, or a JSON object with a string ``type``.
        what: how error messages name the value.

    Returns:
        The part.

    Raises:
        ValueError: ``value`` is not a mapping of JSON, has no string ``type``, or is a text part
            without a string ``text``.
    """
    # A dict first: the part classes are Mappings (ABCs), whose isinstance checks cost; for a
    # part, the exact-type test against each class hits at once.
    if type(value) is not dict and isinstance(value, PART_TYPES):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be a part or a mapping, not {type(value).__name__}")
    # A dict of its own over the fresh JSON copy, which the part may keep.
    data = dict(read_only_json_object(value, what))
    kind = data.get("type")
    if not isinstance(kind, str):
        raise ValueError(f'{what} needs a string "type"')
    if kind == "text" and not isinstance(data.get("text"), str):
        raise ValueError(f'{what} is a text part without a string "text"')
    return stored_part(data)
