"""Validate payloads against the providers' own SDK request types (test-only dependencies).

Each check validates with the SDK's pydantic types, unknown keys forbidden, consumes every lazily
validated iterable, and compares what the SDK read with the payload, so a key the SDK ignored
or a value it changed fails as surely as a type error.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator
from functools import cache
from typing import Any

import orjson
import pytest

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
genai_types = pytest.importorskip("google.genai.types")

from anthropic.types.message_create_params import MessageCreateParamsNonStreaming  # noqa: E402
from openai.types.chat import ChatCompletionMessageParam  # noqa: E402
from openai.types.responses import ResponseInputItemParam  # noqa: E402
from pydantic import ConfigDict, TypeAdapter  # noqa: E402

VERSIONS = {
    "openai": openai.__version__,
    "anthropic": anthropic.__version__,
}

CHAT_EXTENSIONS = ("reasoning_content",)
"""Chat Completions fields of compatible servers (DeepSeek, vLLM) that OpenAI's types lack."""


@cache
def _adapter(kind: str) -> TypeAdapter[Any]:
    forbid = ConfigDict(extra="forbid")
    if kind == "openai-chat":
        return TypeAdapter(list[ChatCompletionMessageParam], config=forbid)
    if kind == "openai-responses":
        return TypeAdapter(list[ResponseInputItemParam], config=forbid)
    # (a TypedDict at the top cannot take a config; inside a list it does)
    return TypeAdapter(list[MessageCreateParamsNonStreaming], config=forbid)


def _materialize(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _materialize(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_materialize(item) for item in value]
    if isinstance(value, Iterator | Iterable) and not isinstance(value, str | bytes):
        return [_materialize(item) for item in value]  # a ValidatorIterator: validate it now
    return value


def _strip(payload: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {key: value for key, value in message.items() if key not in CHAT_EXTENSIONS}
        if message.get("role") == "assistant"
        else message
        for message in payload
    ]


def _b64(value: str) -> bytes:
    standard = value.replace("-", "+").replace("_", "/")
    return base64.b64decode(standard + "=" * (-len(standard) % 4))


def _normal_bytes(value: Any, key: str = "") -> Any:
    """Base64 strings decoded, so that standard and URL-safe encodings compare equal."""
    if isinstance(value, dict):
        return {k: _normal_bytes(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal_bytes(v, key) for v in value]
    if key in ("data", "thoughtSignature") and isinstance(value, str):
        return _b64(value)
    return value


def validate(provider: str, payload: Any) -> None:
    """Assert that ``payload`` is a valid request part for ``provider``, as its SDK reads it."""
    if provider == "gemini":
        _validate_gemini(payload)
        return
    if provider == "anthropic":
        request = {"model": "claude-sonnet-4-5", "max_tokens": 1024, **payload}
        (read,) = _materialize(_adapter(provider).validate_python([request]))
        assert read == request
        return
    if provider == "openai-chat":
        payload = _strip(payload)
    read = _materialize(_adapter(provider).validate_python(payload))
    assert read == payload


def _validate_gemini(payload: dict[str, Any]) -> None:
    assert set(payload) <= {"system_instruction", "contents"}
    contents = list(payload["contents"])
    if "system_instruction" in payload:
        contents.append(payload["system_instruction"])
    for content in contents:
        model = genai_types.Content.model_validate_json(orjson.dumps(content))
        read = model.model_dump(mode="json", by_alias=True, exclude_none=True)
        assert _normal_bytes(read) == _normal_bytes(content)
