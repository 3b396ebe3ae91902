"""One worker of a fleet: nous_session.web under uvicorn, for tests/web/test_agui_fleet.py.

``python tests/web/fleet_server.py --store URL --run-lease-ttl 1.5`` binds a free loopback
port, prints ``port N`` on stdout, and serves. Its agent says it is working, then, when the
user's last message is "hold", waits until the session holds a ``x.test.release`` event
naming its run (the test appends it through the store), and says it is done.
"""

from __future__ import annotations

import argparse
import asyncio
import socket

import uvicorn
from ag_ui.core import RunAgentInput

from nous_session import Message, SessionActor
from nous_session.web import create_app

RELEASE = "x.test.release"


async def held_agent(session: SessionActor, run: RunAgentInput) -> None:
    """Working; held until released when asked to hold; done."""
    last = run.messages[-1].content if run.messages else ""
    await session.add_message(Message.assistant(f"working on {run.run_id}"))
    if last == "hold":
        async with session.subscribe(0) as events:
            async for event in events:
                if event.type == RELEASE and event.data.get("run_id") == run.run_id:
                    break
    await session.add_message(Message.assistant(f"done with {run.run_id}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--store", required=True)
    parser.add_argument("--run-lease-ttl", type=float, required=True)
    args = parser.parse_args()
    app = create_app(args.store, held_agent, run_lease_ttl=args.run_lease_ttl)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)  # connections made once the port is printed wait for the server
    print(f"port {listener.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
    asyncio.run(uvicorn.Server(config).serve(sockets=[listener]))


if __name__ == "__main__":
    main()
