"""OpenTelemetry: the spans and metrics a session actor reports, and that it reports nothing
(and changes nothing) when telemetry is off or the API is missing.

Providers are passed to ``telemetry.enable`` explicitly: OpenTelemetry's global providers can
be set only once per process, so the tests that need a global one run in a child process.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from nous_session import (
    CompactionPolicy,
    ConflictError,
    EventType,
    MemoryStore,
    OutcomeUnknownError,
    SessionActor,
    StoreError,
    telemetry,
)
from nous_session.stores.base import (
    ChangeFeedStore,
    FollowingStore,
    ForkingStore,
    OutcomeStore,
    RebasingStore,
    Store,
    VacuumingStore,
    supports,
)
from nous_session.stores.sqlite import SQLiteStore

ROOT = Path(__file__).resolve().parents[2]
POSTGRES_URL = os.environ.get("NOUS_SESSION_TEST_POSTGRES")
USER = EventType.USER_MESSAGE


class Otel:
    """An SDK tracer and meter provider recording in memory, enabled for the test."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider(shutdown_on_exit=False)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader], shutdown_on_exit=False)

    def finished(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.spans.get_finished_spans() if span.name == name]

    def points(self, name: str) -> list[Any]:
        """The data points of metric ``name`` (empty if it has none)."""
        data = self.reader.get_metrics_data()
        if data is None:
            return []
        return [
            point
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            if scope.scope.name == "nous_session"
            for metric in scope.metrics
            if metric.name == name
            for point in metric.data.data_points
        ]


@pytest.fixture
def otel() -> Iterator[Otel]:
    recorder = Otel()
    telemetry.enable(
        tracer_provider=recorder.tracer_provider, meter_provider=recorder.meter_provider
    )
    try:
        yield recorder
    finally:
        telemetry.reset()
        recorder.tracer_provider.shutdown()
        recorder.meter_provider.shutdown()


class FailingStore(MemoryStore):
    """A memory store whose commits fail with ``failure`` while it is set."""

    failure: BaseException | None = None

    async def commit(self, session_id: str, **arguments: Any) -> str | None:
        if self.failure is not None:
            raise self.failure
        return await super().commit(session_id, **arguments)


class GatedStore(MemoryStore):
    """A memory store whose commits wait for ``gate`` once ``hold`` is set."""

    hold = False

    def __init__(self) -> None:
        super().__init__()
        self.entered = anyio.Event()
        self.gate = anyio.Event()

    async def commit(self, session_id: str, **arguments: Any) -> str | None:
        if self.hold:
            self.entered.set()
            await self.gate.wait()
        return await super().commit(session_id, **arguments)


# Spans --------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_commit_yields_a_span_with_its_attributes(otel: Otel) -> None:
    async with SessionActor.open(session_id="traced") as session:
        await session.append(USER, {"content": "one"})
        async with anyio.create_task_group() as task_group:
            for index in range(5):
                task_group.start_soon(session.append, USER, {"content": f"many {index}"})
        await session.append_many([(USER, {"content": "a"}), (USER, {"content": "b"})])
    commits = otel.finished("nous_session.commit")
    assert commits, "no commit span"
    for span in commits:
        assert span.attributes is not None
        assert span.attributes["nous_session.session.id"] == "traced"
        assert span.attributes["nous_session.store.kind"] == "memory"
        assert span.attributes["nous_session.commit.outcome"] == "committed"
        assert span.status.status_code is StatusCode.UNSET
        assert span.parent is None  # a batch serves many callers: a trace of its own
    sizes = [span.attributes["nous_session.commit.batch.size"] for span in commits]  # type: ignore[index]
    assert sizes[0] == 1  # the lone first append
    assert sum(sizes) == 7  # every request in exactly one commit
    # Each commit's store call is its child, with the events it stored.
    stored = otel.finished("nous_session.store.commit")
    assert len(stored) == len(commits)
    by_id = {span.context.span_id: span for span in commits}  # type: ignore[union-attr]
    assert all(s.parent is not None and s.parent.span_id in by_id for s in stored)
    assert sum(s.attributes["nous_session.commit.events"] for s in stored) == 8  # type: ignore[index,misc]
    # Loading the session at open is a store call too.
    (read,) = otel.finished("nous_session.store.read")
    assert read.attributes is not None
    assert read.attributes["nous_session.store.operation"] == "read"


@pytest.mark.anyio
async def test_spans_at_open_follow_the_callers_span_and_commits_do_not(otel: Otel) -> None:
    tracer = otel.tracer_provider.get_tracer("test")
    with tracer.start_as_current_span("request") as request:
        async with SessionActor.open(session_id="parented") as session:
            await session.append(USER, {"content": "x"})
    (read,) = otel.finished("nous_session.store.read")
    assert read.parent is not None
    assert read.parent.span_id == request.get_span_context().span_id
    (commit,) = otel.finished("nous_session.commit")
    assert commit.parent is None


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("failure", "outcome"),
    [
        (StoreError("disk full"), "store_error"),
        (OutcomeUnknownError("lost the reply"), "unknown"),
    ],
    ids=["store_error", "unknown"],
)
async def test_a_failed_commit_records_its_outcome(
    otel: Otel, failure: BaseException, outcome: str
) -> None:
    store = FailingStore()
    async with SessionActor.open(session_id="failing", store=store) as session:
        await session.append(USER, {"content": "fine"})
        store.failure = failure
        with pytest.raises(type(failure)):
            await session.append(USER, {"content": "lost"})
        store.failure = None
        await session.append(USER, {"content": "fine again"})
    outcomes = [
        span.attributes["nous_session.commit.outcome"]  # type: ignore[index]
        for span in otel.finished("nous_session.commit")
    ]
    assert outcomes == ["committed", outcome, "committed"]
    failed = otel.finished("nous_session.commit")[1]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes is not None
    assert failed.attributes["error.type"] == type(failure).__qualname__
    assert failed.attributes["nous_session.store.kind"] == f"{__name__}.FailingStore"
    store_call = otel.finished("nous_session.store.commit")[1]
    assert store_call.status.status_code is StatusCode.ERROR
    assert [event.name for event in store_call.events] == ["exception"]
    durations = {
        point.attributes["nous_session.commit.outcome"]: point.count
        for point in otel.points("nous_session.commit.duration")
    }
    assert durations == {"committed": 2, outcome: 1}


@pytest.mark.anyio
async def test_a_commit_that_loses_to_another_writer_is_a_conflict(otel: Otel) -> None:
    store = MemoryStore()
    async with (
        SessionActor.open(session_id="contended", store=store) as first,
        SessionActor.open(session_id="contended", store=store) as second,
    ):
        await first.append(USER, {"content": "first"})
        await second.reload()
        await second.append(USER, {"content": "second, ahead"})
        with pytest.raises(ConflictError):  # conditional: a plain append would land
            await first.append_many(
                [(USER, {"content": "first, behind"})], expect_count=first.log.count
            )
    conflicts = [
        span
        for span in otel.finished("nous_session.commit")
        if span.attributes and span.attributes["nous_session.commit.outcome"] == "conflict"
    ]
    assert len(conflicts) == 1
    assert conflicts[0].attributes is not None
    assert conflicts[0].attributes["error.type"] == "ConflictError"
    # The catch-up after the conflict read the store inside the commit span.
    reads = otel.finished("nous_session.store.read")
    assert any(
        read.parent is not None and read.parent.span_id == conflicts[0].context.span_id  # type: ignore[union-attr]
        for read in reads
    )


@pytest.mark.anyio
async def test_a_request_refused_alone_is_a_no_op_commit(otel: Otel) -> None:
    async with SessionActor.open(session_id="no-op") as session:
        await session.append(USER, {"content": "x"}, key="k")
        again = await session.append(USER, {"content": "x"}, key="k")
        assert again.seq == 0
    outcomes = [
        span.attributes["nous_session.commit.outcome"]  # type: ignore[index]
        for span in otel.finished("nous_session.commit")
    ]
    assert outcomes == ["committed", "no_op"]


@pytest.mark.anyio
async def test_a_compaction_yields_a_span(otel: Otel) -> None:
    policy = CompactionPolicy(every=4, keep_last=2)
    async with SessionActor.open(session_id="compacting", compaction=policy) as session:
        for index in range(6):
            await session.append(USER, {"content": f"message {index}"})
        await session.wait_for_compaction()
        ran = session.statistics().compactions_run
    assert ran >= 1
    compactions = otel.finished("nous_session.compaction")
    assert len(compactions) >= ran
    applied = [
        span
        for span in compactions
        if span.attributes and span.attributes["nous_session.compaction.outcome"] == "applied"
    ]
    assert len(applied) == ran
    span = applied[0]
    assert span.attributes is not None
    assert span.attributes["nous_session.session.id"] == "compacting"
    assert span.attributes["nous_session.compaction.surface"] >= 4  # type: ignore[operator]
    assert span.parent is None
    points = otel.points("nous_session.compaction.duration")
    assert (
        sum(p.count for p in points if p.attributes["nous_session.compaction.outcome"] == "applied")
        == ran
    )


# Metrics ------------------------------------------------------------------------------------


def _value(otel: Otel, name: str, **attributes: Any) -> Any:
    wanted = {f"nous_session.{key.replace('_', '.')}": value for key, value in attributes.items()}
    matching = [
        point
        for point in otel.points(name)
        if all(point.attributes.get(key) == value for key, value in wanted.items())
    ]
    assert len(matching) == 1, (name, attributes, otel.points(name))
    return matching[0]


@pytest.mark.anyio
async def test_metrics_show_queue_batch_latency_sessions_and_lag(otel: Otel) -> None:
    store = GatedStore()
    async with SessionActor.open(session_id="measured", store=store) as session:
        assert _value(otel, "nous_session.session.count").value == 1
        await session.append(USER, {"content": "first"})
        async with session.subscribe() as events:
            await session.append(USER, {"content": "second"})
            assert _value(otel, "nous_session.subscription.lag").value == 2
            assert (await anext(events)).seq == 0
            assert _value(otel, "nous_session.subscription.lag").value == 1
            # Hold the next commit in the store; three more requests queue behind it.
            store.hold = True
            async with anyio.create_task_group() as task_group:
                task_group.start_soon(session.append, USER, {"content": "held"})
                with anyio.fail_after(10):
                    await store.entered.wait()
                for index in range(3):
                    task_group.start_soon(session.append, USER, {"content": f"queued {index}"})
                with anyio.fail_after(10):
                    while session.statistics().queue_depth < 3:
                        await anyio.lowlevel.checkpoint()
                assert _value(otel, "nous_session.queue.depth").value == 3
                store.hold = False
                store.gate.set()
            assert _value(otel, "nous_session.queue.depth").value == 0
        # The subscription closed: nobody lags.
        assert _value(otel, "nous_session.subscription.lag").value == 0
        commits = session.statistics().batches
    assert _value(otel, "nous_session.session.count").value == 0
    sizes = _value(otel, "nous_session.commit.batch.size", store_kind=f"{__name__}.GatedStore")
    assert sizes.count == commits
    assert sizes.sum == 6  # every request once
    assert sizes.max == 3  # the three that queued behind the held commit: one batch
    latency = _value(otel, "nous_session.commit.duration", commit_outcome="committed")
    assert latency.count == commits
    assert latency.sum > 0


@pytest.mark.anyio
async def test_per_session_gauges_carry_the_session_id(otel: Otel) -> None:
    providers = {
        "tracer_provider": otel.tracer_provider,
        "meter_provider": otel.meter_provider,
    }
    telemetry.enable(**providers, per_session=True)
    async with SessionActor.open(session_id="a") as first:
        telemetry.disable()
        async with SessionActor.open(session_id="dark") as dark:
            # Enabled again with the same providers: the gauges made the first time observe
            # the sessions opened now too (one series per store kind for these).
            telemetry.enable(**providers)
            async with (
                SessionActor.open(session_id="b") as second,
                SessionActor.open(session_id="c") as third,
            ):
                for session in (first, dark, second, third):
                    await session.append(USER, {"content": "x"})
                    await session.append(USER, {"content": "y"})
                async with (
                    first.subscribe() as _,
                    dark.subscribe() as _,
                    second.subscribe(since=1) as _,
                    third.subscribe() as _,
                ):
                    lags = {
                        point.attributes.get("nous_session.session.id", "memory"): point.value
                        for point in otel.points("nous_session.subscription.lag")
                    }
                    opened = {
                        point.attributes.get("nous_session.session.id", "memory"): point.value
                        for point in otel.points("nous_session.session.count")
                    }
    assert lags == {"a": 2, "memory": 2}  # "b" lags 1, "c" 2: the largest; "dark" is not seen
    assert opened == {"a": 1, "memory": 2}


# Off ----------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_with_no_provider_nothing_is_recorded_and_nothing_changes() -> None:
    telemetry.reset()
    recorder = Otel()  # made, but never given to nous_session nor set globally
    assert not telemetry.active()  # the tests never set a global provider
    store = MemoryStore()
    policy = CompactionPolicy(every=4, keep_last=2)
    async with SessionActor.open(session_id="dark", store=store, compaction=policy) as session:
        # No telemetry object anywhere: the store is not wrapped, the loop commits directly.
        assert session._state.store is store
        assert session._engine._telemetry is None
        assert not session._engine.traced
        async with session.subscribe() as events:
            for index in range(6):
                await session.append(USER, {"content": f"m {index}"})
            assert (await anext(events)).seq == 0
        await session.wait_for_compaction()
        assert session.statistics().compactions_run >= 1
    assert recorder.spans.get_finished_spans() == ()
    assert recorder.points("nous_session.commit.duration") == []


@pytest.mark.anyio
async def test_enabled_without_any_provider_records_nothing_and_works() -> None:
    # enable() with no providers uses the global ones: here, the API's no-op proxies.
    telemetry.enable()
    try:
        policy = CompactionPolicy(every=4, keep_last=2)
        async with SessionActor.open(session_id="proxied", compaction=policy) as session:
            assert session._state.store is not session.store  # traced, through the proxy
            for index in range(6):
                await session.append(USER, {"content": f"m {index}"})
            await session.wait_for_compaction()
            assert session.log.count >= 6
    finally:
        telemetry.reset()


def test_disable_turns_it_off_and_bad_input_changes_nothing(otel: Otel) -> None:
    assert telemetry.active()
    with pytest.raises(ValueError, match="tracer_provider"):
        telemetry.enable(tracer_provider="not a provider")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="meter_provider"):
        telemetry.enable(meter_provider=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="per_session"):
        telemetry.enable(per_session="yes")  # type: ignore[arg-type]
    assert telemetry.active()  # still the recorder's
    telemetry.disable()
    assert not telemetry.active()


@pytest.mark.anyio
async def test_the_traced_store_has_the_stores_capabilities(otel: Otel, tmp_path: Path) -> None:
    capabilities = [
        Store,
        RebasingStore,
        ForkingStore,
        OutcomeStore,
        ChangeFeedStore,
        FollowingStore,
        VacuumingStore,
    ]
    for store in (MemoryStore(), SQLiteStore(tmp_path / "traced.db")):
        async with SessionActor.open(session_id="capable", store=store) as session:
            traced = session._state.store
            assert traced is not store
            assert session.store is store  # the public property gives the store itself
            for capability in capabilities:
                assert supports(traced, capability) == supports(store, capability), capability
            await session.append(USER, {"content": "x"})
        await store.aclose()
    kinds = {
        span.attributes["nous_session.store.kind"]  # type: ignore[index]
        for span in otel.finished("nous_session.commit")
    }
    assert kinds == {"memory", "sqlite"}


@pytest.mark.anyio
async def test_postgres_sessions_are_traced_with_their_capabilities(otel: Otel) -> None:
    if not POSTGRES_URL:
        pytest.skip("no PostgreSQL server: set NOUS_SESSION_TEST_POSTGRES")
    psycopg = pytest.importorskip("psycopg")
    from nous_session.stores.postgres import PostgresStore

    schema = f"t_{uuid.uuid4().hex[:12]}"
    store = PostgresStore(POSTGRES_URL, schema=schema)
    try:
        async with SessionActor.open(session_id="pg", store=store) as session:
            traced = session._state.store
            assert session._state.name_commits  # the class attribute came through
            for capability in (ChangeFeedStore, OutcomeStore, RebasingStore, ForkingStore):
                assert supports(traced, capability) == supports(store, capability)
            await session.append(USER, {"content": "x"})
    finally:
        await store.aclose()
        with psycopg.connect(POSTGRES_URL, autocommit=True) as connection:
            connection.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    (commit,) = otel.finished("nous_session.commit")
    assert commit.attributes is not None
    assert commit.attributes["nous_session.store.kind"] == "postgres"
    assert commit.attributes["nous_session.commit.outcome"] == "committed"


# Automatic choice, and no API, in a child process -------------------------------------------


def _child(*parts: str) -> str:
    """Run the script made of ``parts`` (each dedented) in a child Python; its stdout."""
    script = "\n".join(textwrap.dedent(part) for part in parts)
    result = subprocess.run(
        [sys.executable, "-W", "error", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


_WORKLOAD = """
import anyio
from nous_session import CompactionPolicy, EventType, SessionActor

async def workload():
    policy = CompactionPolicy(every=4, keep_last=2)
    async with SessionActor.open(session_id="child", compaction=policy) as session:
        async with session.subscribe() as events:
            for index in range(6):
                await session.append(EventType.USER_MESSAGE, {"content": f"m {index}"})
            assert (await anext(events)).seq == 0
        await session.wait_for_compaction()
        assert session.statistics().compactions_run >= 1
        return session.log.count
"""


def test_without_the_api_the_library_works() -> None:
    out = _child(
        """
        import sys
        # opentelemetry is not importable: as if the extra were not installed.
        for name in [n for n in sys.modules if n.startswith("opentelemetry")]:
            del sys.modules[name]
        sys.modules["opentelemetry"] = None
        """,
        _WORKLOAD,
        """
        from nous_session import telemetry
        for backend in ("asyncio", "trio"):
            assert anyio.run(workload, backend=backend) >= 6, backend
        assert not telemetry.active()
        try:
            telemetry.enable()
        except ImportError as error:
            assert "nous_session[otel]" in str(error), error
        else:
            raise AssertionError("enable() without the API")
        assert sys.modules["opentelemetry"] is None
        print("ok")
        """,
    )
    assert out.strip() == "ok"


def test_a_global_provider_set_after_import_is_found_at_open() -> None:
    out = _child(
        _WORKLOAD,
        """
        import sys
        from nous_session import telemetry
        assert "opentelemetry" not in sys.modules  # importing nous_session does not import it
        anyio.run(workload)
        assert not telemetry.active()  # the API is there, no provider is set

        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        exporter = InMemorySpanExporter()
        provider = TracerProvider(shutdown_on_exit=False)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        assert telemetry.active()
        for backend in ("asyncio", "trio"):
            anyio.run(workload, backend=backend)
        names = {span.name for span in exporter.get_finished_spans()}
        assert {"nous_session.commit", "nous_session.compaction"} <= names, names
        print("ok")
        """,
    )
    assert out.strip() == "ok"
