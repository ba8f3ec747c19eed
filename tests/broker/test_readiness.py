"""The readiness file's format (broker/readiness.py): what it announces, and fail-closed reading."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bounded_query.broker.readiness import UNREADABLE, decode_ready, encode_ready
from bounded_query.broker.runner import Degradation

texts = st.text(min_size=0, max_size=80)


@given(st.lists(st.tuples(texts, texts), max_size=5), st.integers(1, 2**22))
def test_what_is_written_is_what_is_read(pairs, pid):
    degraded = tuple(Degradation(s, r) for s, r in pairs)
    text = encode_ready(pid, degraded)
    assert text.endswith("\n")
    assert text.count("\n") == 1
    assert json.loads(text)["pid"] == pid
    assert decode_ready(text) == degraded


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1234\n",  # a pid alone: says nothing about the protections
        "{",
        "[]",
        '{"pid": 1}',
        '{"pid": 1, "degraded": {}}',
        '{"pid": 1, "degraded": ["page-cache pin"]}',
        '{"pid": 1, "degraded": [{"subsystem": "x"}]}',
        '{"pid": 1, "degraded": [{"subsystem": "x", "reason": 7}]}',
        '{"pid": 1, "degraded": [{"subsystem": "a", "reason": "b"}, null]}',
    ],
)
def test_anything_malformed_reads_as_unknown_protections(text):
    assert decode_ready(text) == (UNREADABLE,)


def test_nothing_missing_reads_as_nothing():
    assert decode_ready('{"pid": 1, "degraded": []}') == ()
