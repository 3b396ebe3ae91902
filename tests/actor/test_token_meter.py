"""The actor's incremental token meter agrees with the transcript's estimate on the surface."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nous_session import Log, Message
from nous_session.compaction import TokenMeter, event_bytes
from nous_session.event import to_message
from nous_session.transcript import estimate_messages_tokens, message_bytes

texts = st.text(max_size=30)
arguments = st.one_of(
    texts, st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**63 - 1), max_size=3)
)
flat_call = st.fixed_dictionaries({"id": texts, "name": texts, "arguments": arguments})
nested_call = st.builds(
    lambda i, n, a: {"id": i, "type": "function", "function": {"name": n, "arguments": a}},
    texts,
    texts,
    arguments,
)
payloads = st.fixed_dictionaries(
    {},
    optional={
        "content": st.one_of(
            texts,
            st.lists(
                st.one_of(
                    st.builds(lambda t: {"type": "text", "text": t}, texts),
                    st.builds(lambda u: {"type": "image_url", "url": u}, texts),
                    # Typed parts: text with provider data counts, thinking does not.
                    st.builds(
                        lambda t: {"type": "text", "text": t, "provider_data": {"x": {}}}, texts
                    ),
                    st.builds(lambda t: {"type": "thinking", "text": t, "signature": "s"}, texts),
                    st.just({"type": "tool_call", "index": 0}),
                ),
                max_size=3,
            ),
        ),
        "tool_calls": st.lists(
            st.one_of(
                flat_call,
                nested_call,
                flat_call.map(lambda call: {**call, "item_id": "fc_1", "status": "completed"}),
            ),
            max_size=2,
        ),
        "name": texts,
    },
)
steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("append"),
            st.sampled_from(["user_message", "assistant_message", "tool_result", "system_message"]),
            payloads,
        ),
        st.tuples(st.just("replace"), st.integers(0, 30), st.integers(0, 6)),
        st.tuples(st.just("bookkeeping"), st.just("step_end"), st.just({})),
    ),
    max_size=40,
)


@given(st.sampled_from(["user_message", "assistant_message", "tool_result"]), payloads)
def test_event_bytes_equals_message_bytes(kind: str, data: dict[str, Any]) -> None:
    event = Log().append(kind, data).events()[0]
    assert event_bytes(event) == message_bytes(to_message(event))


def exact(messages: Sequence[Message]) -> int:
    return estimate_messages_tokens(messages)


@given(steps)
def test_the_meter_tracks_the_surface_through_appends_and_replaces(plan: list[Any]) -> None:
    log = Log()
    default = TokenMeter(estimate_messages_tokens)
    custom = TokenMeter(lambda messages: sum(len(m.text) + 1 for m in messages))
    for step in plan:
        rebuilt = False
        if step[0] == "replace":
            if log.count == 0:
                continue
            start = step[1] % log.count
            log = log.append(
                "system_message",
                {"content": "s", "surface_op": ["replace", start, start + step[2]]},
            )
            rebuilt = True
        else:
            log = log.append(step[1], step[2])
        surface = log.surface()
        messages = log.derive_messages()
        assert default.update(surface, rebuilt=rebuilt) == exact(messages)
        assert custom.update(surface, rebuilt=rebuilt) == sum(len(m.text) + 1 for m in messages)
