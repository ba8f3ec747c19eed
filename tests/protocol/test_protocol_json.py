"""Unit tests of the strict JSON parser for untrusted bytes (spec 14.5)."""

from __future__ import annotations

import json

import pytest

from bounded_query.broker.protocol import (
    MAX_OUTPUT_DEPTH,
    MAX_RESULT_BYTES,
    JSONError,
    NumberToken,
    strict_parse_json,
)


def rejects(raw: bytes) -> str:
    with pytest.raises(JSONError) as info:
        strict_parse_json(raw)
    return str(info.value)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"true", True),
        (b"false", False),
        (b"null", None),
        (b"0", 0),
        (b"-0", 0),  # RFC 8259 integer token: the int 0, as in the reference (issue 10)
        (b"[-0]", [0]),
        (b"-1", -1),
        (b"9007199254740991", 9007199254740991),
        (b"-9007199254740991", -9007199254740991),
        (b"9999999999999999", 9999999999999999),
        (b'""', ""),
        (b'"a\\"b\\\\c\\/d\\b\\f\\n\\r\\t"', 'a"b\\c/d\b\f\n\r\t'),
        (b'"\\u00e9\\u00E9"', "éé"),
        (b'"\\ud83d\\ude00"', "\U0001f600"),
        ('"é😀"'.encode(), "é😀"),
        (b'"\x7f"', "\x7f"),
        (b"[]", []),
        (b"{}", {}),
        (b' \t\r\n[1, [2], {"a": {}}] \n', [1, [2], {"a": {}}]),
        (b'{"__proto__": 1, "constructor": 2}', {"__proto__": 1, "constructor": 2}),
    ],
)
def test_accepts(raw: bytes, expected: object) -> None:
    value = strict_parse_json(raw)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("raw", "token"),
    [
        (b"1.0", "1.0"),
        (b"1e0", "1e0"),
        (b"1E+2", "1E+2"),
        (b"-0.0", "-0.0"),
        (b"-0e0", "-0e0"),
        (b"-0E-0", "-0E-0"),
        (b"0.5e-3", "0.5e-3"),
        (b"10000000000000000", "10000000000000000"),  # 17 digits
        (b"-" + b"9" * 5000, "-" + "9" * 5000),  # int() would refuse > 4300 digits
    ],
)
def test_non_integer_numbers_are_tokens(raw: bytes, token: str) -> None:
    assert strict_parse_json(raw) == NumberToken(token)


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b" ",
        b"tru",
        b"True",
        b"nul",
        b"NaN",
        b"Infinity",
        b"-Infinity",
        b"+1",
        b"01",
        b"-01",
        b"-00",
        b"- 0",
        b"1.",
        b".5",
        b"1e",
        b"1e+",
        b"0x10",
        b"-",
        b"1 2",
        b"[1,]",
        b"[,1]",
        b"[1 2]",
        b"{,}",
        b'{"a":1,}',
        b'{"a" 1}',
        b"{a:1}",
        b"{'a':1}",
        b"{1:1}",
        b'{"a":1 "b":2}',
        b"[",
        b"]",
        b"{",
        b'"abc',
        b'"\\',
        b'"\\x41"',
        b'"\\u12"',
        b'"\\u12G4"',
        b'"\\u+123"',
        b'"\\U0041"',
        b"'a'",
        b'"a\nb"',
        b'"\x00"',
        b'"\x1f"',
        b'"\t"',
        b"[1]x",
        b"{}{}",
        b"\xef\xbb\xbf{}",  # BOM
        b"\x0c1",  # form feed is not JSON whitespace
        b"\xa01",
        b"// c\n1",
        b"/* c */1",
    ],
)
def test_rejects_malformed(raw: bytes) -> None:
    rejects(raw)


def test_duplicate_keys_rejected_even_after_unescaping() -> None:
    assert "duplicate object key" in rejects(b'{"a":1,"a":1}')
    assert "duplicate object key" in rejects(b'{"a":1,"\\u0061":2}')
    assert "duplicate object key" in rejects(b'[{"x":{"k":1,"k":2}}]')
    assert json.loads(b'{"a":1,"a":2}') == {"a": 2}  # the pitfall we avoid


@pytest.mark.parametrize(
    "raw",
    [
        b'"\\ud800"',
        b'"\\udc00"',
        b'"\\udfff\\ud800"',
        b'"\\ud800x"',
        b'"\\ud800\\u0041"',
        b'"\\ud800\\ud800"',
        b'{"\\ud800":1}',
    ],
)
def test_lone_surrogate_escapes_rejected(raw: bytes) -> None:
    assert "surrogate" in rejects(raw) or "escape" in rejects(raw)
    json.loads(raw)  # the pitfall: the stdlib accepts these


@pytest.mark.parametrize(
    "raw",
    [
        b'"\xff"',
        b'"\xc0\xaf"',  # overlong "/"
        b'"\xed\xa0\x80"',  # UTF-8 encoded surrogate
        b'"\xe2\x82"',  # truncated
        b'"\xf4\x90\x80\x80"',  # above U+10FFFF
        b"\x80",
    ],
)
def test_invalid_utf8_rejected(raw: bytes) -> None:
    assert "invalid UTF-8" in rejects(raw)


def test_size_limit_at_and_past() -> None:
    at_limit = b'"' + b"a" * (MAX_RESULT_BYTES - 2) + b'"'
    assert len(at_limit) == MAX_RESULT_BYTES
    assert strict_parse_json(at_limit) == "a" * (MAX_RESULT_BYTES - 2)
    assert "larger than 8192" in rejects(at_limit + b" ")
    assert strict_parse_json(b"1", max_bytes=1) == 1
    with pytest.raises(JSONError):
        strict_parse_json(b"12", max_bytes=1)


def test_depth_limit_at_and_past() -> None:
    ok = b"[" * MAX_OUTPUT_DEPTH + b"]" * MAX_OUTPUT_DEPTH
    assert strict_parse_json(ok) is not None
    assert "nesting too deep" in rejects(
        b"[" * (MAX_OUTPUT_DEPTH + 1) + b"]" * (MAX_OUTPUT_DEPTH + 1)
    )
    deep_obj = b'{"a":' * (MAX_OUTPUT_DEPTH + 1) + b"1" + b"}" * (MAX_OUTPUT_DEPTH + 1)
    assert "nesting too deep" in rejects(deep_obj)
    # Unclosed deep input fails on depth, not on Python's recursion limit.
    assert "nesting too deep" in rejects(b"[" * 8000)


def test_non_bytes_rejected() -> None:
    with pytest.raises(JSONError, match="must be bytes"):
        strict_parse_json("1")  # type: ignore[arg-type]
    # The annotation says bytes; other bytes-like objects work too.
    assert strict_parse_json(bytearray(b"[1]")) == [1]  # type: ignore[arg-type]
    assert strict_parse_json(memoryview(b"2")) == 2  # type: ignore[arg-type]


def test_error_names_offset() -> None:
    assert rejects(b"[1,]") == "json: unexpected character at offset 3"
    assert rejects(b"[1] x") == "json: trailing content at offset 4"
