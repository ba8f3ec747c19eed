"""Unit tests of request rules and HTTP framing (spec 14.2, 14.3; docs/architecture.md framing)."""

from __future__ import annotations

import base64
import json

import pytest

from bounded_query.broker.protocol import (
    MAX_SCHEMA_BYTES,
    MAX_SCRIPT_BYTES,
    Request,
    RequestError,
    cardinality,
    check_request_line,
    decode_schema_header,
    encode_schema_header,
    is_valid_slug,
    parse_frame,
    parse_request,
    parse_schema,
)

BOOL_JSON = b'{"type":"boolean"}'


def headers(
    schema: bytes = BOOL_JSON, repo: bytes = b"octo/alpha", version: bytes = b"2"
) -> list[tuple[bytes, bytes]]:
    return [
        (b"host", b"localhost"),
        (b"x-awf-query-version", version),
        (b"x-awf-repo", repo),
        (b"x-awf-schema-b64", encode_schema_header(schema)),
        (b"content-type", b"text/x-python"),
        (b"content-length", b"8"),
    ]


def frame_error(hdrs: list[tuple[bytes, bytes]], body: bytes = b"print(1)") -> str:
    with pytest.raises(RequestError) as info:
        parse_frame(hdrs, body)
    return str(info.value)


# --- slugs ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "slug",
    [
        "o/r",
        "octo/alpha",
        "my-org/my.private_repo-2",
        "A" + "b" * 38 + "/" + "r" * 100,  # 39 + 1 + 100 = 140
        "0/.r",
        "o/r.",
        "o/.github",
        "o/_",
        "o/-",
    ],
)
def test_valid_slugs(slug: str) -> None:
    assert is_valid_slug(slug)


@pytest.mark.parametrize(
    "slug",
    [
        "",
        "o",
        "o/",
        "/r",
        "o/r\n",  # re's $ would accept this
        "o/r/x",
        "o//r",
        "-o/r",
        "o_x/r",
        "o.x/r",
        "A" + "b" * 39 + "/r",  # owner of 40 characters
        "o/" + "r" * 101,
        "o/.",
        "o/..",
        "o/a..b",
        "o/r?x",
        "o/r#x",
        "o/r*",
        "https://github.com/o/r",
        "o/r ",
        " o/r",
        "ö/r",
        "o/ŕ",
        "o/\uff52",
        "o/r\x00",
    ],
)
def test_invalid_slugs(slug: str) -> None:
    assert not is_valid_slug(slug)


def test_slug_non_strings() -> None:
    for value in (None, b"o/r", 1, ["o/r"]):
        assert not is_valid_slug(value)


# --- request line ------------------------------------------------------------------


def test_request_line() -> None:
    check_request_line(b"POST", b"/query")
    for method, target in [
        (b"GET", b"/query"),
        (b"post", b"/query"),
        (b"POST", b"/query/"),
        (b"POST", b"/query?x=1"),
        (b"POST", b"/Query"),
        (b"POST", b"/"),
        (b"PUT", b"/query"),
    ]:
        with pytest.raises(RequestError):
            check_request_line(method, target)


# --- parse_request -------------------------------------------------------------------


def request_obj(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "privateRepo": "octo/alpha",
        "schema": {"type": "boolean"},
        "script": "print(1)",
    }
    base.update(overrides)
    return base


def test_parse_request_ok() -> None:
    request = parse_request(request_obj())
    assert request == Request("octo/alpha", parse_schema({"type": "boolean"}), "print(1)")
    with pytest.raises(AttributeError):
        request.script = "x"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (None, "request: must be an object"),
        ([], "request: must be an object"),
        ({}, "exactly privateRepo, schema and script"),
        (request_obj(extra=1), "exactly privateRepo, schema and script"),
        ({"privateRepo": "o/r", "schema": {"type": "boolean"}}, "exactly"),
        (request_obj(privateRepo="o/r\n"), "request.privateRepo: not an owner/repo slug"),
        (request_obj(privateRepo=None), "request.privateRepo: not an owner/repo slug"),
        (request_obj(script=""), "request.script: must not be empty"),
        (request_obj(script=b"x"), "request.script: must be a string"),
        (request_obj(script="\ud800"), "lone surrogate"),
        (request_obj(script="x" * (MAX_SCRIPT_BYTES + 1)), "larger than 65536 bytes"),
        (request_obj(script="é" * (MAX_SCRIPT_BYTES // 2 + 1)), "larger than 65536 bytes"),
        (request_obj(schema={"type": "nope"}), "schema: unknown type 'nope'"),
        (request_obj(schema={"type": "integer", "minimum": 1, "maximum": 0}), "maximum must be"),
    ],
)
def test_parse_request_errors(obj: object, message: str) -> None:
    with pytest.raises(RequestError, match=None) as info:
        parse_request(obj)
    assert message in str(info.value)


def test_script_limit_counts_utf8_bytes() -> None:
    assert parse_request(request_obj(script="x" * MAX_SCRIPT_BYTES))
    assert parse_request(request_obj(script="é" * (MAX_SCRIPT_BYTES // 2)))


# --- base64url ------------------------------------------------------------------------


def test_schema_header_round_trip() -> None:
    for raw in (b"", b"a", b"ab", b"abc", b"abcd", bytes(range(256))):
        encoded = encode_schema_header(raw)
        assert b"=" not in encoded
        assert decode_schema_header(encoded) == raw


@pytest.mark.parametrize(
    "value",
    [
        b"eyJ0eXBlIjoiYm9vbGVhbiJ9=",  # padding (not needed here, wrong anyway)
        base64.urlsafe_b64encode(b"ab"),  # canonical but padded: b"YWI="
        b"YW",  # wait: valid ("a") - replaced below
        b"YWI+",  # standard alphabet
        b"YWI/",
        b"YW I",
        b"YWI\n",
        b"Y",  # length 1 mod 4
        b"YWJjZ",  # length 1 mod 4
        b"YR",  # dangling bits (canonical is YQ)
        b"YWJ",  # dangling bits (canonical is YWI)
        "YWI\u00e9".encode(),
    ],
)
def test_non_canonical_base64url_rejected(value: bytes) -> None:
    if value == b"YW":
        value = b"YX"  # "a" is YQ; YX leaves dangling bits
    with pytest.raises(RequestError):
        decode_schema_header(value)


def test_schema_header_size_limit() -> None:
    assert len(decode_schema_header(encode_schema_header(b"x" * MAX_SCHEMA_BYTES))) == 4096
    with pytest.raises(RequestError, match="larger than 4096"):
        decode_schema_header(encode_schema_header(b"x" * (MAX_SCHEMA_BYTES + 1)))
    with pytest.raises(RequestError, match="larger than 4096"):
        decode_schema_header(b"A" * 100_000)


# --- parse_frame ----------------------------------------------------------------------------


def test_parse_frame_ok() -> None:
    request = parse_frame(headers(), b"print(1)")
    assert request.private_repo == "octo/alpha"
    assert request.script == "print(1)"
    assert cardinality(request.schema) == 2


def test_header_names_case_insensitive() -> None:
    mixed = [
        (b"X-AWF-Query-Version", b"2"),
        (b"X-Awf-Repo", b"octo/alpha"),
        (b"X-AWF-SCHEMA-B64", encode_schema_header(BOOL_JSON)),
    ]
    assert parse_frame(mixed, b"x").private_repo == "octo/alpha"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ((b"x-awf-query-version", b"2"), "duplicate x-awf-query-version"),
        ((b"X-AWF-Repo", b"octo/alpha"), "duplicate x-awf-repo"),
        ((b"x-awf-schema-b64", encode_schema_header(BOOL_JSON)), "duplicate x-awf-schema-b64"),
        ((b"x-awf-sensitivity", b"public"), "unknown X-AWF-* header"),
        ((b"X-AWF-", b""), "unknown X-AWF-* header"),
    ],
)
def test_duplicate_and_unknown_awf_headers(extra: tuple[bytes, bytes], message: str) -> None:
    assert message in frame_error([*headers(), extra])


@pytest.mark.parametrize("name", [b"x-awf-query-version", b"x-awf-repo", b"x-awf-schema-b64"])
def test_missing_headers(name: bytes) -> None:
    hdrs = [(n, v) for n, v in headers() if n != name]
    assert f"missing {name.decode()}" in frame_error(hdrs)


@pytest.mark.parametrize("version", [b"1", b"3", b"", b" 2", b"2 ", b"02", b"2.0", b"v2"])
def test_version_must_be_exactly_2(version: bytes) -> None:
    assert frame_error(headers(version=version)) == "x-awf-query-version: must be 2"


@pytest.mark.parametrize("repo", [b"octo/alpha\n", b"octo", b"o/..", b"\xc3\xb6/r", b"o/r\x00"])
def test_bad_repo_header(repo: bytes) -> None:
    assert frame_error(headers(repo=repo)) == "x-awf-repo: not an owner/repo slug"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "body: script must not be empty"),
        (b"x" * (MAX_SCRIPT_BYTES + 1), "body: script larger than 65536 bytes"),
        (b"print('\xff')", "body: script is not valid UTF-8"),
        (b"\xed\xa0\x80", "body: script is not valid UTF-8"),
    ],
)
def test_bad_body(body: bytes, message: str) -> None:
    assert frame_error(headers(), body) == message


def test_body_at_limit() -> None:
    assert len(parse_frame(headers(), b"x" * MAX_SCRIPT_BYTES).script) == MAX_SCRIPT_BYTES


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (b'{"type":"boolean","type":"boolean"}', "duplicate object key"),
        (b'{"type":"boolean"} x', "trailing content"),
        (b'{"type":"const","value":"\\ud800"}', "surrogate"),
        (b'{"type":"integer","minimum":0,"maximum":1.0}', "schema.maximum: must be an integer"),
        (b'{"type":"integer","minimum":0,"maximum":1e1}', "schema.maximum: must be an integer"),
        (b'{"type":"const","value":NaN}', "unexpected character"),
        (b"\xff", "invalid UTF-8"),
        (b"", "unexpected end of input"),
        (b'{"type":"integer","minimum":2,"maximum":1}', "schema: maximum must be >= minimum"),
    ],
)
def test_bad_schema_header(schema: bytes, message: str) -> None:
    assert message in frame_error(headers(schema=schema))


def test_raw_schema_bytes_are_counted() -> None:
    # Whitespace in the raw header counts against MAX_SCHEMA_BYTES even though
    # the compact serialization would be tiny (docs/architecture.md decision 6).
    padded = BOOL_JSON + b" " * (MAX_SCHEMA_BYTES - len(BOOL_JSON))
    assert parse_frame(headers(schema=padded), b"x")
    assert "larger than 4096" in frame_error(headers(schema=padded + b" "))
    # Escapes count as written: "\u0041" is 6 raw bytes for one character.
    escaped = b'{"type":"const","value":"' + b"\\u0041" * 10 + b'"}'
    assert parse_frame(headers(schema=escaped), b"x").schema.canonical == (
        '{"type":"const","value":"' + "A" * 10 + '"}'
    )


def test_frame_and_object_forms_agree() -> None:
    schema = {"type": "tuple", "items": [{"type": "enum", "values": ["a", "é"]}]}
    raw = json.dumps(schema, ensure_ascii=False).encode()
    from_frame = parse_frame(headers(schema=raw), "é".encode())
    from_obj = parse_request({"privateRepo": "octo/alpha", "schema": schema, "script": "é"})
    assert from_frame == from_obj


def test_non_bytes_body_rejected() -> None:
    assert frame_error(headers(), "print(1)") == "body: must be bytes"  # type: ignore[arg-type]


def test_header_length_bound_is_exact() -> None:
    longest = encode_schema_header(b"x" * MAX_SCHEMA_BYTES)
    assert len(longest) == 5462
    with pytest.raises(RequestError, match="larger than 4096"):
        decode_schema_header(longest + b"A")


def test_non_bytes_headers_rejected() -> None:
    assert "must be bytes" in frame_error([("x-awf-repo", "o/r")])  # type: ignore[list-item]
