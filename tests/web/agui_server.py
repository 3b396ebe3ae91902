"""A server the Node tests drive with AG-UI's own client: nous_session.web under uvicorn.

``python tests/web/agui_server.py --store sqlite:///x.sqlite3 --port 8123 [--page DIR]``. Its
agent is scripted: it titles the session after the user's last message, calls a weather tool
(its arguments streamed live, a few characters at a time), gets its result, and answers by
quoting the message, word by word as live text (nous_session.web's live_message); a message
containing "slow" makes it pause between those steps, fragments and words, so that a test can
cut the connection in the middle of a run, of a tool call, or of the answer.
"""

from __future__ import annotations

import argparse

import anyio
import uvicorn
from ag_ui.core import RunAgentInput
from starlette.staticfiles import StaticFiles

from nous_session import Message, SessionActor
from nous_session.web import create_app, live_message

# How long a "slow" run waits between its steps.
PAUSE = 0.5
# The weather call's arguments, as a model would stream them.
ARGUMENTS = ('{"ci', 'ty": ', '"Par', 'is", ', '"units": ', '"metric"}')


def last_user_text(run: RunAgentInput) -> str:
    for message in reversed(run.messages):
        if message.role == "user" and isinstance(message.content, str):
            return message.content
    return ""


async def scripted_agent(session: SessionActor, run: RunAgentInput) -> None:
    """Title, tool call, tool result, answer; pausing between them when asked to be slow."""
    said = last_user_text(run)
    pause = PAUSE if "slow" in said else 0.0
    await session.set_metadata({"title": said[:80] or "untitled"})
    async with live_message(session) as checking:
        checking.add("Checking the weather.")
        call = checking.tool_call("get_weather", f"call-{run.run_id}")
        for fragment in ARGUMENTS:
            call.add(fragment)
            await anyio.sleep(pause / 5)
    await anyio.sleep(pause)
    await session.add_message(Message.tool(call.id, {"rain_mm": 3}, name="get_weather"))
    await anyio.sleep(pause)
    async with live_message(session) as answer:
        for word in f"You said: {said}".split(" "):
            answer.add(word if not answer.text else f" {word}")
            await anyio.sleep(pause / 5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--page", help="a folder to serve at /page/ (the browser test's page)")
    args = parser.parse_args()
    app = create_app(args.store, scripted_agent)
    if args.page:
        app.mount("/page", StaticFiles(directory=args.page, html=True))
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        timeout_graceful_shutdown=5,
    )


if __name__ == "__main__":
    main()
