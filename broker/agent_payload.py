"""The bounded-agent invocation payload: what the broker hands the enclave runner (pure codec).

Theory of operation: the shared pipeline gives a runner one opaque byte
string per launched invocation (``Invocation.script``; ``Subsystem.payload``
builds it). A bounded query's payload is its script. A bounded agent's is
two things the enclave reads as files (``task.txt``, ``schema.json``): the
caller's task, verbatim, and the caller's schema. This module is the one
encoding of that pair, so the broker's subsystem descriptor and the enclave
runner cannot disagree about it.

Encoding: compact JSON ``{"schema": S, "task": T}`` with sorted keys, where
``S`` is the schema's JSON text as admission accepted it (the runner writes
it to ``schema.json`` unchanged) and ``T`` the task. Both are strings, so the
encoding is unambiguous and round-trips exactly (lone surrogates are refused
at encoding: they cannot be written as UTF-8 files).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

__all__ = ["AgentPayload", "PayloadError", "decode_agent_payload", "encode_agent_payload"]


class PayloadError(ValueError):
    """Bytes that are not an encoded :class:`AgentPayload` (a broker bug)."""


@dataclass(frozen=True, slots=True)
class AgentPayload:
    """The caller's task and schema text for one bounded-agent invocation."""

    task: str
    schema: str

    def __post_init__(self) -> None:
        for name in ("task", "schema"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise PayloadError(f"{name} must be text")
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise PayloadError(f"{name} is not encodable as UTF-8") from exc

    @property
    def task_bytes(self) -> bytes:
        """The task as the enclave's ``task.txt`` holds it."""
        return self.task.encode("utf-8")

    @property
    def schema_bytes(self) -> bytes:
        """The schema as the enclave's ``schema.json`` holds it."""
        return self.schema.encode("utf-8")


def encode_agent_payload(payload: AgentPayload) -> bytes:
    """The payload's one byte encoding."""
    doc = {"schema": payload.schema, "task": payload.task}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def decode_agent_payload(data: bytes) -> AgentPayload:
    """Inverse of :func:`encode_agent_payload`.

    Raises:
        PayloadError: anything :func:`encode_agent_payload` cannot have produced.
    """
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise PayloadError("not an encoded agent payload") from exc
    if not isinstance(doc, dict) or set(doc) != {"schema", "task"}:
        raise PayloadError("an agent payload has exactly a schema and a task")
    payload = AgentPayload(task=doc["task"], schema=doc["schema"])
    if encode_agent_payload(payload) != data:
        raise PayloadError("not the canonical encoding of an agent payload")
    return payload
