"""examples/web as a user of nous_session.web: its AG-UI endpoints, mounted at /agui, write to
the sessions its page shows, and its own event stream carries what an AG-UI run wrote."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from nous_session import SessionActor

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # examples/ is not a package installed with the library
web = importlib.import_module("examples.web.app")

pytestmark = pytest.mark.anyio

BASE = "http://127.0.0.1:8000"


async def test_an_agui_run_on_the_example_lands_in_the_session_its_page_shows(
    tmp_path: Path,
) -> None:
    store = f"sqlite:///{tmp_path / 'web.sqlite3'}"
    app = web.create_app(store)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE) as client:
            hello = {"id": "u1", "role": "user", "content": "hello"}
            body = {"threadId": "demo", "runId": "r1", "messages": [hello]}
            response = await client.post("/agui/run", json=body)
            types = [
                orjson.loads(line[len("data: ") :])["type"]
                for line in response.text.splitlines()
                if line.startswith("data: ")
            ]
            assert types[0] == "RUN_STARTED"
            assert types[-1] == "RUN_FINISHED"
            surface = (await client.get("/sessions/demo/surface")).json()
    assert [entry["role"] for entry in surface["entries"]] == ["user", "assistant"]
    async with SessionActor.open(session_id="demo", store=store) as session:
        texts = [message.text for message in session.messages()]
    assert texts[0] == "hello"
    assert texts[1].startswith("Fact 1 about")
