"""The LangGraph saver's checkpoints as its events hold them, and back: each value as
LangGraph's serde makes it (``serde.dumps_typed``: a type name and base64 text), a checkpoint
without its channel values, whose changed channels are stored as blobs beside it."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from nous_session._json import JSON, dumps
from nous_session.integrations._langgraph_threads import Index, version_key


def dump(serde: SerializerProtocol, value: Any) -> tuple[str, str]:
    """``value`` as stored: its serde type name and its bytes in base64."""
    kind, data = serde.dumps_typed(value)
    return kind, base64.b64encode(data).decode("ascii")


def load(serde: SerializerProtocol, typed: Sequence[Any]) -> Any:
    """The value :func:`dump` stored as ``typed``."""
    return serde.loads_typed((typed[0], base64.b64decode(typed[1])))


def thread_config(thread_id: object, ns: str, checkpoint_id: str) -> RunnableConfig:
    """The config naming one checkpoint of a thread's namespace."""
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def checkpoint_record(
    serde: SerializerProtocol,
    config: RunnableConfig,
    checkpoint: Checkpoint,
    metadata: CheckpointMetadata,
    new_versions: ChannelVersions,
) -> tuple[dict[str, JSON], str]:
    """The data of the checkpoint event that stores ``checkpoint`` put at ``config``, with a
    blob for each channel in ``new_versions``; and its digest (a hash of the rest of the
    data, which the data carries too)."""
    conf = config["configurable"]
    rest = cast(dict[str, Any], checkpoint.copy())
    values: dict[str, Any] = rest.pop("channel_values")
    blobs: list[JSON] = [
        [
            channel,
            version,
            *(dump(serde, values[channel]) if channel in values else ("empty", "")),
        ]
        for channel, version in new_versions.items()
    ]
    merged = get_checkpoint_metadata(config, metadata)
    data: dict[str, JSON] = {
        "ns": conf.get("checkpoint_ns", ""),
        "id": checkpoint["id"],
        "parent": conf.get("checkpoint_id"),
        "checkpoint": list(dump(serde, rest)),
        "metadata": list(dump(serde, merged)),
        "blobs": blobs,
    }
    run_id = merged.get("run_id")
    if isinstance(run_id, str):
        data["run_id"] = run_id  # readable, and found without decoding
    digest = hashlib.sha256(dumps(data)).hexdigest()
    return {**data, "digest": digest}, digest


def checkpoint_tuple(
    serde: SerializerProtocol, thread_id: object, ns: str, data: Mapping[str, Any], index: Index
) -> CheckpointTuple:
    """The checkpoint a checkpoint event's ``data`` stores, rebuilt with its channels' values
    and its pending writes from the thread's ``index``."""
    checkpoint_id = data["id"]
    checkpoint = cast(dict[str, Any], load(serde, data["checkpoint"]))
    values: dict[str, Any] = {}
    for channel, version in checkpoint["channel_versions"].items():
        typed = index.blobs.get((ns, channel, version_key(version)))
        if typed is not None and typed[0] != "empty":
            values[channel] = load(serde, typed)
    checkpoint["channel_values"] = values
    stored = index.writes.get((ns, checkpoint_id), {})
    ordered = sorted(stored.items(), key=lambda item: writes_sort_key(item[1][3], *item[0]))
    pending: list[PendingWrite] = [
        (task_id, channel, load(serde, typed)) for _, (task_id, channel, typed, _) in ordered
    ]
    parent = data["parent"]
    return CheckpointTuple(
        config=thread_config(thread_id, ns, checkpoint_id),
        checkpoint=cast(Checkpoint, checkpoint),
        metadata=cast(CheckpointMetadata, load(serde, data["metadata"])),
        parent_config=None if parent is None else thread_config(thread_id, ns, parent),
        pending_writes=pending,
    )
