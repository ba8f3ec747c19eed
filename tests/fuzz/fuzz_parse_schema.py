"""Fuzz target: parse_schema (spec 14.3).

The input is decoded two ways: by the strict parser, and by the lenient
stdlib ``json`` (which yields floats, NaN, collapsed duplicate keys and lone
surrogates: the Python objects a careless caller could pass). Allowed
outcome: a Schema or SchemaError. Invariants for an accepted schema: its
canonical text round-trips to an equal schema, fits MAX_SCHEMA_BYTES, and
its charge is ``1 + ceil(log2(cardinality)) + 3`` with saturation.
"""

from __future__ import annotations

import json

from _common import protocol, run


def _check(obj: object) -> None:
    schema = protocol.parse_schema(obj)
    card = protocol.cardinality(schema)
    assert 1 <= card <= protocol.SATURATED
    assert protocol.charge(schema) == 4 + (card - 1).bit_length()
    assert len(schema.canonical.encode()) <= protocol.MAX_SCHEMA_BYTES
    again = protocol.parse_schema(json.loads(schema.canonical))
    assert again == schema
    assert again.canonical == schema.canonical


def one_input(data: bytes) -> None:
    try:
        strict = protocol.strict_parse_json(data, max_bytes=protocol.MAX_SCHEMA_BYTES)
    except protocol.JSONError:
        strict = None
    else:
        _check(strict)
    try:
        lenient = json.loads(data)
    except (ValueError, RecursionError):  # the stdlib's own failures, not ours
        return
    if lenient != strict:
        _check(lenient)


if __name__ == "__main__":
    run("parse_schema", one_input, (protocol.SchemaError,))
