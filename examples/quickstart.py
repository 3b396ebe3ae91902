"""Quickstart: the log, its folded surface, and the transcript toolbox, in one page.

Builds a conversation with tool calls, replaces a range with a summary, prints the surface the
model sees beside the full history that the log keeps, then compacts a plain transcript.
Run it with `make demo` or `python examples/quickstart.py`.
"""

from __future__ import annotations

from itertools import zip_longest

from nous_session import EventType, Log, Message, ToolCall, transcript


def main() -> None:
    log = Log.seed(
        [
            Message.system("You are a terse assistant."),
            Message.user("What is the weather in Paris?"),
            Message.assistant(
                "Checking.", tool_calls=[ToolCall("call_1", "get_weather", {"city": "Paris"})]
            ),
            Message.tool("call_1", {"celsius": 18, "sky": "clear"}, name="get_weather"),
            Message.assistant("18C and clear."),
            Message.user("And in Oslo?"),
        ]
    )
    log = log.append(EventType.STEP_START, {"step": 2})  # bookkeeping: never on the surface
    log = log.append(EventType.ASSISTANT_MESSAGE, {"content": "Oslo: 4C, rain."})

    # Summarise the Paris exchange (positions 1..4) without deleting anything.
    first, last = log.surface()[1].position, log.surface()[4].position
    summary = Message.system("[summary] The user asked about Paris: 18C and clear.")
    log = log.append(
        EventType.SYSTEM_MESSAGE,
        {**summary.to_json(), "surface_op": ["replace", first, last]},
        time=log.events()[1].time,
    )

    print("What the model sees (the surface)       | What the log keeps (every event)")
    print("-" * 40 + "-+-" + "-" * 44)
    surface = [f"{m.role.value:>9}: {m.text[:28]}" for m in log.derive_messages()]
    history = [f"{e.seq:>2} {e.type.value:<17}" for e in log.events()]
    for left, right in zip_longest(surface, history, fillvalue=""):
        print(f"{left:<40} | {right}")

    print(
        "\nAs it was at seq 5 (time travel):", [m.text for m in log.upto(5).derive_messages()][-1]
    )
    print(
        "After snapshot():",
        len(log.snapshot().events()),
        "of",
        len(log.events()),
        "events held;",
        "surface unchanged:",
        log.snapshot().derive_messages() == log.derive_messages(),
    )

    messages = [
        Message.user(f"Message {i}: " + "a long paragraph about the problem at hand. " * 8)
        for i in range(1, 21)
    ]
    compacted = transcript.compact(messages, 10)
    print(f"\ntranscript.compact: {len(messages)} messages -> {len(compacted)}")
    print(compacted[0].content.splitlines()[0] if isinstance(compacted[0].content, str) else "")
    print(
        "estimated tokens before/after:",
        transcript.estimate_messages_tokens(messages),
        "->",
        transcript.estimate_messages_tokens(compacted),
    )


if __name__ == "__main__":
    main()
