"""Unit tests of the finite schema DSL: parse_schema, cardinality, charge (spec 14.3)."""

from __future__ import annotations

import json
import math

import pytest

from bounded_query.broker.protocol import (
    MAX_ARRAY_LENGTH,
    MAX_ENUM_VALUES,
    MAX_LITERAL_STRING_BYTES,
    MAX_OBJECT_FIELDS,
    MAX_SAFE_INTEGER,
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_NODES,
    MAX_TUPLE_ITEMS,
    MAX_UNION_VARIANTS,
    RESULT_STATUS_BIT_COST,
    SATURATED,
    SATURATION_LIMIT,
    TIMING_BUCKET_BITS,
    TIMING_BUCKETS_MS,
    ArrayNode,
    BooleanNode,
    ConstNode,
    EnumNode,
    IntegerNode,
    NumberToken,
    ObjectNode,
    SchemaError,
    TupleNode,
    UnionNode,
    cardinality,
    ceil_log2,
    charge,
    parse_schema,
    strict_parse_json,
)

BOOL: dict[str, object] = {"type": "boolean"}


def integer(lo: object, hi: object) -> dict[str, object]:
    return {"type": "integer", "minimum": lo, "maximum": hi}


def obj(**fields: object) -> dict[str, object]:
    return {"type": "object", "fields": fields}


def array(items: object, length: object) -> dict[str, object]:
    return {"type": "array", "items": items, "length": length}


def enum(*values: object) -> dict[str, object]:
    return {"type": "enum", "values": list(values)}


def const(value: object) -> dict[str, object]:
    return {"type": "const", "value": value}


def tup(*items: object) -> dict[str, object]:
    return {"type": "tuple", "items": list(items)}


def union(**variants: object) -> dict[str, object]:
    return {"type": "union", "variants": variants}


def nest(depth: int) -> dict[str, object]:
    """Arrays of length 1 around a boolean that sits at ``depth`` (the root is depth 0)."""
    node: dict[str, object] = BOOL
    for _ in range(depth):
        node = array(node, 1)
    return node


def error_of(schema: object) -> str:
    with pytest.raises(SchemaError) as info:
        parse_schema(schema)
    return str(info.value)


# --- constants ---------------------------------------------------------------


def test_spec_constants() -> None:
    assert (MAX_SCHEMA_DEPTH, MAX_SCHEMA_NODES, MAX_SCHEMA_BYTES) == (6, 64, 4096)
    assert (MAX_ENUM_VALUES, MAX_OBJECT_FIELDS, MAX_TUPLE_ITEMS) == (4096, 16, 16)
    assert (MAX_ARRAY_LENGTH, MAX_UNION_VARIANTS, MAX_LITERAL_STRING_BYTES) == (64, 16, 64)
    assert TIMING_BUCKETS_MS == (10, 100, 1000, 10000, 60000, 600000)
    assert TIMING_BUCKET_BITS == 3
    assert RESULT_STATUS_BIT_COST == 1
    assert SATURATED == 2**1024 + 1


# --- node types and cardinality -------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (const("x"), 1),
        (const(None), 1),
        (BOOL, 2),
        (enum("a", "b", "c"), 3),
        (enum(True), 1),
        (integer(0, 9), 10),
        (integer(-5, -5), 1),
        (integer(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER), 2 * MAX_SAFE_INTEGER + 1),
        (obj(a=BOOL, b=integer(1, 3)), 6),
        (obj(a=const(None)), 1),
        (tup(const("x")), 1),
        (tup(BOOL, BOOL, enum(1, 2, 3)), 12),
        (array(BOOL, 0), 1),
        (array(BOOL, 10), 1024),
        (array(integer(0, 2), 3), 27),
        (union(a=BOOL), 2),
        (union(a=BOOL, b=const(1), c=integer(0, 9)), 13),
    ],
)
def test_cardinality(schema: object, expected: int) -> None:
    parsed = parse_schema(schema)
    assert cardinality(parsed) == expected
    assert charge(parsed) == 1 + math.ceil(math.log2(expected)) + 3


def test_node_values() -> None:
    parsed = parse_schema(
        obj(
            c=const("x"),
            e=enum(3, 1),
            i=integer(-1, 1),
            t=tup(BOOL),
            a=array(BOOL, 2),
            u=union(z=BOOL),
        )
    )
    root = parsed.root
    assert isinstance(root, ObjectNode)
    assert [name for name, _ in root.fields] == ["c", "e", "i", "t", "a", "u"]
    nodes = dict(root.fields)
    assert nodes["c"] == ConstNode("x", ("s", "x"))
    assert isinstance(nodes["e"], EnumNode)
    assert nodes["e"].values == (3, 1)
    assert nodes["i"] == IntegerNode(-1, 1)
    assert nodes["t"] == TupleNode((BooleanNode(),))
    assert nodes["a"] == ArrayNode(BooleanNode(), 2)
    assert isinstance(nodes["u"], UnionNode)
    assert nodes["u"].variants == (("z", BooleanNode()),)


def test_charge_floor_is_four_bits() -> None:
    assert charge(parse_schema(const(1))) == 4
    assert charge(parse_schema(BOOL)) == 5
    assert charge(parse_schema(enum(1, 2, 3))) == 6
    assert charge(parse_schema(enum(1, 2, 3, 4))) == 6
    assert charge(parse_schema(enum(1, 2, 3, 4, 5))) == 7


def test_ceil_log2_is_exact_where_math_log2_is_not() -> None:
    n = 2**60 + 1
    assert ceil_log2(n) == 61
    assert math.ceil(math.log2(n)) == 60  # the pitfall: float rounding
    assert ceil_log2(1) == 0
    assert ceil_log2(2) == 1
    assert ceil_log2(2**1024) == 1024
    assert ceil_log2(2**1024 + 1) == 1025
    with pytest.raises(ValueError, match="n >= 1"):
        ceil_log2(0)


def test_cardinality_exact_at_saturation_limit() -> None:
    # 2**1024 exactly: 16 booleans ** 64 = 2**(16*64) = 2**1024 -> not saturated.
    parsed = parse_schema(array(tup(*[BOOL] * 16), 64))
    assert cardinality(parsed) == SATURATION_LIMIT
    assert charge(parsed) == 1 + 1024 + 3
    # One more boolean tips it over.
    parsed = parse_schema(obj(a=array(tup(*[BOOL] * 16), 64), b=BOOL))
    assert cardinality(parsed) == SATURATED
    assert charge(parsed) == 1 + 1025 + 3


def test_cardinality_just_below_limit_is_exact() -> None:
    # 3**646 < 2**1024 < 3**647: exact below, saturated above.
    inner = array(enum(0, 1, 2), 64)  # 3**64
    parsed = parse_schema(tup(*[inner] * 10, array(enum(0, 1, 2), 6)))
    assert cardinality(parsed) == 3**646
    parsed = parse_schema(tup(*[inner] * 10, array(enum(0, 1, 2), 7)))
    assert cardinality(parsed) == SATURATED


def test_union_sum_saturates() -> None:
    big = array(tup(*[BOOL] * 16), 64)  # exactly 2**1024
    parsed = parse_schema(union(a=big, b=const(1)))
    assert cardinality(parsed) == SATURATED


def test_worst_case_nested_arrays_do_not_build_huge_numbers() -> None:
    node: object = integer(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER)
    for _ in range(MAX_SCHEMA_DEPTH):  # six arrays around the leaf: the deepest allowed
        node = array(node, MAX_ARRAY_LENGTH)
    parsed = parse_schema(node)
    assert cardinality(parsed) == SATURATED
    assert charge(parsed) == 1029


# --- bounds at the limit and one past ------------------------------------------


def test_depth_limit() -> None:
    # The root is depth 0: a leaf at depth 6 (seven levels) is the deepest allowed.
    assert cardinality(parse_schema(nest(MAX_SCHEMA_DEPTH))) == 2
    assert error_of(nest(MAX_SCHEMA_DEPTH + 1)).endswith("nesting deeper than 6")


def test_depth_error_names_location() -> None:
    assert parse_schema(obj(a=obj(b=obj(c=obj(d=obj(e=obj(f=BOOL)))))))
    message = error_of(obj(a=obj(b=obj(c=obj(d=obj(e=obj(f=obj(g=BOOL))))))))
    assert message == (
        "schema.fields.a.fields.b.fields.c.fields.d.fields.e.fields.f.fields.g:"
        " nesting deeper than 6"
    )


def test_node_limit() -> None:
    # 1 object + 15 tuples x (1 + 3) nodes = 61; pad to exactly 64 / 65.
    def schema(extra: int) -> dict[str, object]:
        fields = {f"f{i}": tup(BOOL, BOOL, BOOL) for i in range(15)}
        fields["g"] = tup(*[BOOL] * extra)
        return obj(**fields)

    assert parse_schema(schema(2))  # 1 + 60 + 1 + 2 = 64
    assert "more than 64 schema nodes" in error_of(schema(3))


def test_enum_value_limit() -> None:
    values = [str(i % 10) * 0 + chr(0x41 + i % 26) + str(i) for i in range(MAX_ENUM_VALUES)]
    # Numbers of one type fit 4096 values only if short: the byte limit binds first.
    assert "serialized schema exceeds 4096 bytes" in error_of(enum(*values))
    assert "1 to 4096 values" in error_of(enum(*range(MAX_ENUM_VALUES + 1)))
    assert "1 to 4096 values" in error_of(enum())


def test_enum_byte_limit_binds_before_count() -> None:
    # Single-digit integers cost 2 bytes each; the header and brackets cost 26.
    def schema(n: int) -> dict[str, object]:
        return enum(*range(n))

    sizes = {n: len(json.dumps(schema(n), separators=(",", ":"))) for n in (10, 100, 1000)}
    assert sizes[10] < sizes[100] < sizes[1000] < MAX_SCHEMA_BYTES
    assert cardinality(parse_schema(schema(1000))) == 1000
    assert "exceeds 4096 bytes" in error_of(schema(MAX_ENUM_VALUES))


def sized_enum(size: int) -> dict[str, object]:
    """A string enum whose compact serialization is exactly ``size`` bytes."""
    n = size // 63
    while True:
        values = [f"{i:03d}" + "x" * 57 for i in range(n)]
        base = len(json.dumps(enum(*values, ""), separators=(",", ":")))
        if base <= size:
            break
        n -= 1
    assert 0 <= size - base <= MAX_LITERAL_STRING_BYTES
    return enum(*values, "y" * (size - base))


def test_serialized_size_limit_exact() -> None:
    at_limit = sized_enum(MAX_SCHEMA_BYTES)
    assert len(json.dumps(at_limit, separators=(",", ":"))) == MAX_SCHEMA_BYTES
    parsed = parse_schema(at_limit)
    assert len(parsed.canonical.encode()) == MAX_SCHEMA_BYTES
    past = sized_enum(MAX_SCHEMA_BYTES + 1)
    assert len(json.dumps(past, separators=(",", ":"))) == MAX_SCHEMA_BYTES + 1
    assert error_of(past) == "schema: serialized schema is 4097 bytes (max 4096)"


def test_serialized_size_counts_structure_too() -> None:
    fields = {f"field{i:02d}": const("x" * 64) for i in range(16)}
    schema = tup(*[obj(**fields)] * 3)
    assert "serialized schema is" in error_of(schema)


def test_size_counts_utf8_bytes_not_characters() -> None:
    # 40 fields of a 2-byte character literal: counted in bytes.
    schema = obj(**{f"f{i:02d}": const("é" * 32) for i in range(15)})
    text = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)
    assert len(parse_schema(schema).canonical.encode()) == len(text.encode())


@pytest.mark.parametrize(
    ("make", "limit", "message"),
    [
        (lambda n: obj(**{f"f{i}": BOOL for i in range(n)}), MAX_OBJECT_FIELDS, "1 to 16 fields"),
        (lambda n: tup(*[BOOL] * n), MAX_TUPLE_ITEMS, "1 to 16 items"),
        (
            lambda n: union(**{f"v{i}": BOOL for i in range(n)}),
            MAX_UNION_VARIANTS,
            "1 to 16 variants",
        ),
        (lambda n: array(BOOL, n), MAX_ARRAY_LENGTH, "from 0 to 64"),
    ],
)
def test_width_limits(make, limit: int, message: str) -> None:
    assert parse_schema(make(limit))
    assert message in error_of(make(limit + 1))


def test_union_needs_a_variant_and_enum_a_value() -> None:
    assert error_of(union()) == "schema.variants: must have 1 to 16 variants"
    assert error_of(enum()) == "schema.values: must have 1 to 4096 values"


def test_empty_object_and_tuple_are_refused_with_their_location() -> None:
    # As the reference does (issue 10): a constant answer is written ``const``.
    assert error_of(obj()) == "schema.fields: must have 1 to 16 fields"
    assert error_of(tup()) == "schema.items: must have 1 to 16 items"
    assert error_of(obj(a=BOOL, b=tup())) == "schema.fields.b.items: must have 1 to 16 items"
    assert error_of(tup(BOOL, obj())) == "schema.items[1].fields: must have 1 to 16 fields"
    assert error_of(array(obj(), 3)) == "schema.items.fields: must have 1 to 16 fields"
    assert error_of(union(x=tup())) == "schema.variants.x.items: must have 1 to 16 items"
    # The smallest non-empty ones, and the empty array, stay valid.
    assert cardinality(parse_schema(obj(a=BOOL))) == 2
    assert cardinality(parse_schema(tup(BOOL))) == 2
    assert cardinality(parse_schema(array(BOOL, 0))) == 1


def _wrap(kind: str, inner: object) -> dict[str, object]:
    """One container of ``kind`` around ``inner``."""
    if kind == "array":
        return array(inner, 2)
    if kind == "object":
        return obj(k=inner)
    if kind == "tuple":
        return tup(inner)
    return union(v=inner)


_LOCATION_STEP = {
    "array": ".items",
    "object": ".fields.k",
    "tuple": ".items[0]",
    "union": ".variants.v",
}


@pytest.mark.parametrize("kind", ["array", "object", "tuple", "union"])
@pytest.mark.parametrize("leaf", [BOOL, const(-1), enum("a", "b"), integer(0, 2)])
def test_seven_levels_accepted_eight_refused_per_container_kind(kind: str, leaf: object) -> None:
    node: object = leaf
    for _ in range(MAX_SCHEMA_DEPTH):  # six containers: the leaf is at depth 6
        node = _wrap(kind, node)
    assert parse_schema(node)
    message = error_of(_wrap(kind, node))  # seven containers: the leaf is at depth 7
    assert message == "schema" + _LOCATION_STEP[kind] * 7 + ": nesting deeper than 6"


def test_depth_counts_mixed_containers() -> None:
    node: object = BOOL
    for kind in ("array", "object", "tuple", "union", "array", "object"):
        node = _wrap(kind, node)
    parsed = parse_schema(node)
    assert cardinality(parsed) == 2**2 * 2**2  # two arrays of length 2 around a boolean
    assert error_of(_wrap("tuple", node)).endswith(": nesting deeper than 6")
    # Depth is per path: a shallow sibling of the deepest leaf changes nothing.
    five = node["fields"]["k"]  # type: ignore[index]
    assert parse_schema(obj(deep=five, flat=BOOL))
    assert error_of(obj(flat=BOOL, deep=node)).startswith("schema.fields.deep.fields.k.items")


def test_array_length_must_be_plain_nonnegative_int() -> None:
    for bad in (-1, True, 1.0, "1", None, NumberToken("1e0")):
        assert error_of(array(BOOL, bad)) == "schema.length: must be an integer from 0 to 64"


def test_literal_string_limit_counts_utf8_bytes() -> None:
    assert parse_schema(const("x" * 64))
    assert "longer than 64 UTF-8 bytes" in error_of(const("x" * 65))
    assert parse_schema(const("é" * 32))  # 64 bytes, 32 characters
    assert "longer than 64 UTF-8 bytes" in error_of(const("é" * 33))  # 66 bytes, 33 chars
    assert parse_schema(const("😀" * 16))
    assert "longer than 64 UTF-8 bytes" in error_of(const("😀" * 16 + "x"))


@pytest.mark.parametrize("char", ["\x00", "\n", "\x1f", "\x7f", "\x80", "\x9f"])
def test_literal_control_characters_rejected(char: str) -> None:
    assert error_of(const(f"a{char}b")) == "schema.value: string contains a control character"
    assert (
        error_of(enum("ok", f"a{char}")) == "schema.values[1]: string contains a control character"
    )


def test_literal_allows_non_control_specials() -> None:
    for text in ('"\\/', "\xa0", "\u2028", "日本", "", "__proto__"):
        assert parse_schema(const(text)).root == ConstNode(text, ("s", text))


def test_literal_lone_surrogate_rejected() -> None:
    assert "lone surrogate" in error_of(const("\ud800"))
    assert "lone surrogate" in error_of(enum("a", "\udfff"))


def test_integer_bounds_safe_only() -> None:
    assert parse_schema(integer(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER))
    assert "safe integer" in error_of(integer(0, MAX_SAFE_INTEGER + 1))
    assert "safe integer" in error_of(integer(-MAX_SAFE_INTEGER - 1, 0))
    assert "safe integer" in error_of(const(MAX_SAFE_INTEGER + 1))
    assert parse_schema(const(-MAX_SAFE_INTEGER))


@pytest.mark.parametrize(
    "bad",
    [True, False, 1.0, -0.0, 0.5, "1", None, NumberToken("1e0"), NumberToken("-0.0")],
)
def test_integer_bounds_must_be_plain_int(bad: object) -> None:
    assert error_of(integer(bad, 5)).startswith("schema.minimum: must be an integer")
    assert error_of(integer(0, bad)).startswith("schema.maximum: must be an integer")


def test_integer_min_greater_than_max_names_location() -> None:
    assert error_of(obj(count=integer(5, 4))) == "schema.fields.count: maximum must be >= minimum"


@pytest.mark.parametrize("bad", [1.0, float("nan"), float("inf"), NumberToken("1.5"), [], {}])
def test_literal_types(bad: object) -> None:
    assert error_of(const(bad)).startswith("schema.value: literal must be")


def test_enum_values_one_type_bool_is_not_int() -> None:
    assert "one JSON type (integer)" in error_of(enum(1, True))
    assert "one JSON type (boolean)" in error_of(enum(True, 1))
    assert "one JSON type (string)" in error_of(enum("1", 1))
    assert "one JSON type (null)" in error_of(enum(None, "x"))
    assert cardinality(parse_schema(enum(True, False))) == 2
    assert cardinality(parse_schema(enum(0, 1))) == 2


def test_enum_duplicates_name_location() -> None:
    schema = tup(BOOL, BOOL, obj(x=enum(1, 2, 3, 4, 5, 1)))
    assert error_of(schema) == "schema.items[2].fields.x.values[5]: duplicate enum value"
    assert (
        error_of(tup(BOOL, BOOL, enum(*"abcdea")))
        == "schema.items[2].values[5]: duplicate enum value"
    )
    assert "duplicate" in error_of(enum(None, None))
    assert "duplicate" in error_of(enum(True, True))


@pytest.mark.parametrize(
    "name",
    ["", "1a", "_a", "a-b", "a b", "a\n", "é", "a" * 65, "a.b", "\uff41"],
)
def test_invalid_field_names_and_tags(name: str) -> None:
    assert "invalid field name" in error_of({"type": "object", "fields": {name: BOOL}})
    assert "invalid union tag" in error_of({"type": "union", "variants": {name: BOOL}})


def test_valid_names_at_the_limit() -> None:
    name = "A" + "z_9" * 21  # 64 characters
    assert len(name) == 64
    assert parse_schema(obj(**{name: BOOL}))
    assert parse_schema(union(**{name: BOOL}))
    assert parse_schema(obj(constructor=BOOL, hasOwnProperty=BOOL, tag=BOOL, value=BOOL))
    assert "invalid field name" in error_of({"type": "object", "fields": {"__proto__": BOOL}})


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        (None, "schema: must be an object"),
        ([], "schema: must be an object"),
        ({}, "schema: missing or non-string 'type'"),
        ({"type": 1}, "schema: missing or non-string 'type'"),
        ({"type": "string"}, "schema: unknown type 'string'"),
        ({"type": "Boolean"}, "schema: unknown type 'Boolean'"),
        ({"type": "boolean", "x": 1}, "schema: unexpected key 'x'"),
        ({"type": "const"}, "schema: missing key 'value'"),
        ({"type": "integer", "minimum": 0}, "schema: missing key 'maximum'"),
        ({"type": "integer", "minimum": 0, "maximum": 1, "m": 2}, "schema: unexpected key 'm'"),
        ({"type": "array", "items": BOOL}, "schema: missing key 'length'"),
        ({"type": "object", "fields": []}, "schema.fields: must be an object"),
        ({"type": "union", "variants": []}, "schema.variants: must be an object"),
        ({"type": "tuple", "items": {}}, "schema.items: must be an array"),
        ({"type": "enum", "values": {}}, "schema.values: must be an array"),
        ({"type": "enum", "values": "ab"}, "schema.values: must be an array"),
        (
            obj(a={"type": "boolean", "description": "x"}),
            "schema.fields.a: unexpected key 'description'",
        ),
        (tup(BOOL, {"type": "x"}), "schema.items[1]: unknown type 'x'"),
        (array({"type": "const"}, 1), "schema.items: missing key 'value'"),
        (union(ok=BOOL, no=7), "schema.variants.no: must be an object"),
    ],
)
def test_structural_errors(schema: object, message: str) -> None:
    assert error_of(schema) == message


def test_no_general_json_schema_keywords() -> None:
    for keyword in ("$ref", "additionalProperties", "pattern", "required"):
        assert "unexpected key" in error_of({"type": "object", "fields": {}, keyword: True})


def test_canonical_schema_round_trips() -> None:
    schema = obj(b=union(y=const('q"\\'), x=enum(None)), a=array(integer(-3, 3), 2))
    parsed = parse_schema(schema)
    reparsed = parse_schema(json.loads(parsed.canonical))
    assert reparsed == parsed
    assert reparsed.canonical == parsed.canonical
    assert parsed.canonical.startswith('{"type":"object","fields":{"b":')


def test_schema_from_strict_parser() -> None:
    parsed = parse_schema(strict_parse_json(b'{"type":"integer","minimum":-1,"maximum":1}'))
    assert cardinality(parsed) == 3
    # Float or exponent tokens are never integers in a schema (docs/architecture.md decision 6).
    for text in (b"1.0", b"1e0", b"-0.0", b"-0e0", b"10000000000000000000"):
        raw = b'{"type":"integer","minimum":0,"maximum":' + text + b"}"
        assert error_of(strict_parse_json(raw)).startswith("schema.maximum: must be an integer")


def test_minus_zero_token_is_the_integer_zero() -> None:
    # ``-0`` is an integer token by RFC 8259's grammar; the reference reads it as 0.
    parsed = parse_schema(strict_parse_json(b'{"type":"integer","minimum":-0,"maximum":-0}'))
    assert parsed.root == IntegerNode(0, 0)
    assert parsed.canonical == '{"type":"integer","minimum":0,"maximum":0}'
    assert cardinality(parsed) == 1
    parsed = parse_schema(strict_parse_json(b'{"type":"const","value":-0}'))
    assert parsed.canonical == '{"type":"const","value":0}'
    parsed = parse_schema(strict_parse_json(b'{"type":"enum","values":[-0,1]}'))
    assert parsed.canonical == '{"type":"enum","values":[0,1]}'
    # -0 and 0 are one value: an enum listing both has a duplicate.
    dup = strict_parse_json(b'{"type":"enum","values":[0,-0]}')
    assert error_of(dup) == "schema.values[1]: duplicate enum value"


def test_schema_is_immutable_and_hashable() -> None:
    parsed = parse_schema(obj(a=BOOL))
    with pytest.raises(AttributeError):
        parsed.charge = 0  # type: ignore[misc]
    assert hash(parsed) == hash(parse_schema(obj(a=BOOL)))


def test_self_referencing_object_is_refused() -> None:
    loop: dict[str, object] = {"type": "array", "length": 1}
    loop["items"] = loop
    assert error_of(loop).endswith("nesting deeper than 6")
