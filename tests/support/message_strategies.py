"""Hypothesis strategies for messages with every kind of content part (shared by test files)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import strategies as st

from nous_session import (
    ImagePart,
    Message,
    OtherPart,
    ProviderPart,
    RedactedThinkingPart,
    Role,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolCallPart,
)

T0 = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)

texts = st.text(max_size=8)
names = st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=6)
scalars = st.none() | st.booleans() | st.integers() | texts  # any size: kept exactly
json_values = st.recursive(
    scalars | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=3),
    max_leaves=6,
)
json_objects = st.dictionaries(texts, json_values, max_size=3)
provider_names = st.sampled_from(["anthropic", "gemini", "openai-chat", "openai-responses", "x"])
provider_datas = st.dictionaries(provider_names, json_objects, max_size=2)


def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


text_parts = st.builds(TextPart, texts, provider_data=provider_datas)
image_parts = st.one_of(
    st.builds(
        lambda u, d, pd: ImagePart(u, detail=d, provider_data=pd),
        texts,
        optional(names),
        provider_datas,
    ),
    st.builds(
        lambda data, mt, d: ImagePart(data=data, media_type=mt, detail=d),
        texts,
        st.sampled_from(["image/png", "image/jpeg"]),
        optional(names),
    ),
    st.builds(lambda f, mt: ImagePart(file_id=f, media_type=mt), names, optional(names)),
)
thinking_parts = st.builds(
    ThinkingPart,
    texts,
    signature=optional(texts),
    summary=optional(st.lists(texts, max_size=2)),
    id=optional(names),
    provider=optional(provider_names),
    provider_data=provider_datas,
)
redacted_parts = st.builds(
    RedactedThinkingPart, texts, provider=optional(provider_names), provider_data=provider_datas
)
tool_call_parts = st.builds(ToolCallPart, st.integers(0, 3))
provider_parts = st.builds(ProviderPart, provider_names, json_objects)
# Objects with a type that no typed part has, or a typed part's type with a foreign key.
other_parts = st.one_of(
    st.builds(lambda extra: OtherPart({"type": "image_url", **extra}), json_objects),
    st.builds(lambda t, v: OtherPart({"type": "text", "text": t, "zz": v}), texts, json_values),
    st.builds(lambda v: OtherPart({"type": "image", "zz": v}), json_values),
)
parts = st.one_of(
    text_parts,
    image_parts,
    thinking_parts,
    redacted_parts,
    tool_call_parts,
    provider_parts,
    other_parts,
)
# Plain mappings, as callers of earlier versions gave them.
mapping_parts = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, texts),
    st.builds(lambda u: {"type": "image_url", "url": u}, texts),
    st.builds(lambda u: {"type": "image_url", "image_url": {"url": u}}, texts),
)
contents = st.one_of(
    st.none(), texts, st.lists(st.one_of(parts, mapping_parts), max_size=4).map(tuple)
)
tool_calls = st.builds(
    ToolCall,
    texts,
    names,
    st.one_of(texts, json_objects),
    item_id=optional(names),
    status=optional(st.sampled_from(["completed", "in_progress"])),
    provider_data=provider_datas,
)
messages = st.builds(
    Message,
    st.sampled_from(list(Role)),
    contents,
    reasoning_content=optional(texts),
    tool_calls=st.lists(tool_calls, max_size=2),
    tool_call_id=optional(texts),
    name=optional(texts),
    metadata=st.dictionaries(texts, json_values, max_size=2),
    created_at=st.datetimes(
        min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
    ),
    is_error=st.booleans(),
    provider_data=provider_datas,
)
