"""Micro-benchmark of the protocol core (issue #2, item 5). Prints a table; asserts nothing.

    python tests/bench/bench_protocol.py [--quick]

Rows: schemas parsed per second (object form and full header path:
base64url + strict parse + parse_schema), 8 KiB outputs checked per second
(accepted and rejected), and the worst-case charge time (the schema the
bounds allow that maximizes the saturating arithmetic). Each figure is the
median of several timed batches.
"""

from __future__ import annotations

import functools
import json
import statistics
import sys
import time
from collections.abc import Callable

from bounded_query.broker.protocol import (
    MAX_ARRAY_LENGTH,
    MAX_RESULT_BYTES,
    MAX_SAFE_INTEGER,
    MAX_SCHEMA_DEPTH,
    SATURATED,
    cardinality,
    charge,
    check_output,
    encode_schema_header,
    parse_frame,
    parse_schema,
)

BOOL = {"type": "boolean"}


def timed(fn: Callable[[], object], batches: int, min_batch_s: float) -> float:
    """Median seconds per call over ``batches`` batches of at least ``min_batch_s``."""
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - start >= min_batch_s:
            break
        n *= 2
    per_call = []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        per_call.append((time.perf_counter() - start) / n)
    return statistics.median(per_call)


def worst_case_schema() -> dict[str, object]:
    node: dict[str, object] = {
        "type": "integer",
        "minimum": -MAX_SAFE_INTEGER,
        "maximum": MAX_SAFE_INTEGER,
    }
    for _ in range(MAX_SCHEMA_DEPTH):  # the root is depth 0: six arrays, then the leaf
        node = {"type": "array", "items": node, "length": MAX_ARRAY_LENGTH}
    return node


def exactly_2_1024_schema() -> dict[str, object]:
    """Cardinality exactly 2**1024: the largest exact (unsaturated) product."""
    row = {"type": "tuple", "items": [BOOL] * 16}
    return {"type": "array", "items": row, "length": 64}


def big_enum_schema() -> dict[str, object]:
    """A string enum filling the 4096-byte limit (about 64 values of 60 characters)."""
    values: list[str] = []
    while True:
        candidate = [*values, f"{len(values):03d}" + "x" * 57]
        doc = {"type": "enum", "values": candidate}
        if len(json.dumps(doc, separators=(",", ":"))) > 4096:
            return {"type": "enum", "values": values}
        values = candidate


def mixed_schema() -> dict[str, object]:
    return {
        "type": "object",
        "fields": {
            "count": {"type": "integer", "minimum": 0, "maximum": 1000},
            "ok": BOOL,
            "kind": {"type": "enum", "values": ["file", "dir", "link"]},
            "pick": {
                "type": "union",
                "variants": {"none": {"type": "const", "value": None}, "some": BOOL},
            },
        },
    }


def output_8k_accepted() -> tuple[dict[str, object], bytes]:
    """Array of 64 objects of 2 enum strings: close to 8 KiB, pretty-printed."""
    word = "y" * 50
    item = {
        "type": "object",
        "fields": {
            "a": {"type": "enum", "values": [word, "n"]},
            "b": {"type": "integer", "minimum": -MAX_SAFE_INTEGER, "maximum": MAX_SAFE_INTEGER},
        },
    }
    schema = {"type": "array", "items": item, "length": 64}
    value = [{"b": -MAX_SAFE_INTEGER + i, "a": word} for i in range(64)]
    raw = json.dumps(value, indent=0).encode()
    raw += b" " * (MAX_RESULT_BYTES - len(raw))
    assert len(raw) == MAX_RESULT_BYTES
    return schema, raw


def output_8k_escapes() -> tuple[dict[str, object], bytes]:
    """Escape-heavy strings: every character spelled as \\uXXXX."""
    text = "ab\u00e9\u2028" * 4  # 16 characters
    schema = {
        "type": "array",
        "items": {"type": "enum", "values": [text]},
        "length": 64,
    }
    raw = json.dumps([text] * 64, ensure_ascii=True).encode()
    spelled = "".join(f"\\u{ord(c):04x}" for c in text)
    raw = ("[" + ",".join(f'"{spelled}"' for _ in range(64)) + "]").encode()
    assert len(raw) <= MAX_RESULT_BYTES
    return schema, raw


def main() -> None:
    quick = "--quick" in sys.argv
    batches, min_batch = (3, 0.05) if quick else (7, 0.2)

    def rate(fn: Callable[[], object]) -> tuple[float, float]:
        seconds = timed(fn, batches, min_batch)
        return 1.0 / seconds, seconds * 1e6

    rows: list[tuple[str, str, float, float]] = []

    schemas = {
        "boolean": BOOL,
        "mixed object (4 fields)": mixed_schema(),
        "4 KiB string enum": big_enum_schema(),
        "4 KiB integer enum (1036 values)": {"type": "enum", "values": list(range(1036))},
        "2**1024 exactly (array of tuples)": exactly_2_1024_schema(),
        "worst case (6-deep arrays, 2**53 ints)": worst_case_schema(),
    }
    for name, obj in schemas.items():
        per_s, us = rate(functools.partial(parse_schema, obj))
        rows.append(("parse_schema (object)", name, per_s, us))
    for name, obj in schemas.items():
        header = encode_schema_header(json.dumps(obj, separators=(",", ":")).encode())
        headers = [
            (b"x-awf-query-version", b"2"),
            (b"x-awf-repo", b"octo/alpha"),
            (b"x-awf-schema-b64", header),
        ]
        per_s, us = rate(functools.partial(parse_frame, headers, b"print(1)"))
        rows.append(("parse_frame (header path)", name, per_s, us))

    outputs = {
        "8 KiB accepted (64 objects, padded)": output_8k_accepted(),
        "8 KiB-class escapes (\\uXXXX strings)": output_8k_escapes(),
    }
    for name, (obj, raw) in outputs.items():
        schema = parse_schema(obj)
        assert check_output(raw, schema) is not None
        per_s, us = rate(functools.partial(check_output, raw, schema))
        rows.append(("check_output", f"{name}, {len(raw)} B", per_s, us))
    obj, raw = output_8k_accepted()
    schema = parse_schema(obj)
    broken = raw.rstrip()[:-1] + b"x"  # fails at the very end
    broken = b" " * (MAX_RESULT_BYTES - len(broken)) + broken
    assert check_output(broken, schema) is None
    per_s, us = rate(lambda: check_output(broken, schema))
    rows.append(("check_output", f"8 KiB rejected at last byte, {len(broken)} B", per_s, us))
    mismatch = raw.replace(b"-9007199254740991", b"-9007199254740992", 1)
    assert check_output(mismatch, schema) is None
    per_s, us = rate(lambda: check_output(mismatch, schema))
    rows.append(("check_output", "8 KiB rejected by schema (first integer)", per_s, us))

    worst = worst_case_schema()
    parsed = parse_schema(worst)
    assert cardinality(parsed) == SATURATED
    per_s, us = rate(lambda: charge(parse_schema(worst)))
    rows.append(("worst-case charge", f"parse + charge = {charge(parsed)} bits", per_s, us))

    width = max(len(r[0]) + len(r[1]) for r in rows) + 3
    print(f"{'operation':<{width}}{'per second':>14}{'µs per call':>14}")
    print("-" * (width + 28))
    for op, case, per_s, us in rows:
        print(f"{op + ': ' + case:<{width}}{per_s:>14,.0f}{us:>14.1f}")


if __name__ == "__main__":
    main()
