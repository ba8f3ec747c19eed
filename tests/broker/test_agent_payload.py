"""The agent payload codec: exact round trip, and nothing else decodes."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bounded_query.broker.agent_payload import (
    AgentPayload,
    PayloadError,
    decode_agent_payload,
    encode_agent_payload,
)

_TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=200)


@given(_TEXT, _TEXT)
def test_round_trip_is_exact(task, schema):
    payload = AgentPayload(task=task, schema=schema)
    assert decode_agent_payload(encode_agent_payload(payload)) == payload
    assert payload.task_bytes == task.encode("utf-8")


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"[]",
        b'{"task":"x"}',
        b'{"schema":"s","task":"t","x":1}',
        b'{"schema":1,"task":"t"}',
        b'{"task":"t","schema":"s"}',  # not the canonical key order
        b'{"schema": "s", "task": "t"}',  # not compact
        b'{"schema":"s","task":"\\u00e9"}',  # escaped where the encoding writes UTF-8
        b"\xff",
    ],
)
def test_anything_else_is_refused(data):
    with pytest.raises(PayloadError):
        decode_agent_payload(data)


def test_a_lone_surrogate_cannot_be_a_payload():
    with pytest.raises(PayloadError):
        AgentPayload(task="\ud800", schema="{}")


@given(st.binary(max_size=200))
def test_nothing_but_our_error(data):
    with contextlib.suppress(PayloadError):
        decode_agent_payload(data)
