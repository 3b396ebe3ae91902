"""A bot in a process of its own, for the test that an erasure holds against every holder.

    python erasure_bot.py URL SESSION SECRET FOLLOW LOOP

Opens SESSION (``follow`` is FOLLOW: "yes" or "no"; on LOOP: asyncio or trio) with a
compaction policy whose summarizer quotes every message it summarises, and waits for the test
at each step:

* appends a message saying SECRET and a reply; prints ``said SEQ``;
* appends messages until a compaction starts; its summarizer prints ``summarizing`` and waits
  for a line ``release`` on stdin (the test erases SECRET meanwhile, from its own process);
* appends more messages (a later compaction plans on whatever the bot's log holds), waits for
  the compactions to end, and prints ``done STALE HELD`` (how many compactions were stale, and
  whether the bot's log still holds SECRET), then closes.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import anyio
import anyio.lowlevel
import anyio.to_thread

from nous_session import CompactionPolicy, Message, SessionActor


async def main(url: str, session_id: str, secret: str, follow: bool) -> None:
    started = anyio.Event()
    first = True

    async def summarize(messages: Sequence[Message]) -> str:
        nonlocal first
        if first:
            first = False
            started.set()
            print("summarizing", flush=True)
            line = await anyio.to_thread.run_sync(sys.stdin.readline)
            assert line.strip() == "release", line
        return "summary: " + " | ".join(message.text for message in messages)

    policy = CompactionPolicy(keep_last=2, every=6, summarizer=summarize)
    async with SessionActor.open(
        session_id=session_id, store=url, compaction=policy, follow=follow
    ) as bot:
        said = await bot.add_message(Message.user(f"my secret is {secret}"))
        await bot.add_message(Message.assistant("noted"))
        print(f"said {said.seq}", flush=True)
        index = 0
        while not started.is_set():
            await bot.add_message(Message.user(f"filler {index}"))
            index += 1
            await anyio.lowlevel.checkpoint()
        for more in range(8):
            await bot.add_message(Message.user(f"more {more}"))
        await bot.wait_for_compaction()
        held = any(secret in repr(dict(event.data)) for event in bot.log.events())
        print(f"done {bot.statistics().compactions_stale} {held}", flush=True)


if __name__ == "__main__":
    arguments = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "yes"
    anyio.run(main, *arguments, backend=sys.argv[5])
