"""Fuzz target: check_output (spec 14.5).

Input layout: the first byte selects one of a few fixed schemas, or (when it
is 0xFF) the bytes up to the first NUL are a schema document of its own;
the rest is the query output. Allowed outcome: a canonical string or None
(check_output never raises on bad bytes; SchemaError only from the embedded
schema). Invariants: the canonical text is a fixed point, never longer than
the raw output, and equals the stdlib's compact spelling of the same value
(so ``-0`` comes out as ``0``).
"""

from __future__ import annotations

import json

from _common import protocol, run

_SCHEMAS = [
    protocol.parse_schema(obj)
    for obj in (
        {"type": "boolean"},
        {"type": "integer", "minimum": -(2**53 - 1), "maximum": 2**53 - 1},
        {"type": "enum", "values": ["a", "é", "\u2028", 'q"\\']},
        {
            "type": "object",
            "fields": {
                "n": {"type": "integer", "minimum": 0, "maximum": 100},
                "s": {"type": "enum", "values": ["x", "y"]},
                "t": {"type": "tuple", "items": [{"type": "const", "value": None}]},
            },
        },
        {"type": "array", "items": {"type": "boolean"}, "length": 3},
        {
            "type": "union",
            "variants": {
                "a": {"type": "const", "value": "ok"},
                "b": {"type": "array", "items": {"type": "enum", "values": [1, 2]}, "length": 2},
            },
        },
        # The deepest nesting allowed: the root is depth 0, the leaf at depth 6.
        {
            "type": "union",
            "variants": {
                "u": {
                    "type": "tuple",
                    "items": [
                        {
                            "type": "object",
                            "fields": {
                                "o": {
                                    "type": "array",
                                    "items": {
                                        "type": "union",
                                        "variants": {
                                            "v": {
                                                "type": "tuple",
                                                "items": [
                                                    {"type": "integer", "minimum": -1, "maximum": 1}
                                                ],
                                            }
                                        },
                                    },
                                    "length": 2,
                                }
                            },
                        }
                    ],
                }
            },
        },
        {
            "type": "array",
            "items": {"type": "union", "variants": {"x": {"type": "enum", "values": [True]}}},
            "length": 64,
        },
    )
]


def one_input(data: bytes) -> None:
    if not data:
        return
    if data[0] == 0xFF and b"\x00" in data:
        head, raw = data[1:].split(b"\x00", 1)
        try:
            obj = protocol.strict_parse_json(head, max_bytes=protocol.MAX_SCHEMA_BYTES)
        except protocol.JSONError:
            return
        schema = protocol.parse_schema(obj)
    else:
        schema = _SCHEMAS[data[0] % len(_SCHEMAS)]
        raw = data[1:]
    canonical = protocol.check_output(raw, schema)
    if canonical is None:
        return
    encoded = canonical.encode("utf-8")
    assert len(encoded) <= len(raw)
    assert protocol.check_output(encoded, schema) == canonical
    compact = json.dumps(json.loads(canonical), separators=(",", ":"), ensure_ascii=False)
    assert compact == canonical, (compact, canonical)


if __name__ == "__main__":
    run("check_output", one_input, (protocol.SchemaError,))
