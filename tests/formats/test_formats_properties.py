"""Properties of the provider converters, over generated messages and payloads.

* Messages in each provider's canonical form (the form reading gives) come back equal:
  ``from_provider(to_provider(x, p), p) == x``, nothing dropped, and the payload is valid for the
  provider's SDK.
* Payloads of each provider, odd groupings and extra fields included, come back exactly:
  ``to_provider(from_provider(payload, p), p) == payload``.
* Any message list converts to every provider without error; what comes out is valid for the
  SDK and reads back to the same payload.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from nous_session import (
    ImagePart,
    InvalidHistoryError,
    Message,
    RedactedThinkingPart,
    Role,
    TextPart,
    ThinkingPart,
    ToolCall,
)
from nous_session.formats import PROVIDERS, convert, from_provider, to_provider
from nous_session.formats._common import same
from nous_session.formats._tool_calls import arrange, named_from_calls
from tests.support.message_strategies import T0
from tests.support.sdk_validation import validate

# Building blocks ------------------------------------------------------------------------------

texts = st.text(max_size=12)
nonempty = st.text(min_size=1, max_size=12)
names = st.from_regex(r"[a-z][a-z0-9_]{0,7}", fullmatch=True)
ids = st.from_regex(r"(call|toolu|fc)_[A-Za-z0-9]{1,8}", fullmatch=True)
b64 = st.binary(max_size=9).map(lambda raw: base64.b64encode(raw).decode())
urls = st.from_regex(r"https://example\.com/[a-z]{1,6}\.(png|jpg)", fullmatch=True)
media_types = st.sampled_from(["image/png", "image/jpeg", "image/gif", "image/webp"])
details = st.sampled_from(["auto", "low", "high"])
scalars = st.none() | st.booleans() | st.integers(-1000, 1000) | texts
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(names, children, max_size=3),
    max_leaves=5,
)
objects = st.dictionaries(names, json_values, max_size=3)
argument_strings = st.one_of(
    objects.map(lambda value: json.dumps(value, separators=(",", ":"))),
    objects.map(json.dumps),
    texts,  # the model does not always write JSON
)


def optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


def message(role: Role, content: Any, **fields: Any) -> Message:
    return Message(role, content, created_at=T0, **fields)


def plain_texts(min_size: int = 0) -> st.SearchStrategy[tuple[TextPart, ...]]:
    return st.lists(st.builds(TextPart, texts), min_size=min_size, max_size=3).map(tuple)


# Canonical messages, per provider -------------------------------------------------------------

chat_images = st.one_of(
    st.builds(lambda url, d: ImagePart(url, detail=d), urls, optional(details)),
    st.builds(
        lambda data, mt, d: ImagePart(data=data, media_type=mt, detail=d),
        b64,
        media_types,
        optional(details),
    ),
)
chat_calls = st.builds(ToolCall, ids, names, argument_strings)
chat_messages = st.one_of(
    st.builds(
        lambda role, content, name: message(role, content, name=name),
        st.sampled_from([Role.SYSTEM, Role.DEVELOPER]),
        texts | plain_texts(),
        optional(names),
    ),
    st.builds(
        lambda content, name: message(Role.USER, content, name=name),
        texts | st.lists(st.builds(TextPart, texts) | chat_images, max_size=3).map(tuple),
        optional(names),
    ),
    st.builds(
        lambda content, calls, reasoning, name: message(
            Role.ASSISTANT, content, tool_calls=calls, reasoning_content=reasoning, name=name
        ),
        st.none() | texts | plain_texts(),
        st.lists(chat_calls, max_size=2),
        optional(texts),
        optional(names),
    ),
    st.builds(
        lambda content, ident: message(Role.TOOL, content, tool_call_id=ident),
        texts | plain_texts(),
        ids,
    ),
    st.builds(lambda content, name: message(Role.TOOL, content, name=name), texts, names),
)

responses_texts = st.builds(
    lambda text, extra: TextPart(text, provider_data={"openai-responses": extra}),
    texts,
    st.sampled_from([{}, {"logprobs": []}]),
)
responses_images = st.one_of(
    st.builds(lambda url, d: ImagePart(url, detail=d), urls, details),
    st.builds(
        lambda data, mt, d: ImagePart(data=data, media_type=mt, detail=d), b64, media_types, details
    ),
    st.builds(lambda f, d: ImagePart(file_id=f, detail=d), ids, details),
)
responses_calls = st.builds(
    lambda ident, name, arguments, item_id, status: ToolCall(
        ident, name, arguments, item_id=item_id, status=status
    ),
    ids,
    names,
    argument_strings,
    optional(ids),
    optional(st.sampled_from(["completed", "in_progress", "incomplete"])),
)
reasoning_parts = st.builds(
    lambda text, signature, summary, ident: ThinkingPart(
        text, signature=signature, summary=summary, id=ident, provider="openai-responses"
    ),
    texts,
    optional(b64),
    st.lists(texts, max_size=2),
    st.from_regex(r"rs_[0-9a-f]{4,8}", fullmatch=True),
)
output_form = st.builds(
    lambda ident: {"openai-responses": {"type": "message", "id": ident, "status": "completed"}},
    st.from_regex(r"msg_[0-9a-f]{4,8}", fullmatch=True),
)


def _responses_turn(
    thinking: list[ThinkingPart], run: Any, calls: list[ToolCall], form: Any
) -> Message:
    if not thinking:
        if run is None:
            return (
                message(Role.ASSISTANT, None, tool_calls=calls)
                if calls
                else message(Role.ASSISTANT, "")
            )
        content = run if isinstance(run, str) else tuple(run)
        return message(Role.ASSISTANT, content, tool_calls=calls, provider_data=form)
    if run is None:
        return message(Role.ASSISTANT, tuple(thinking), tool_calls=calls)
    parts = (TextPart(run),) if isinstance(run, str) else tuple(run)
    return message(Role.ASSISTANT, (*thinking, *parts), tool_calls=calls, provider_data=form)


responses_runs = st.one_of(
    st.tuples(st.none() | texts, st.just({})),
    # A list of output texts comes in the output form (with the item's id and status).
    st.tuples(st.lists(responses_texts, min_size=1, max_size=2), output_form),
)

responses_messages = st.one_of(
    st.builds(
        lambda role, content: message(role, content),
        st.sampled_from([Role.SYSTEM, Role.DEVELOPER, Role.USER]),
        texts | st.lists(st.builds(TextPart, texts) | responses_images, max_size=3).map(tuple),
    ),
    st.builds(
        lambda content, ident, name: message(Role.TOOL, content, tool_call_id=ident, name=name),
        texts | st.lists(st.builds(TextPart, texts) | responses_images, max_size=2).map(tuple),
        ids,
        optional(names),
    ),
    st.builds(
        lambda thinking, run, calls: _responses_turn(thinking, run[0], calls, run[1]),
        st.lists(reasoning_parts, max_size=2),
        responses_runs,
        st.lists(responses_calls, max_size=2),
    ),
)

cache = st.just({}) | st.just({"anthropic": {"cache_control": {"type": "ephemeral"}}})
anthropic_texts = st.builds(lambda text, pd: TextPart(text, provider_data=pd), texts, cache)
anthropic_images = st.one_of(
    st.builds(lambda data, mt: ImagePart(data=data, media_type=mt), b64, media_types),
    st.builds(ImagePart, urls),
    st.builds(lambda f: ImagePart(file_id=f), ids),
)
anthropic_calls = st.builds(ToolCall, ids, names, objects)
anthropic_elements = st.lists(
    st.one_of(
        anthropic_texts,
        st.builds(lambda t, s: ThinkingPart(t, signature=s, provider="anthropic"), texts, b64),
        st.builds(lambda d: RedactedThinkingPart(d, provider="anthropic"), b64),
        anthropic_calls,
    ),
    max_size=5,
)


def _anthropic_turn(items: list[Any]) -> Message:
    parts, calls = arrange(items)
    content: Any = parts
    first = parts[0] if len(parts) == 1 else None
    if calls and not parts:
        content = None
    elif calls and type(first) is TextPart and first.text and not first.provider_data:
        content = first.text  # text then calls: the string form
    return message(Role.ASSISTANT, content, tool_calls=calls)


anthropic_messages = st.one_of(
    st.builds(
        lambda content: message(Role.USER, content),
        texts | st.lists(anthropic_texts | anthropic_images, max_size=3).map(tuple),
    ),
    st.builds(lambda content: message(Role.ASSISTANT, content), texts),
    st.builds(_anthropic_turn, anthropic_elements),
    st.builds(
        lambda content, ident, error: message(
            Role.TOOL, content, tool_call_id=ident, is_error=error
        ),
        st.none() | texts | st.lists(anthropic_texts | anthropic_images, max_size=2).map(tuple),
        ids,
        st.booleans(),
    ),
    st.builds(lambda content: message(Role.SYSTEM, content), texts | plain_texts()),
)


def _gemini_simple(parts: tuple[Any, ...], calls: bool) -> Any:
    first = parts[0] if len(parts) == 1 else None
    if type(first) is TextPart and not first.provider_data and (first.text or not calls):
        return first.text  # one plain text part reads as string content
    return parts


signed = st.just({}) | b64.map(lambda s: {"gemini": {"thoughtSignature": s}})
gemini_texts = st.builds(lambda text, pd: TextPart(text, provider_data=pd), texts, signed)
gemini_images = st.one_of(
    st.builds(lambda data, mt: ImagePart(data=data, media_type=mt), b64, media_types),
    st.builds(lambda url, mt: ImagePart(url, media_type=mt), urls, media_types),
)
gemini_calls = st.builds(
    lambda ident, name, arguments, pd: ToolCall(ident, name, arguments, provider_data=pd),
    st.just("") | ids,
    names,
    objects,
    signed,
)
gemini_elements = st.lists(
    st.one_of(
        gemini_texts,
        st.builds(
            lambda t, s: ThinkingPart(t, signature=s, provider="gemini"), texts, optional(b64)
        ),
        gemini_calls,
    ),
    max_size=5,
)


def _gemini_turn(items: list[Any]) -> Message:
    parts, calls = arrange(items)
    content = None if calls and not parts else _gemini_simple(parts, bool(calls))
    return message(Role.ASSISTANT, content, tool_calls=calls)


gemini_messages = st.one_of(
    st.builds(
        lambda parts: message(Role.USER, _gemini_simple(tuple(parts), False)),
        st.lists(gemini_texts | gemini_images, max_size=3),
    ),
    st.builds(_gemini_turn, gemini_elements),
    st.builds(
        lambda text, media, ident, name, error: message(
            Role.TOOL,
            (TextPart(text), *media) if media else text,
            tool_call_id=ident,
            name=name,
            is_error=error,
        ),
        texts,
        st.lists(gemini_images, max_size=2),
        st.just("") | ids,
        names,
        st.booleans(),
    ),
)


def conversations(
    messages: st.SearchStrategy[Message], system: st.SearchStrategy[Any] | None = None
) -> st.SearchStrategy[list[Message]]:
    body = st.lists(messages, max_size=6)
    if system is None:
        return body
    return st.tuples(st.lists(system, max_size=1), body).map(lambda pair: pair[0] + pair[1])


def no_adjacent_assistants(messages: list[Message]) -> bool:
    return not any(
        a.role is Role.ASSISTANT and b.role is Role.ASSISTANT
        for a, b in itertools.pairwise(messages)
    )


def round_trip(messages: list[Message], provider: Any) -> None:
    result = convert(messages, provider)
    assert result.dropped == ()
    payload = result.payload
    # Nothing is lost, so strict refuses exactly the histories the provider would reject.
    if result.problems:
        with pytest.raises(InvalidHistoryError):
            to_provider(messages, provider, strict=True)
    else:
        assert to_provider(messages, provider, strict=True) == payload
    validate(provider, payload)
    expected = messages
    if provider in ("openai-chat", "anthropic"):
        # Results go by call id alone there: the reader gives each its call's name.
        expected = named_from_calls(messages)
    assert from_provider(payload, provider, created_at=T0) == expected


@given(conversations(chat_messages))
def test_canonical_chat_messages_come_back_equal(messages: list[Message]) -> None:
    round_trip(messages, "openai-chat")


@given(conversations(responses_messages))
def test_canonical_responses_messages_come_back_equal(messages: list[Message]) -> None:
    assume(no_adjacent_assistants(messages))
    round_trip(messages, "openai-responses")


@given(
    conversations(
        anthropic_messages,
        st.builds(lambda c: message(Role.SYSTEM, c), texts | st.lists(anthropic_texts).map(tuple)),
    )
)
def test_canonical_anthropic_messages_come_back_equal(messages: list[Message]) -> None:
    round_trip(messages, "anthropic")


@given(
    conversations(
        gemini_messages,
        st.builds(
            lambda parts: message(Role.SYSTEM, _gemini_simple(tuple(parts), False)),
            st.lists(gemini_texts, max_size=3),
        ),
    )
)
def test_canonical_gemini_messages_come_back_equal(messages: list[Message]) -> None:
    round_trip(messages, "gemini")


# Payloads, per provider -----------------------------------------------------------------------


def entries(**options: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A dict of optional entries: each key present or not."""
    return st.fixed_dictionaries({}, optional=options)


chat_parts = st.one_of(
    st.builds(
        lambda t, extra: {"type": "text", "text": t, **extra},
        texts,
        entries(prompt_cache_breakpoint=st.just({"mode": "explicit"})),
    ),
    st.builds(
        lambda url, extra: {"type": "image_url", "image_url": {"url": url, **extra}},
        urls | b64.map(lambda d: f"data:image/png;base64,{d}"),
        entries(detail=details),
    ),
    st.builds(lambda d: {"type": "input_audio", "input_audio": {"data": d, "format": "wav"}}, b64),
)
chat_tool_calls = st.one_of(
    st.builds(
        lambda i, n, a: {"id": i, "type": "function", "function": {"name": n, "arguments": a}},
        ids,
        names,
        argument_strings,
    ),
    st.builds(
        lambda i, n, a: {"id": i, "type": "custom", "custom": {"name": n, "input": a}},
        ids,
        names,
        texts,
    ),
)
chat_payloads = st.lists(
    st.one_of(
        st.builds(
            lambda role, content, extra: {"role": role, "content": content, **extra},
            st.sampled_from(["system", "developer"]),
            texts | st.lists(chat_parts.filter(lambda p: p["type"] == "text"), max_size=2),
            entries(name=names),
        ),
        st.builds(
            lambda content, extra: {"role": "user", "content": content, **extra},
            texts | st.lists(chat_parts, max_size=3),
            entries(name=names),
        ),
        st.builds(
            lambda extra: {"role": "assistant", **extra},
            entries(
                content=st.none()
                | texts
                | st.lists(
                    st.builds(lambda t: {"type": "text", "text": t}, texts)
                    | st.builds(lambda r: {"type": "refusal", "refusal": r}, texts),
                    max_size=2,
                ),
                tool_calls=st.lists(chat_tool_calls, max_size=2),
                refusal=optional(texts),
                name=names,
                audio=st.builds(lambda i: {"id": i}, ids),
            ),
        ),
        st.builds(
            lambda i, c: {"role": "tool", "tool_call_id": i, "content": c},
            ids,
            texts | st.lists(st.builds(lambda t: {"type": "text", "text": t}, texts), max_size=2),
        ),
        st.builds(
            lambda n, c: {"role": "function", "name": n, "content": c}, names, optional(texts)
        ),
    ),
    max_size=6,
)

input_parts = st.one_of(
    st.builds(lambda t: {"type": "input_text", "text": t}, texts),
    st.builds(
        lambda u, d: {"type": "input_image", "image_url": u, "detail": d},
        urls | b64.map(lambda d: f"data:image/jpeg;base64,{d}"),
        details,
    ),
    st.builds(lambda f, d: {"type": "input_image", "file_id": f, "detail": d}, ids, details),
    st.builds(lambda f: {"type": "input_file", "file_id": f}, ids),
)
output_texts = st.builds(
    lambda t, extra: {"type": "output_text", "text": t, "annotations": [], **extra},
    texts,
    entries(logprobs=st.just([])),
)
responses_items = st.one_of(
    st.builds(
        lambda role, content, extra: {"role": role, "content": content, **extra},
        st.sampled_from(["user", "system", "developer"]),
        texts | st.lists(input_parts, max_size=3),
        entries(type=st.just("message")),
    ),
    st.builds(
        lambda c, extra: {"role": "assistant", "content": c, **extra},
        texts | st.lists(st.builds(lambda t: {"type": "input_text", "text": t}, texts), max_size=2),
        entries(type=st.just("message"), phase=st.sampled_from(["commentary", "final_answer"])),
    ),
    st.builds(
        lambda ident, content: {
            "type": "message",
            "id": ident,
            "status": "completed",
            "role": "assistant",
            "content": content,
        },
        st.from_regex(r"msg_[0-9a-f]{4}", fullmatch=True),
        st.lists(
            output_texts | st.builds(lambda r: {"type": "refusal", "refusal": r}, texts), max_size=2
        ),
    ),
    st.builds(
        lambda ident, summary, extra: {
            "type": "reasoning",
            "id": ident,
            "summary": [{"type": "summary_text", "text": s} for s in summary],
            **extra,
        },
        st.from_regex(r"rs_[0-9a-f]{4}", fullmatch=True),
        st.lists(texts, max_size=2),
        entries(
            encrypted_content=optional(b64),
            content=st.lists(
                st.builds(lambda t: {"type": "reasoning_text", "text": t}, texts), max_size=2
            ),
            status=st.just("completed"),
        ),
    ),
    st.builds(
        lambda call_id, name, arguments, extra: {
            "type": "function_call",
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
            **extra,
        },
        ids,
        names,
        argument_strings,
        entries(
            id=st.from_regex(r"fc_[0-9a-f]{4}", fullmatch=True),
            status=st.sampled_from(["completed", "in_progress"]),
        ),
    ),
    st.builds(
        lambda call_id, output: {
            "type": "function_call_output",
            "call_id": call_id,
            "output": output,
        },
        ids,
        texts | st.lists(input_parts.filter(lambda p: p["type"] != "input_file"), max_size=2),
    ),
    st.builds(lambda ident: {"type": "item_reference", "id": ident}, ids),
)
responses_payloads = st.lists(responses_items, max_size=7)

anthropic_text_blocks = st.builds(
    lambda t, extra: {"type": "text", "text": t, **extra},
    texts,
    entries(cache_control=st.just({"type": "ephemeral"}), citations=st.none()),
)
anthropic_image_blocks = st.builds(
    lambda source, extra: {"type": "image", "source": source, **extra},
    st.one_of(
        st.builds(lambda d, mt: {"type": "base64", "media_type": mt, "data": d}, b64, media_types),
        st.builds(lambda u: {"type": "url", "url": u}, urls),
        st.builds(lambda f: {"type": "file", "file_id": f}, ids),
    ),
    entries(cache_control=st.just({"type": "ephemeral"})),
)
anthropic_results = st.builds(
    lambda ident, extra: {"type": "tool_result", "tool_use_id": ident, **extra},
    ids,
    entries(
        content=texts | st.lists(anthropic_text_blocks | anthropic_image_blocks, max_size=2),
        is_error=st.booleans(),
        cache_control=st.just({"type": "ephemeral"}),
    ),
)
anthropic_entries = st.one_of(
    st.builds(
        lambda c: {"role": "user", "content": c},
        texts
        | st.lists(anthropic_text_blocks | anthropic_image_blocks | anthropic_results, max_size=4),
    ),
    st.builds(
        lambda c: {"role": "assistant", "content": c},
        texts
        | st.lists(
            st.one_of(
                anthropic_text_blocks,
                st.builds(
                    lambda t, s: {"type": "thinking", "thinking": t, "signature": s}, texts, b64
                ),
                st.builds(lambda d: {"type": "redacted_thinking", "data": d}, b64),
                st.builds(
                    lambda i, n, a, extra: {
                        "type": "tool_use",
                        "id": i,
                        "name": n,
                        "input": a,
                        **extra,
                    },
                    ids,
                    names,
                    objects,
                    entries(cache_control=st.just({"type": "ephemeral"})),
                ),
            ),
            max_size=4,
        ),
    ),
    st.builds(
        lambda c: {"role": "system", "content": c},
        texts | st.lists(anthropic_text_blocks, max_size=2),
    ),
)
anthropic_payloads = st.builds(
    lambda system, messages: {**system, "messages": messages},
    entries(system=texts | st.lists(anthropic_text_blocks, max_size=2)),
    st.lists(anthropic_entries, max_size=6),
)

gemini_media = st.one_of(
    st.builds(lambda d, mt: {"inlineData": {"mimeType": mt, "data": d}}, b64, media_types),
    st.builds(
        lambda u, mt: {"fileData": {"mimeType": mt, "fileUri": u}},
        urls,
        media_types | st.just("application/pdf"),
    ),
)
gemini_text_parts = st.builds(
    lambda t, extra: {"text": t, **extra}, texts, entries(thoughtSignature=b64)
)
gemini_responses = st.builds(
    lambda name, response, extra: {
        "functionResponse": {"name": name, "response": response, **extra}
    },
    names,
    st.one_of(
        texts.map(lambda t: {"output": t}),
        texts.map(lambda t: {"error": t}),
        objects,
    ),
    entries(
        id=ids,
        parts=st.lists(gemini_media.filter(lambda p: "inlineData" in p), max_size=1),
        willContinue=st.booleans(),
    ),
)
gemini_contents = st.one_of(
    st.builds(
        lambda parts, extra: {**extra, "parts": parts},
        st.lists(gemini_text_parts | gemini_media | gemini_responses, max_size=4),
        st.just({"role": "user"}) | st.just({}),
    ),
    st.builds(
        lambda parts: {"role": "model", "parts": parts},
        st.lists(
            st.one_of(
                gemini_text_parts,
                st.builds(
                    lambda t, extra: {"text": t, "thought": True, **extra},
                    texts,
                    entries(thoughtSignature=b64),
                ),
                st.builds(
                    lambda name, extra, part: {"functionCall": {"name": name, **extra}, **part},
                    names,
                    entries(args=objects, id=ids),
                    entries(thoughtSignature=b64),
                ),
                gemini_media.filter(lambda p: "inlineData" in p),
                st.builds(lambda c: {"executableCode": {"language": "PYTHON", "code": c}}, texts),
            ),
            max_size=4,
        ),
    ),
)
gemini_payloads = st.builds(
    lambda system, contents: {**system, "contents": contents},
    entries(system_instruction=st.lists(gemini_text_parts, max_size=2).map(lambda p: {"parts": p})),
    st.lists(gemini_contents, max_size=5),
)

PAYLOADS = {
    "openai-chat": chat_payloads,
    "openai-responses": responses_payloads,
    "anthropic": anthropic_payloads,
    "gemini": gemini_payloads,
}


def payload_round_trip(payload: Any, provider: Any) -> None:
    validate(provider, payload)  # the generator makes what the API takes
    messages = from_provider(payload, provider, created_at=T0)
    assert same(to_provider(messages, provider), payload)
    assert from_provider(to_provider(messages, provider), provider, created_at=T0) == messages


@given(chat_payloads)
def test_chat_payloads_come_back_exactly(payload: Any) -> None:
    payload_round_trip(payload, "openai-chat")


@given(responses_payloads)
def test_responses_payloads_come_back_exactly(payload: Any) -> None:
    payload_round_trip(payload, "openai-responses")


@given(anthropic_payloads)
def test_anthropic_payloads_come_back_exactly(payload: Any) -> None:
    payload_round_trip(payload, "anthropic")


@given(gemini_payloads)
def test_gemini_payloads_come_back_exactly(payload: Any) -> None:
    payload_round_trip(payload, "gemini")


_SNAKE_CASE = {
    "functionCall": "function_call",
    "functionResponse": "function_response",
    "inlineData": "inline_data",
    "fileData": "file_data",
    "thoughtSignature": "thought_signature",
    "mimeType": "mime_type",
    "fileUri": "file_uri",
    "willContinue": "will_continue",
}


def snake_cased(part: Any) -> Any:
    """A Gemini part with its structural keys in the Python SDK's snake_case."""
    out = {_SNAKE_CASE.get(key, key): value for key, value in part.items()}
    for key, value in out.items():
        if key in ("function_call", "function_response", "inline_data", "file_data"):
            out[key] = {_SNAKE_CASE.get(k, k): v for k, v in value.items()}
            if key == "function_response" and "parts" in value:
                out[key]["parts"] = [snake_cased(item) for item in value["parts"]]
    return out


@given(gemini_payloads, st.randoms(use_true_random=False), st.booleans())
def test_gemini_payloads_in_any_casing_come_back_as_they_came(
    payload: Any, random: Any, camel_system: bool
) -> None:
    mixed = copy.deepcopy(payload)
    for content in mixed["contents"]:
        content["parts"] = [
            snake_cased(part) if random.random() < 0.5 else part for part in content["parts"]
        ]
    if camel_system and "system_instruction" in mixed:
        mixed["systemInstruction"] = mixed.pop("system_instruction")
    messages = from_provider(mixed, "gemini", created_at=T0)
    assert same(to_provider(messages, "gemini"), mixed)
    # The casing is bookkeeping: the neutral messages are those of the camelCase payload,
    # up to the casing hints.
    plain = from_provider(payload, "gemini", created_at=T0)
    assert [m.text for m in messages] == [m.text for m in plain]
    assert [m.tool_calls and [c.name for c in m.tool_calls] for m in messages] == [
        m.tool_calls and [c.name for c in m.tool_calls] for m in plain
    ]


# Any messages, any provider -------------------------------------------------------------------

any_parts = st.one_of(
    st.builds(TextPart, texts),
    chat_images,
    responses_images,
    st.builds(ImagePart, urls),
    st.builds(
        lambda t, s, summary, ident, provider: ThinkingPart(
            t, signature=s, summary=summary, id=ident, provider=provider
        ),
        texts,
        optional(b64),
        optional(st.lists(texts, max_size=2)),
        optional(ids),
        optional(st.sampled_from(PROVIDERS)),
    ),
    st.builds(
        lambda d, p: RedactedThinkingPart(d, provider=p), b64, optional(st.sampled_from(PROVIDERS))
    ),
)
any_messages = st.builds(
    lambda role, content, calls, call_id, name, reasoning, error: message(
        role,
        content,
        tool_calls=calls,
        tool_call_id=call_id,
        name=name,
        reasoning_content=reasoning,
        is_error=error,
    ),
    st.sampled_from(list(Role)),
    st.none() | texts | st.lists(any_parts, max_size=3).map(tuple),
    st.lists(st.one_of(chat_calls, anthropic_calls, gemini_calls), max_size=2),
    optional(st.just("") | ids),
    optional(names),
    optional(texts),
    st.booleans(),
)


@given(st.lists(any_messages, max_size=5), st.sampled_from(PROVIDERS))
def test_any_messages_convert_validly_and_read_back(messages: list[Message], provider: Any) -> None:
    result = convert(messages, provider)
    validate(provider, result.payload)
    assert all(isinstance(note, str) and note for note in result.dropped)
    again = from_provider(result.payload, provider, created_at=T0)
    assert same(to_provider(again, provider), result.payload)
