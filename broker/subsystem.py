"""What one bounded subsystem plugs into the shared pipeline.

Theory of operation: bounded queries (spec 14) and bounded agents (spec 15)
share every step of the pipeline -- the lane, the refusal gate, admission
and its charge, the journal and accounts, the result check, the buckets,
the audit -- and differ only in: the request frame (its headers, and what
its body is: a script or a task), the payload the runner gets for an
invocation, where the answer is found, which fields the audit may record,
and the runner itself. All but the runner are this descriptor; the runner
is injected next to it (``Service``, ``BrokerServer``). Each subsystem runs
its own broker process with its own private root, so no state is shared
between them.

Which descriptor a broker serves is trusted configuration only
(:func:`subsystem_for`: the config's ``subsystem``); the bounded-agent
descriptor is built per run, because its body bound is the run's
``maxTaskBytes`` (spec 15.2). A bounded agent takes its answer from the
runner's report (``RunReport.result``: the enclave runner read the result
file itself after every container was gone), never from the workspace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from bounded_query.broker.agent_payload import AgentPayload, encode_agent_payload
from bounded_query.broker.audit import AGENT_AUDIT_SCHEMA, AUDIT_SCHEMA
from bounded_query.broker.config import BrokerConfig
from bounded_query.broker.protocol import (
    MAX_RESULT_BYTES,
    MAX_SCRIPT_BYTES,
    AgentRequest,
    Request,
    Schema,
    parse_agent_frame,
    parse_frame,
)
from bounded_query.broker.protocol.policy import (
    ENCLAVE_MAX_OUTPUT_BYTES,
    ENCLAVE_MAX_TASK_BYTES,
    SUBSYSTEM_AGENT,
    SUBSYSTEM_QUERY,
)

__all__ = ["BOUNDED_QUERY", "Framed", "Subsystem", "agent_subsystem", "subsystem_for"]


class Framed(Protocol):
    """What admission needs of a parsed request, whatever its subsystem."""

    @property
    def private_repo(self) -> str:
        """The repository slug the request names."""
        ...

    @property
    def schema(self) -> Schema:
        """The finite response schema (charged before anything runs)."""
        ...


@dataclass(frozen=True, slots=True)
class Subsystem:
    """The request frame and the invocation payload of one subsystem.

    ``parse_frame(headers, body)`` raises ``RequestError`` (the caller's
    fault) for anything it refuses; ``payload`` is the bytes the runner
    receives for a launched request; ``max_body_bytes`` bounds what the
    transport reads. ``max_answer_bytes`` bounds the answer the runner
    reports (``RunReport.result``) again: the runner read it with that
    limit, so a longer one is a runner bug and answers the canonical error.
    ``audit_schema`` is the record type of the broker's audit lines
    (``audit.py``: an agent's carry only spec 15.5's fields).
    """

    name: str
    max_body_bytes: int
    parse_frame: Callable[[Sequence[tuple[bytes, bytes]], bytes], Framed]
    payload: Callable[[Framed], bytes]
    max_answer_bytes: int = MAX_RESULT_BYTES
    audit_schema: str = AUDIT_SCHEMA


def _query_frame(headers: Sequence[tuple[bytes, bytes]], body: bytes) -> Framed:
    return parse_frame(list(headers), body)


def _script(request: Framed) -> bytes:
    assert isinstance(request, Request)
    return request.script.encode("utf-8")


#: Bounded queries: protocol v2 frames, the script as the payload.
BOUNDED_QUERY = Subsystem(
    name=SUBSYSTEM_QUERY,
    max_body_bytes=MAX_SCRIPT_BYTES,
    parse_frame=_query_frame,
    payload=_script,
)


def _agent_payload(request: Framed) -> bytes:
    assert isinstance(request, AgentRequest)
    return encode_agent_payload(AgentPayload(request.task, request.schema_text))


def agent_subsystem(max_task_bytes: int, max_output_bytes: int) -> Subsystem:
    """Bounded agents (spec 15.3): agent frames bounded by the run's ``maxTaskBytes``.

    The payload is the task and the schema's text (``agent_payload.py``);
    the answer comes from the runner's report, at most ``maxOutputBytes``.

    Raises:
        ValueError: ``max_task_bytes`` outside the spec's 1-65536 or
            ``max_output_bytes`` outside 1-8192 (a config bug).
    """

    def frame(headers: Sequence[tuple[bytes, bytes]], body: bytes) -> Framed:
        return parse_agent_frame(headers, body, max_task_bytes=max_task_bytes)

    # The bound is checked now, at start-up, not at the first request.
    if not 1 <= max_task_bytes <= ENCLAVE_MAX_TASK_BYTES:
        raise ValueError(f"max_task_bytes must be 1-{ENCLAVE_MAX_TASK_BYTES}")
    if not 1 <= max_output_bytes <= ENCLAVE_MAX_OUTPUT_BYTES:
        raise ValueError(f"max_output_bytes must be 1-{ENCLAVE_MAX_OUTPUT_BYTES}")
    return Subsystem(
        name=SUBSYSTEM_AGENT,
        max_body_bytes=max_task_bytes,
        parse_frame=frame,
        payload=_agent_payload,
        max_answer_bytes=max_output_bytes,
        audit_schema=AGENT_AUDIT_SCHEMA,
    )


def subsystem_for(config: BrokerConfig) -> Subsystem:
    """The subsystem a broker with ``config`` serves (trusted configuration only)."""
    if config.subsystem == SUBSYSTEM_AGENT:
        assert config.enclave is not None  # parse_config requires it
        return agent_subsystem(config.enclave.max_task_bytes, config.enclave.max_output_bytes)
    return BOUNDED_QUERY
