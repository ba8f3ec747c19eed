"""Unit tests of output validation and canonical re-serialization (spec 14.5)."""

from __future__ import annotations

import pytest

from bounded_query.broker.protocol import (
    CANONICAL_ERROR_BODY,
    MAX_RESULT_BYTES,
    MAX_SAFE_INTEGER,
    canonicalize,
    check_output,
    json_string,
    ok_body,
    parse_schema,
)

BOOL = {"type": "boolean"}


def schema_of(obj: object):
    return parse_schema(obj)


MIXED = schema_of(
    {
        "type": "object",
        "fields": {
            "count": {"type": "integer", "minimum": -10, "maximum": 10},
            "flag": BOOL,
            "pair": {"type": "tuple", "items": [{"type": "const", "value": None}, BOOL]},
            "list": {"type": "array", "items": {"type": "enum", "values": ["a", "b"]}, "length": 2},
            "pick": {
                "type": "union",
                "variants": {
                    "num": {"type": "integer", "minimum": 0, "maximum": 3},
                    "none": {"type": "const", "value": "n"},
                },
            },
        },
    }
)
MIXED_CANONICAL = (
    '{"count":-3,"flag":false,"pair":[null,true],"list":["b","a"],"pick":{"tag":"num","value":2}}'
)


def test_canonical_reorders_and_strips_whitespace() -> None:
    raw = (
        b'\n { "pick" : { "value":2, "tag":"num" }, "list":[ "b","a" ],\n'
        b'"pair":[null , true], "flag": false, "count": -3 }\t'
    )
    assert check_output(raw, MIXED) == MIXED_CANONICAL
    assert check_output(MIXED_CANONICAL.encode(), MIXED) == MIXED_CANONICAL


@pytest.mark.parametrize(
    "raw",
    [
        # missing, extra, duplicate fields
        b'{"count":-3,"flag":false,"pair":[null,true],"list":["b","a"]}',
        b'{"count":-3,"flag":false,"pair":[null,true],"list":["b","a"],"pick":{"tag":"none","value":"n"},"x":1}',
        b'{"count":-3,"count":-3,"flag":false,"pair":[null,true],"list":["b","a"],"pick":{"tag":"none","value":"n"}}',
        # out of range / wrong type integers
        b'{"count":11,"flag":false,"pair":[null,true],"list":["b","a"],"pick":{"tag":"none","value":"n"}}',
        b'{"count":-3.0,"flag":false,"pair":[null,true],"list":["b","a"],"pick":{"tag":"none","value":"n"}}',
        b'{"count":-3e0,"flag":false,"pair":[null,true],"list":["b","a"],"pick":{"tag":"none","value":"n"}}',
        b'{"count":true,"flag":false,"pair":[null,true],"list":["b","a"],"pick":{"tag":"none","value":"n"}}',
        b'{"count":"1","flag":false,"pair":[null,true],"list":["b","a"],"pick":{"tag":"none","value":"n"}}',
        # boolean as integer
        b'{"count":1,"flag":0,"pair":[null,true],"list":["b","a"],"pick":{"tag":"none","value":"n"}}',
        # wrong lengths
        b'{"count":1,"flag":true,"pair":[null],"list":["b","a"],"pick":{"tag":"none","value":"n"}}',
        b'{"count":1,"flag":true,"pair":[null,true],"list":["b","a","a"],"pick":{"tag":"none","value":"n"}}',
        # enum / const mismatch
        b'{"count":1,"flag":true,"pair":[null,true],"list":["b","c"],"pick":{"tag":"none","value":"n"}}',
        b'{"count":1,"flag":true,"pair":[false,true],"list":["b","a"],"pick":{"tag":"none","value":"n"}}',
        # union: unknown tag, extra key, missing value, wrong variant value
        b'{"count":1,"flag":true,"pair":[null,true],"list":["b","a"],"pick":{"tag":"zzz","value":"n"}}',
        b'{"count":1,"flag":true,"pair":[null,true],"list":["b","a"],"pick":{"tag":"none","value":"n","x":1}}',
        b'{"count":1,"flag":true,"pair":[null,true],"list":["b","a"],"pick":{"tag":"none"}}',
        b'{"count":1,"flag":true,"pair":[null,true],"list":["b","a"],"pick":{"tag":"num","value":"n"}}',
        b'{"count":1,"flag":true,"pair":[null,true],"list":["b","a"],"pick":{"tag":"none","tagx":"n"}}',
        b'{"count":1,"flag":true,"pair":[null,true],"list":["b","a"],"pick":["none","n"]}',
        # not an object at all
        b"[]",
        b"null",
        b"",
    ],
)
def test_nonconforming_rejected(raw: bytes) -> None:
    assert check_output(raw, MIXED) is None


@pytest.mark.parametrize(
    "token",
    [b"1.0", b"1e0", b"1E0", b"-0.0", b"-0e0", b"0.0", b"0e0", b"01", b"-00", b"+1", b"1.5"],
)
def test_integer_tokens_only(token: bytes) -> None:
    # Decision 6: only plain integer tokens are integers (strict-side deviation).
    schema = schema_of({"type": "integer", "minimum": -5, "maximum": 5})
    assert check_output(token, schema) is None


def test_minus_zero_is_zero_and_canonicalizes_to_0() -> None:
    # As the reference does (issue 10): ``-0`` is the integer 0.
    assert check_output(b"-0", schema_of({"type": "integer", "minimum": -5, "maximum": 5})) == "0"
    assert check_output(b"-0", schema_of({"type": "integer", "minimum": 0, "maximum": 0})) == "0"
    assert check_output(b"-0", schema_of({"type": "integer", "minimum": 1, "maximum": 5})) is None
    assert check_output(b" -0 ", schema_of({"type": "const", "value": 0})) == "0"
    assert check_output(b"-0", schema_of({"type": "enum", "values": [0, 1]})) == "0"
    assert check_output(b"-0", schema_of({"type": "enum", "values": [False, True]})) is None
    array = schema_of({"type": "array", "items": {"type": "enum", "values": [0, 1]}, "length": 2})
    assert check_output(b"[-0, 1]", array) == "[0,1]"


def test_integer_range_edges_and_digits() -> None:
    wide = schema_of({"type": "integer", "minimum": -MAX_SAFE_INTEGER, "maximum": MAX_SAFE_INTEGER})
    assert check_output(b"9007199254740991", wide) == "9007199254740991"
    assert check_output(b"-9007199254740991", wide) == "-9007199254740991"
    assert check_output(b"9007199254740992", wide) is None
    assert check_output(b"99999999999999999", wide) is None  # 17 digits: never int()
    assert check_output(b"9" * 5000, wide) is None  # would raise ValueError in int()
    assert check_output(b"0", wide) == "0"


def test_const_and_enum_types_are_strict() -> None:
    assert check_output(b"1", schema_of({"type": "const", "value": True})) is None
    assert check_output(b"true", schema_of({"type": "const", "value": 1})) is None
    assert check_output(b"0", schema_of({"type": "enum", "values": [False, True]})) is None
    assert check_output(b"false", schema_of({"type": "enum", "values": [0, 1]})) is None
    assert check_output(b"1.0", schema_of({"type": "enum", "values": [0, 1]})) is None
    assert check_output(b'"1"', schema_of({"type": "enum", "values": [0, 1]})) is None
    assert check_output(b"null", schema_of({"type": "const", "value": None})) == "null"
    assert check_output(b" 1 ", schema_of({"type": "enum", "values": [0, 1]})) == "1"


def test_boolean() -> None:
    schema = schema_of(BOOL)
    assert check_output(b"true", schema) == "true"
    assert check_output(b"false", schema) == "false"
    for raw in (b"1", b"0", b'"true"', b"null", b"True"):
        assert check_output(raw, schema) is None


def test_string_escaping_is_canonical() -> None:
    text = 'q"b\\s/\b\f\n\r\t\x00\x01\x1f\x7f\x80é\u2028😀'
    schema = schema_of({"type": "enum", "values": ["x", 'q"b\\s/é\u2028😀']})
    # Escaped and raw spellings of the same string give the same canonical bytes.
    assert check_output(b'"q\\"b\\\\s\\/\\u00e9\\u2028\\ud83d\\ude00"', schema) == (
        '"q\\"b\\\\s/é\u2028😀"'
    )
    assert check_output('"q\\"b\\\\s/é\u2028😀"'.encode(), schema) == '"q\\"b\\\\s/é\u2028😀"'
    assert json_string(text) == (
        '"q\\"b\\\\s/\\b\\f\\n\\r\\t\\u0000\\u0001\\u001f\x7f\x80é\u2028😀"'
    )


def test_output_size_limit() -> None:
    schema = schema_of({"type": "const", "value": 1})
    padded = b" " * (MAX_RESULT_BYTES - 1) + b"1"
    assert check_output(padded, schema) == "1"
    assert check_output(b" " + padded, schema) is None


def test_empty_containers() -> None:
    # Empty objects and tuples are not schemas (issue 10); an empty array is.
    assert check_output(b"[ ]", schema_of({"type": "array", "items": BOOL, "length": 0})) == "[]"
    assert check_output(b"[]", schema_of({"type": "array", "items": BOOL, "length": 0})) == "[]"
    assert check_output(b"[true]", schema_of({"type": "array", "items": BOOL, "length": 0})) is None


def test_proto_key_is_ordinary() -> None:
    schema = schema_of({"type": "object", "fields": {"a": BOOL}})
    assert check_output(b'{"a":true,"__proto__":{}}', schema) is None
    assert check_output(b'{"__proto__":true}', schema) is None


def test_canonicalize_takes_parsed_values() -> None:
    assert canonicalize({"count": 0}, MIXED) is None
    assert canonicalize(True, schema_of(BOOL)) == "true"
    assert canonicalize(1, schema_of(BOOL)) is None


def test_envelopes() -> None:
    assert ok_body("true") == b'{"status":"ok","result":true}'
    assert ok_body('"é"') == '{"status":"ok","result":"é"}'.encode()
    assert CANONICAL_ERROR_BODY == b'{"status":"error"}'
