"""Many SSE clients on one server process: delivery latency and server memory per client.

    python benchmarks/sse_clients.py                       # 200 clients, 50 sessions, 10 s
    python benchmarks/sse_clients.py --full                # 1,000 clients, 200 sessions, 20 s
    python benchmarks/sse_clients.py --store postgresql://...   # default: a SQLite file
    python benchmarks/run.py --only web [--full-load]      # as part of `make bench`

The server (this script's ``serve`` command, in a process of its own under uvicorn) serves
``nous_session.web`` and runs a writer task that appends one message to each session every
``--interval`` seconds. The clients (this process, asyncio and httpx) follow the sessions'
streams (``GET /threads/{id}/events``, the library's own SSE format), spread evenly over the
sessions. Each event's latency is the time from its append (the event's time) to its arrival
at a client, so it counts the commit, the fan-out and the HTTP delivery. Memory per client is
the growth of the server's resident set from before the clients connect to when all of them
are streaming, divided by their number. The writer's commit latency (each ``add_message``
awaited) is measured in the server over the same window, and ``--stuck`` more clients open a
stream and never read it, to show that they slow neither the writer nor the others.

Checks its run: every client must get every event its session committed while it streamed,
in order, with no duplicate, or the script fails instead of reporting.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent


def serve(store: str, port: int, sessions: int, interval: float) -> None:
    """The server: nous_session.web's streams, and a writer appending to every session."""
    import anyio
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    from nous_session import Message, SessionActor
    from nous_session.web import SessionStreams

    streams = SessionStreams(store, authorize=lambda request, thread, access: True)
    commits: list[tuple[float, float]] = []  # (when it began, wall clock; how long, s)

    async def commit(session: SessionActor, number: int) -> None:
        began, clock = time.time(), time.perf_counter()
        await session.add_message(Message.user(f"tick {number}"))
        commits.append((began, time.perf_counter() - clock))

    async def write() -> None:
        number = 0
        while True:
            started = time.monotonic()
            async with anyio.create_task_group() as task_group:
                for index in range(sessions):
                    session = await streams.sessions.get(f"s{index}")
                    task_group.start_soon(commit, session, number)
            number += 1
            await anyio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def commit_latency(request: Request) -> JSONResponse:
        since, until = float(request.query_params["since"]), float(request.query_params["until"])
        taken = sorted(took for began, took in commits if since <= began <= until)
        return JSONResponse({"count": len(taken), "latencies": taken})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with streams.lifespan(), anyio.create_task_group() as task_group:
            task_group.start_soon(write)
            yield
            task_group.cancel_scope.cancel()

    routes = [*streams.app.routes, Route("/bench/commits", commit_latency)]
    app = Starlette(routes=routes, lifespan=lifespan)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=2)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def measure(args: argparse.Namespace, base: str, pid: int) -> dict[str, float]:
    import httpx

    before = rss_kib(pid)
    limits = httpx.Limits(max_connections=args.clients + 10, max_keepalive_connections=0)
    timeout = httpx.Timeout(args.seconds + 30)
    stuck = [open_stuck(base, f"s{index % args.sessions}") for index in range(args.stuck)]
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        began = time.time()
        until = began + args.seconds
        latencies: list[list[float]] = [[] for _ in range(args.clients)]
        seqs: list[list[int]] = [[] for _ in range(args.clients)]
        tasks = [
            asyncio.create_task(
                follow_from_now(
                    client, base, f"s{index % args.sessions}", until, latencies[index], seqs[index]
                )
            )
            for index in range(args.clients)
        ]
        await asyncio.sleep(min(5.0, args.seconds / 2))
        during = rss_kib(pid)
        await asyncio.gather(*tasks)
        answer = await client.get(f"{base}/bench/commits", params={"since": began, "until": until})
        commit_latencies = answer.json()["latencies"]
    for connection in stuck:
        connection.close()
    for got in seqs:
        if not got:
            raise AssertionError("a client got no event")
        if got != list(range(got[0], got[0] + len(got))):
            raise AssertionError(f"a client's events have a gap or a duplicate: {got[:20]}...")
    every = sorted(x for one in latencies for x in one)
    return {
        "clients": args.clients,
        "sessions": args.sessions,
        "events delivered": len(every),
        "p50 ms": 1000 * statistics.median(every),
        "p90 ms": 1000 * every[int(len(every) * 0.9) - 1],
        "p99 ms": 1000 * every[int(len(every) * 0.99) - 1],
        "max ms": 1000 * every[-1],
        "server RSS before clients MiB": before / 1024,
        "server KiB per client": (during - before) / (args.clients + args.stuck),
        "stuck clients": args.stuck,
        "commits": len(commit_latencies),
        "commit p50 ms": 1000 * statistics.median(commit_latencies),
        "commit p99 ms": 1000 * commit_latencies[int(len(commit_latencies) * 0.99) - 1],
    }


def open_stuck(base: str, session: str) -> socket.socket:
    """A client that opens a session's stream and never reads it (a small receive buffer, so
    the server's side fills soon)."""
    host, port = base.removeprefix("http://").split(":")
    connection = socket.socket()
    connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    connection.connect((host, int(port)))
    request = f"GET /threads/{session}/events HTTP/1.1\r\nHost: {host}\r\n\r\n"
    connection.sendall(request.encode())
    return connection


async def follow_from_now(
    client: object, base: str, session: str, until: float, latencies: list[float], seqs: list[int]
) -> None:
    """Follow ``session``'s stream until ``until``, from the first event appended after the
    client's stream opened (the catch-up of older ones is skipped)."""
    import httpx

    assert isinstance(client, httpx.AsyncClient)
    with contextlib.suppress(httpx.ReadTimeout, httpx.RemoteProtocolError):
        async with client.stream("GET", f"{base}/threads/{session}/events") as response:
            response.raise_for_status()
            buffer = ""
            came = time.time()
            async for text in response.aiter_text():
                arrived = time.time()
                buffer += text
                *blocks, buffer = buffer.split("\r\n\r\n")
                for block in blocks:
                    for line in block.split("\r\n"):
                        if not line.startswith("data: "):
                            continue
                        event = orjson.loads(line[6:])
                        stamp = datetime.fromisoformat(event["time"]).timestamp()
                        if stamp < came:
                            continue  # the catch-up, of events appended before the client came
                        seqs.append(event["seq"])
                        latencies.append(arrived - stamp)
                if arrived > until:
                    return


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", nargs="?", default="run", choices=["run", "serve"])
    parser.add_argument("--store", default=None, help="a store URL (default: a new SQLite file)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between appends")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--stuck", type=int, default=None, help="clients that never read")
    parser.add_argument(
        "--full", action="store_true", help="1,000 clients on 200 sessions for 20 s, 50 stuck"
    )
    args = parser.parse_args()
    if args.full:
        stuck = args.stuck
        args.clients, args.sessions, args.seconds, args.stuck = FULL
        args.stuck = args.stuck if stuck is None else stuck
    args.stuck = args.stuck or 0
    if args.command == "serve":
        serve(args.store, args.port, args.sessions, args.interval)
        return
    result = run(args)
    for name, value in result.items():
        print(f"{name:32} {value:10.1f}" if isinstance(value, float) else f"{name:32} {value:10}")


# The full size: clients, sessions, seconds, stuck clients.
FULL = (1000, 200, 20.0, 50)


def run(args: argparse.Namespace) -> dict[str, float]:
    """Start a server, measure, stop it: the figures (see the module's docstring)."""
    with tempfile.TemporaryDirectory() as directory:
        store = args.store or f"sqlite:///{Path(directory) / 'bench.sqlite3'}"
        port = free_port()
        command = [
            sys.executable,
            __file__,
            "serve",
            "--store",
            store,
            "--port",
            str(port),
            "--sessions",
            str(args.sessions),
            "--interval",
            str(args.interval),
        ]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        server = subprocess.Popen(command, env=env)
        try:
            deadline = time.monotonic() + 60
            while True:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                    break
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the server did not start")
                time.sleep(0.1)
            time.sleep(2 * args.interval)  # the sessions exist and the writer is steady
            return asyncio.run(measure(args, f"http://127.0.0.1:{port}", server.pid))
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
