"""Property tests of the protocol core (issue #2, item 3).

Oracles are written independently of the package: brute-force enumeration
and naive unbounded arithmetic for cardinality, ``json`` for well-formed
documents, a character-level re-implementation of the slug rule.
"""

from __future__ import annotations

import base64
import json
import re

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from bounded_query.broker.protocol import (
    MAX_RESULT_BYTES,
    MAX_SAFE_INTEGER,
    SATURATED,
    SATURATION_LIMIT,
    JSONError,
    NumberToken,
    RequestError,
    SchemaError,
    canonicalize,
    cardinality,
    ceil_log2,
    charge,
    check_output,
    decode_schema_header,
    encode_schema_header,
    is_valid_slug,
    json_string,
    parse_request,
    parse_schema,
    strict_parse_json,
)
from tests.protocol.strategies import (
    all_values,
    brute_cardinality,
    mutated_values_for,
    naive_cardinality,
    renderings,
    schema_objs,
    small_schema_objs,
    valid_schema_objs,
    values_for,
)

SLOW = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SLOW
@given(small_schema_objs())
def test_cardinality_equals_brute_force(schema: object) -> None:
    naive = naive_cardinality(schema)
    assume(naive <= 3000)
    parsed = parse_schema(schema)
    assert cardinality(parsed) == naive == brute_cardinality(schema)
    # Every enumerated value conforms, and canonical forms are pairwise distinct.
    canon = set()
    for value in all_values(schema):
        text = check_output(json.dumps(value).encode(), parsed)
        assert text is not None
        canon.add(text)
    assert len(canon) == naive


@SLOW
@given(schema_objs(max_depth=4, max_len=8))
def test_cardinality_is_naive_value_saturated(schema: object) -> None:
    try:
        parsed = parse_schema(schema)
    except Exception:
        assume(False)
        raise
    naive = naive_cardinality(schema)
    expected = naive if naive <= SATURATION_LIMIT else SATURATED
    assert cardinality(parsed) == expected


@SLOW
@given(valid_schema_objs(), st.data())
def test_conforming_values_pass_and_canonical_is_fixed_point(schema, data) -> None:
    parsed = parse_schema(schema)
    value = data.draw(values_for(schema))
    # values_for builds dicts in schema field order and unions as tag, value:
    # json.dumps then spells exactly the canonical form (independent oracle).
    expected = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    text = data.draw(renderings(value))
    canonical = check_output(text.encode(), parsed)
    if len(text.encode()) > MAX_RESULT_BYTES:
        assert canonical is None
        return
    assert canonical == expected
    # The canonical bytes re-canonicalize to themselves.
    assert check_output(canonical.encode(), parsed) == canonical
    assert json.loads(canonical) == value


@SLOW
@given(valid_schema_objs(), st.data())
def test_mutated_values_fail(schema, data) -> None:
    parsed = parse_schema(schema)
    value = data.draw(values_for(schema))
    bad = data.draw(mutated_values_for(schema, value))
    assert check_output(json.dumps(bad).encode(), parsed) is None
    assert check_output(json.dumps(value).encode(), parsed) is not None or (
        len(json.dumps(value)) > MAX_RESULT_BYTES
    )


@SLOW
@given(valid_schema_objs(), valid_schema_objs())
def test_charge_monotone_in_cardinality(a, b) -> None:
    pa, pb = parse_schema(a), parse_schema(b)
    if cardinality(pa) <= cardinality(pb):
        assert charge(pa) <= charge(pb)
    else:
        assert charge(pa) >= charge(pb)


def _oracle_depth(schema: dict) -> int:
    """Depth of the deepest node, the root being depth 0 (spec 14.3 as the reference reads it)."""
    kind = schema["type"]
    if kind == "array":
        subs = [schema["items"]]
    elif kind == "tuple":
        subs = schema["items"]
    elif kind in ("object", "union"):
        subs = list(schema["fields" if kind == "object" else "variants"].values())
    else:
        return 0
    return 1 + max(_oracle_depth(sub) for sub in subs)


def _nodes_of(schema: dict) -> int:
    return json.dumps(schema).count('"type"')


@SLOW
@given(
    valid_schema_objs(max_depth=4, max_len=4),
    st.sampled_from(["array", "object", "tuple", "union"]),
)
def test_depth_boundary_holds_for_any_schema(schema, kind) -> None:
    """Wrapped to a deepest node at depth 6 a schema stays valid; at depth 7 it is refused."""

    def wrap(node: object) -> dict:
        if kind == "array":
            return {"type": "array", "items": node, "length": 1}
        if kind == "tuple":
            return {"type": "tuple", "items": [node]}
        key = "fields" if kind == "object" else "variants"
        return {"type": kind, key: {"w": node}}

    node = schema
    for _ in range(6 - _oracle_depth(schema)):
        node = wrap(node)
    assume(_nodes_of(node) < 64 and len(json.dumps(node, separators=(",", ":"))) < 4000)
    assert _oracle_depth(node) == 6
    assert cardinality(parse_schema(node)) == cardinality(parse_schema(schema))
    with pytest.raises(SchemaError, match=r": nesting deeper than 6$"):
        parse_schema(wrap(node))


@SLOW
@given(schema_objs())
def test_generated_schemas_never_break_depth_or_emptiness(schema) -> None:
    """The strategies follow the reference's rules: at most depth 6, no empty container."""
    assert _oracle_depth(schema) <= 6
    try:
        parse_schema(schema)
        message = ""
    except SchemaError as exc:
        message = str(exc)
    assert "nesting deeper" not in message
    assert "must have 1 to" not in message


@given(st.integers(1, 2**1100))
def test_ceil_log2_exact(n: int) -> None:
    k = ceil_log2(n)
    assert 2**k >= n
    assert k == 0 or 2 ** (k - 1) < n


@SLOW
@given(valid_schema_objs())
def test_charge_formula(schema) -> None:
    parsed = parse_schema(schema)
    bits = charge(parsed) - 4
    assert 2**bits >= cardinality(parsed)
    assert bits == 0 or 2 ** (bits - 1) < cardinality(parsed)


@SLOW
@given(valid_schema_objs())
def test_schema_canonical_round_trip(schema) -> None:
    parsed = parse_schema(schema)
    again = parse_schema(json.loads(parsed.canonical))
    assert again == parsed
    assert again.canonical == parsed.canonical
    compact = json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode()
    assert len(parsed.canonical.encode()) == len(compact)
    # The strict parser reads the same document as json.
    assert parse_schema(strict_parse_json(compact, max_bytes=len(compact))) == parsed


_json_data = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER)
    | st.text(alphabet=st.characters(exclude_categories=["Cs"])),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=20,
)


@given(_json_data, st.booleans())
def test_strict_parser_reads_json_dumps(value, ascii_only: bool) -> None:
    raw = json.dumps(value, ensure_ascii=ascii_only, indent=None).encode()
    assume(len(raw) <= 8192)
    assert strict_parse_json(raw) == value


@given(st.binary(max_size=64))
def test_strict_parser_accepts_only_what_json_accepts(raw: bytes) -> None:
    try:
        value = strict_parse_json(raw)
    except JSONError:
        return
    reference = json.loads(raw.decode("utf-8"))
    _assert_same(value, reference)


_JSONISH = st.text(alphabet='{}[]":,0123456789-+.eE tfnrulasx\\u\t\n', max_size=40)


@settings(max_examples=500)
@given(_JSONISH)
def test_strict_parser_differential_on_jsonish_text(text: str) -> None:
    raw = text.encode()
    try:
        value = strict_parse_json(raw)
    except JSONError:
        return
    _assert_same(value, json.loads(text))


def _assert_same(ours: object, reference: object) -> None:
    if isinstance(ours, NumberToken):
        assert isinstance(reference, int | float)
        assert float(ours.text) == float(reference)
    elif isinstance(ours, dict):
        assert isinstance(reference, dict)
        assert list(ours) == list(reference)
        for k in ours:
            _assert_same(ours[k], reference[k])
    elif isinstance(ours, list):
        assert isinstance(reference, list)
        assert len(ours) == len(reference)
        for a, b in zip(ours, reference, strict=True):
            _assert_same(a, b)
    else:
        assert type(ours) is type(reference)
        assert ours == reference


@given(st.text(alphabet=st.characters(exclude_categories=["Cs"])))
def test_json_string_matches_json_dumps_escaping(text: str) -> None:
    # json.dumps(ensure_ascii=False) escapes the same set with the same spellings.
    assert json_string(text) == json.dumps(text, ensure_ascii=False)
    assert strict_parse_json(json_string(text).encode(), max_bytes=10**6) == text


@given(st.binary(max_size=200))
def test_base64url_round_trip(raw: bytes) -> None:
    encoded = encode_schema_header(raw)
    assert encoded == base64.urlsafe_b64encode(raw).rstrip(b"=")
    assert decode_schema_header(encoded) == raw


@given(st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefxyz0123456789-_+/= \n", max_size=12))
def test_base64url_decoding_is_canonical(text: str) -> None:
    try:
        raw = decode_schema_header(text.encode())
    except RequestError:
        return
    assert encode_schema_header(raw) == text.encode()


def _slug_oracle(s: str) -> bool:
    if len(s) > 140 or ".." in s or s.count("/") != 1:
        return False
    owner, repo = s.split("/")
    alnum = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    if not 1 <= len(owner) <= 39 or owner[0] not in alnum:
        return False
    if any(c not in alnum + "-" for c in owner):
        return False
    if not 1 <= len(repo) <= 100 or repo == ".":
        return False
    return all(c in alnum + "._-" for c in repo)


@given(
    st.one_of(
        st.text(alphabet="ab0-_./\n é", max_size=12),
        st.from_regex(re.compile(r"[A-Za-z0-9][A-Za-z0-9-]{0,40}/[A-Za-z0-9._-]{0,102}\n?")),
    )
)
def test_slug_rule_matches_oracle(s: str) -> None:
    assert is_valid_slug(s) == _slug_oracle(s)


# --- nothing but our own error (STYLE.md 10), structure-aware ----------------------

_KEYS = st.sampled_from(
    ["type", "value", "values", "minimum", "maximum", "fields", "items", "length", "variants"]
) | st.sampled_from(["a", "tag", "__proto__", ""])
_TYPES = st.sampled_from(
    ["const", "boolean", "enum", "integer", "object", "tuple", "array", "union", "x"]
)
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True),
    st.text(max_size=70),
    _TYPES,
    st.just(NumberToken("1e0")),
)
_SCHEMAISH = st.recursive(
    _SCALARS,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(_KEYS, children, max_size=4)
        | st.builds(
            lambda t, rest: {"type": t, **rest},
            _TYPES,
            st.dictionaries(_KEYS, children, max_size=3),
        )
    ),
    max_leaves=30,
)


@settings(max_examples=1000, deadline=None)
@given(_SCHEMAISH)
def test_parse_schema_raises_only_schema_error(obj: object) -> None:
    try:
        parsed = parse_schema(obj)
    except SchemaError:
        return
    assert parse_schema(json.loads(parsed.canonical)) == parsed


@settings(max_examples=500, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["privateRepo", "schema", "script", "x"]),
        st.one_of(_SCHEMAISH, st.text(max_size=20), st.sampled_from(["o/r", "o/r\n"])),
        max_size=4,
    )
)
def test_parse_request_raises_only_request_error(obj: dict[str, object]) -> None:
    try:
        request = parse_request(obj)
    except RequestError:
        return
    assert request.private_repo == obj["privateRepo"]


@settings(max_examples=300, deadline=None)
@given(valid_schema_objs(max_depth=3), _SCHEMAISH)
def test_canonicalize_never_raises(schema: object, value: object) -> None:
    parsed = parse_schema(schema)
    result = canonicalize(value, parsed)
    if result is not None:
        assert check_output(result.encode(), parsed) == result
