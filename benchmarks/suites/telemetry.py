"""Suite "telemetry": what OpenTelemetry costs an append, off and on, side by side.

Four actors run in one event loop, each opened under a different telemetry setting (the
setting is resolved once, when an actor opens), and their appends alternate in short slices
(:func:`~benchmarks.harness.ainterleave_slices`), so every side sees the same machine:

* ``absent``: opened while ``opentelemetry`` cannot be imported (``sys.modules`` blocks it,
  as when the ``otel`` extra is not installed);
* ``no_provider``: the API importable, no provider set (the automatic default);
* ``enabled_no_provider``: ``telemetry.enable()`` with the API's global no-op providers
  (instrumented, every span and metric a no-op);
* ``sdk``: ``telemetry.enable(...)`` with an SDK tracer provider (a SimpleSpanProcessor into
  an exporter that counts and drops, so the export's CPU lands in the slice that caused it)
  and an SDK meter provider (an InMemoryMetricReader, collected at the end).

Measured: CPU seconds (``time.process_time``) per append, one producer awaiting each append
(one commit per append: the worst case for per-commit work) and 20 concurrent producers
(batched commits). The ratios to ``absent`` are the figures to read.
"""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from typing import Any

import anyio

from benchmarks.harness import (
    AsyncSide,
    Context,
    Measurement,
    Target,
    ainterleave_slices,
    expect,
    measure,
    ratio,
)
from benchmarks.workloads import chat_data
from nous_session import EventType, SessionActor, telemetry
from nous_session.actor import engine_traced

USER = EventType.USER_MESSAGE
US = 1e6
SIDES = ("absent", "no_provider", "enabled_no_provider", "sdk")
SOURCE = "no cost when off"


class _CountingExporter:
    """A span exporter that counts what it is given and keeps nothing."""

    def __init__(self) -> None:
        self.exported = 0

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.exported += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def _blocked() -> dict[str, Any]:
    """Make ``opentelemetry`` unimportable; returns what to put back."""
    saved = {name: mod for name, mod in sys.modules.items() if name.startswith("opentelemetry")}
    for name in saved:
        del sys.modules[name]
    sys.modules["opentelemetry"] = None  # type: ignore[assignment]
    return saved


def _unblocked(saved: dict[str, Any]) -> None:
    del sys.modules["opentelemetry"]
    sys.modules.update(saved)


async def _open_sides(stack: AsyncExitStack) -> tuple[dict[str, SessionActor], Any, Any]:
    """The four actors, each opened under its setting (see the module docstring)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    actors: dict[str, SessionActor] = {}
    saved = _blocked()
    try:
        telemetry.reset()
        expect(not telemetry.active(), "absent: telemetry is active without the API")
        actors["absent"] = await stack.enter_async_context(SessionActor.open(session_id="absent"))
    finally:
        _unblocked(saved)
    telemetry.reset()
    expect(not telemetry.active(), "no_provider: a global provider is set")
    actors["no_provider"] = await stack.enter_async_context(
        SessionActor.open(session_id="no-provider")
    )
    telemetry.enable()
    actors["enabled_no_provider"] = await stack.enter_async_context(
        SessionActor.open(session_id="enabled-no-provider")
    )
    exporter = _CountingExporter()
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))  # type: ignore[arg-type]
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    telemetry.enable(tracer_provider=tracer_provider, meter_provider=meter_provider)
    actors["sdk"] = await stack.enter_async_context(SessionActor.open(session_id="sdk"))
    telemetry.reset()
    for name in ("absent", "no_provider"):
        expect(not engine_traced(actors[name]), f"{name}: the engine's commit is wrapped")
    for name in ("enabled_no_provider", "sdk"):
        expect(engine_traced(actors[name]), f"{name}: the engine's commit is plain")
    stack.callback(tracer_provider.shutdown)
    stack.callback(meter_provider.shutdown)
    return actors, exporter, reader


async def _per_append(ctx: Context, producers: int) -> dict[str, list[float]]:
    slices, per_slice = ctx.size(20, 6), ctx.size(200, 100)
    each = per_slice // producers
    n = slices * each * producers
    data = chat_data(5)
    async with AsyncExitStack() as stack:
        actors, exporter, reader = await _open_sides(stack)

        def side(session: SessionActor) -> AsyncSide:
            async def run() -> AsyncIterator[float | None]:
                before = session.log.count

                async def produce() -> None:
                    for _ in range(each):
                        await session.append(USER, data)

                yield None
                for _ in range(slices):
                    start = time.process_time()
                    if producers == 1:
                        await produce()
                    else:
                        async with anyio.create_task_group() as task_group:
                            for _ in range(producers):
                                task_group.start_soon(produce)
                    yield time.process_time() - start
                expect(session.log.count == before + n, f"{session.session_id}: lost appends")

            return AsyncSide(run, slices)

        exported = exporter.exported
        samples = await ainterleave_slices(ctx.rounds, {name: side(actors[name]) for name in SIDES})
        commits = actors["sdk"].statistics().batches
        expect(exporter.exported - exported >= commits, "sdk: fewer spans than commits")
        data_points = reader.get_metrics_data()
        expect(data_points is not None, "sdk: no metrics recorded")
    return {name: [s / n * US for s in values] for name, values in samples.items()}


def _measurements(samples: dict[str, list[float]], producers: int) -> list[Measurement]:
    name = "telemetry.one_producer" if producers == 1 else f"telemetry.producers_{producers}"
    workload = (
        "one producer awaiting each append (one commit per append)"
        if producers == 1
        else f"{producers} producers appending concurrently (batched commits)"
    )
    out = [
        measure(
            f"{name}.{side}",
            "us CPU/append",
            samples[side],
            note=f"{workload}; 200 B chat event, memory store, asyncio" if side == "absent" else "",
        )
        for side in SIDES
    ]
    out.append(
        ratio(
            f"{name}.no_provider_vs_absent",
            samples["no_provider"],
            samples["absent"],
            target=Target("<=", 1.1, SOURCE),
            note="the API installed, no provider set / the API not importable: the same code "
            "runs (the target allows for noise, not for a cost)",
        )
    )
    out.append(
        ratio(
            f"{name}.enabled_no_provider_vs_absent",
            samples["enabled_no_provider"],
            samples["absent"],
            informational=True,
            note="telemetry.enable() with OpenTelemetry's no-op global providers",
        )
    )
    out.append(
        ratio(
            f"{name}.sdk_vs_absent",
            samples["sdk"],
            samples["absent"],
            informational=True,
            note="the SDK recording every span (SimpleSpanProcessor, exporter drops) and metric",
        )
    )
    return out


def one_producer(ctx: Context) -> list[Measurement]:
    """Per-append CPU, one producer awaiting each append, under each setting."""
    return _measurements(anyio.run(_per_append, ctx, 1, backend="asyncio"), 1)


def producers_20(ctx: Context) -> list[Measurement]:
    """Per-append CPU, 20 concurrent producers, under each setting."""
    return _measurements(anyio.run(_per_append, ctx, 20, backend="asyncio"), 20)


BENCHMARKS = [one_producer, producers_20]
