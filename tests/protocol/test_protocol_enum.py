"""Enum validation: the wide-enum fast path agrees with the per-value rules (spec 14.3)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bounded_query.broker.protocol import (
    MAX_SAFE_INTEGER,
    MAX_SCHEMA_BYTES,
    SchemaError,
    cardinality,
    check_output,
    parse_schema,
)


def enum_error(values: list[object]) -> str:
    with pytest.raises(SchemaError) as info:
        parse_schema({"type": "enum", "values": values})
    return str(info.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([*range(10), 3], "schema.values[10]: duplicate enum value"),
        ([0, 1, MAX_SAFE_INTEGER + 1, 3], "schema.values[2]: must be a safe integer"),
        ([0, 1, 2, True], "schema.values[3]: enum values must all be of one JSON type (integer)"),
        ([0, 1, 2.0], "schema.values[2]: literal must be"),
        (["a", "b", "c", "x" * 65], "schema.values[3]: string longer than 64 UTF-8 bytes"),
        (["a", "b", "é" * 33], "schema.values[2]: string longer than 64 UTF-8 bytes"),
        (["a", "b", "\ud800"], "schema.values[2]: string is not valid Unicode"),
        (["a", "b\x7f"], "schema.values[1]: string contains a control character"),
        (["a", "b", "a"], "schema.values[2]: duplicate enum value"),
        (["a", None], "schema.values[1]: enum values must all be of one JSON type (string)"),
        ([None, None], "schema.values[1]: duplicate enum value"),
    ],
)
def test_wide_enum_errors_are_located(values: list[object], message: str) -> None:
    assert enum_error(values).startswith(message)


def test_widest_integer_enum_fits_exactly() -> None:
    n = 0
    while len(
        json.dumps({"type": "enum", "values": list(range(n + 1))}, separators=(",", ":"))
    ) <= (MAX_SCHEMA_BYTES):
        n += 1
    schema = parse_schema({"type": "enum", "values": list(range(n))})
    assert cardinality(schema) == n == 1036
    assert check_output(b"1035", schema) == "1035"
    assert check_output(b"1036", schema) is None
    assert enum_error(list(range(n + 1))) == "schema: serialized schema is 4101 bytes (max 4096)"


def test_escaped_strings_in_wide_enum() -> None:
    values = ['q"', "b\\", "plain", "é"]
    schema = parse_schema({"type": "enum", "values": values})
    assert schema.canonical == '{"type":"enum","values":["q\\"","b\\\\","plain","é"]}'
    assert check_output(b'"q\\""', schema) == '"q\\""'


def _oracle_ok(values: list[object]) -> bool:
    """The enum rules, written out value by value."""
    if not 1 <= len(values) <= 4096:
        return False
    kinds = set()
    seen = set()
    for v in values:
        if v is None:
            kind = "n"
        elif type(v) is bool:
            kind = "b"
        elif type(v) is int:
            kind = "i"
            if abs(v) > MAX_SAFE_INTEGER:
                return False
        elif type(v) is str:
            kind = "s"
            try:
                size = len(v.encode())
            except UnicodeEncodeError:
                return False
            if size > 64 or any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in v):
                return False
        else:
            return False
        kinds.add(kind)
        if (kind, v) in seen:
            return False
        seen.add((kind, v))
    if len(kinds) != 1:
        return False
    size = len(
        json.dumps(
            {"type": "enum", "values": values}, separators=(",", ":"), ensure_ascii=False
        ).encode()
    )
    return size <= MAX_SCHEMA_BYTES


_LITS = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([MAX_SAFE_INTEGER, MAX_SAFE_INTEGER + 1, -MAX_SAFE_INTEGER - 1]),
    st.text(max_size=3),
    st.text(alphabet='é\x7f\x9f"\\a', max_size=40),
    st.sampled_from(["\ud800", "x" * 65, True, None, 1.0]),
)


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(st.lists(_LITS, min_size=1, max_size=8), st.lists(st.integers(-5, 5), max_size=12))
)
def test_enum_rules_match_oracle(values: list[object]) -> None:
    try:
        schema = parse_schema({"type": "enum", "values": values})
    except SchemaError:
        assert not _oracle_ok(values)
        return
    assert _oracle_ok(values)
    assert cardinality(schema) == len(values)
    assert json.loads(schema.canonical)["values"] == values


def test_deepest_union_output_nests_six_containers() -> None:
    node: dict[str, object] = {"type": "boolean"}
    for _ in range(5):
        node = {"type": "union", "variants": {"v": node}}
    schema = parse_schema(node)
    raw = b'{"tag":"v","value":' * 5 + b"true" + b"}" * 5
    assert check_output(raw, schema) == raw.decode()
