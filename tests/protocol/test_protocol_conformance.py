"""The protocol conformance table, ``conformance.yaml`` (spec 14.3, 14.5; issue 10).

Each row of the table is one parametrized case, named by its ``id``. The
schema rows judge the schema text exactly as the broker judges the decoded
``X-AWF-Schema-B64`` header (raw size, strict JSON, then the finite DSL) and
send the same text through :func:`parse_frame` and the agent's
``bounded-query-cost`` assessment, which must agree; output rows
run :func:`check_output`; frame rows run :func:`parse_frame`. The table's
shape is checked strictly, so a misspelt key fails instead of being ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import bounded_query.broker.protocol as protocol
from bounded_query.broker.protocol import (
    MAX_OUTPUT_DEPTH,
    MAX_SCHEMA_BYTES,
    SATURATED,
    JSONError,
    Request,
    RequestError,
    SchemaError,
    cardinality,
    charge,
    check_output,
    encode_schema_header,
    parse_frame,
    parse_schema,
    strict_parse_json,
)
from bounded_query.wrapper.bounded_query_cost import assess

TABLE_FILE = Path(__file__).with_name("conformance.yaml")
TABLE: dict[str, list[dict[str, Any]]] = yaml.safe_load(TABLE_FILE.read_text(encoding="utf-8"))

#: The one marker of a deliberate strict-side deviation (docs/architecture.md decision 6).
DEVIATION = "decision-6"
_COMMON = {"id", "deviation", "note"}
_KEYS = {
    "schemas": _COMMON | {"schema", "pad", "valid", "cardinality", "charge", "canonical", "error"},
    "outputs": _COMMON | {"schema", "raw", "raw_hex", "canonical"},
    "frames": _COMMON
    | {"headers", "schema", "schema_b64", "body", "body_hex", "accepted", "error"},
}
_DEFAULT_HEADERS = [["x-awf-query-version", "2"], ["x-awf-repo", "octo/alpha"]]


def rows(section: str) -> list[Any]:
    return [pytest.param(row, id=row["id"]) for row in TABLE[section]]


def judge_schema(raw: bytes) -> tuple[Any, str | None]:
    """The broker's judgement of raw schema bytes: (Schema, None) or (None, error)."""
    try:
        obj = strict_parse_json(raw, max_bytes=MAX_SCHEMA_BYTES, max_depth=MAX_OUTPUT_DEPTH)
        return parse_schema(obj), None
    except (JSONError, SchemaError) as exc:
        return None, str(exc)


def frame(
    raw_headers: list[list[str]], schema_value: bytes | None, body: bytes
) -> tuple[Request | None, str | None]:
    headers = [(name.encode("utf-8"), value.encode("utf-8")) for name, value in raw_headers]
    if schema_value is not None:
        headers.append((b"X-AWF-Schema-B64", schema_value))
    try:
        return parse_frame(headers, body), None
    except RequestError as exc:
        return None, str(exc)


# --- the table itself -------------------------------------------------------------


def test_table_shape() -> None:
    assert set(TABLE) == set(_KEYS)
    ids = [row["id"] for section in TABLE.values() for row in section]
    assert len(ids) == len(set(ids)), "row ids must be unique"
    for section, allowed in _KEYS.items():
        for row in TABLE[section]:
            assert set(row) <= allowed, (row["id"], set(row) - allowed)
            assert row.get("deviation", DEVIATION) == DEVIATION, row["id"]


def test_table_covers_the_three_reference_rules() -> None:
    """Issue 10: each rule is pinned at its boundary, in every section it touches."""
    ids = {row["id"] for section in TABLE.values() for row in section}
    for kind in ("array", "object", "tuple", "union", "mixed"):
        assert {f"depth-7-levels-{kind}", f"depth-8-levels-{kind}"} <= ids
    assert {"empty-object", "empty-tuple", "empty-object-frame"} <= ids
    assert {"minus-zero-as-minimum", "minus-zero-output", "minus-zero-bound-frame"} <= ids
    assert {"minus-zero-point-zero-bound", "minus-zero-exponent-output"} <= ids


def test_deviations_are_all_rejections() -> None:
    """Decision 6 is strictness: we refuse what the lenient reference accepts, never more."""
    deviations = [row for section in TABLE.values() for row in section if "deviation" in row]
    assert len(deviations) >= 10
    for row in deviations:
        assert row.get("valid", False) is False, row["id"]
        assert row.get("accepted", False) is False, row["id"]
        assert row.get("canonical", None) is None, row["id"]


# --- schemas -------------------------------------------------------------------------


@pytest.mark.parametrize("row", rows("schemas"))
def test_schema_row(row: dict[str, Any]) -> None:
    raw = row["schema"].encode("utf-8") + b" " * row.get("pad", 0)
    schema, error = judge_schema(raw)
    if row["valid"]:
        assert error is None, error
        assert "error" not in row
        expected = SATURATED if row["cardinality"] == "saturated" else row["cardinality"]
        assert cardinality(schema) == expected
        assert charge(schema) == row["charge"]
        assert schema.canonical == row.get("canonical", row["schema"].strip())
    else:
        assert schema is None
        assert {"cardinality", "charge", "canonical"}.isdisjoint(row)
        assert error == row["error"]
    # The agent's cost tool gives the same verdict and charge.
    verdict = assess(raw, protocol)
    assert verdict.valid == row["valid"]
    assert verdict.charge == row.get("charge", 0)
    assert (verdict.error is None) == row["valid"]
    # The wire form agrees: the same bytes as the X-AWF-Schema-B64 header.
    request, frame_error = frame(_DEFAULT_HEADERS, encode_schema_header(raw), b"print(1)\n")
    if row["valid"]:
        assert request is not None, frame_error
        assert request.schema == schema
    else:
        assert request is None
        assert frame_error is not None
        assert frame_error.endswith(row["error"]) or frame_error.startswith("x-awf-schema-b64:")


# --- outputs ---------------------------------------------------------------------------


@pytest.mark.parametrize("row", rows("outputs"))
def test_output_row(row: dict[str, Any]) -> None:
    schema, error = judge_schema(row["schema"].encode("utf-8"))
    assert error is None, error
    assert ("raw" in row) != ("raw_hex" in row), row["id"]
    raw = row["raw"].encode("utf-8") if "raw" in row else bytes.fromhex(row["raw_hex"])
    assert check_output(raw, schema) == row["canonical"]
    if row["canonical"] is not None:  # canonical bytes are a fixed point
        assert check_output(row["canonical"].encode("utf-8"), schema) == row["canonical"]


# --- frames ------------------------------------------------------------------------------


@pytest.mark.parametrize("row", rows("frames"))
def test_frame_row(row: dict[str, Any]) -> None:
    assert ("schema" in row) != ("schema_b64" in row), row["id"]
    if "schema" in row:
        value = encode_schema_header(row["schema"].encode("utf-8"))
    else:
        value = row["schema_b64"].encode("ascii")
    body = bytes.fromhex(row["body_hex"]) if "body_hex" in row else row.get("body", "print(1)\n")
    if isinstance(body, str):
        body = body.encode("utf-8")
    request, error = frame(row.get("headers", _DEFAULT_HEADERS), value, body)
    if row["accepted"]:
        assert request is not None, error
        assert "error" not in row
    else:
        assert request is None
        assert error == row["error"]
