#!/bin/sh
"""exec" python3 -I "$0" "$@"
``bounded-query-cost``: what a response schema would cost, before asking (spec 14.3).

Usage::

    bounded-query-cost [--json] --schema 'SCHEMA_JSON'
    bounded-query-cost [--json] < schema.json

Prints whether the schema is valid, its exact cardinality, its charge in bits
(``1 + ceil(log2(cardinality)) + 3``, spec 14.3) and how many such questions
each metered sensitivity's run budget could fund (spec 14.1). ``--json``
prints one JSON object instead of text. Exit status: 0 valid, 1 invalid,
2 usage error.

The answer comes from the very code the broker runs: the harness copies the
broker's protocol package (``broker/protocol/``) verbatim next to this file as
``bq_protocol/`` in the agent's wrapper directory; when that sibling is absent
(the installed console script), ``bounded_query.broker.protocol`` is used.
The schema is judged exactly as the broker judges the decoded
``X-AWF-Schema-B64`` header: raw size, strict JSON, then the finite DSL.
This tool is advisory and local: it never contacts the broker and spends no
budget.

Executed directly, the file is a ``/bin/sh`` script whose line 2 runs
``exec python3 -I "$0" "$@"`` (Python reads that line as the start of this
docstring), as ``bounded-query`` does: the agent's ``PYTHON*`` variables, user
site and current directory cannot change which protocol code judges the
schema or print anything before ``main()``; the ``bq_protocol/`` sibling is
found from ``__file__``, not from ``sys.path``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TextIO

__all__ = ["Assessment", "assess", "load_protocol", "main", "render", "run_budgets"]

#: The directory name the harness gives its verbatim copy of broker/protocol/.
SIBLING_PACKAGE = "bq_protocol"

USAGE = "usage: bounded-query-cost [--json] [--schema SCHEMA_JSON]  (schema on stdin otherwise)"

EXIT_VALID = 0
EXIT_INVALID = 1
EXIT_USAGE = 2


class UsageError(ValueError):
    """The command line or stdin does not have the documented shape (caller's fault)."""


def load_protocol(here: str | None = None) -> ModuleType:
    """Import the protocol package: the ``bq_protocol/`` sibling, else the installed one.

    ``here`` is the directory to look in (default: this file's directory, not
    resolving symlinks, i.e. where the harness put the tool).
    """
    directory = os.path.abspath(here if here is not None else os.path.dirname(__file__))
    init = os.path.join(directory, SIBLING_PACKAGE, "__init__.py")
    if os.path.isfile(init):
        loaded = sys.modules.get(SIBLING_PACKAGE)
        if loaded is not None and getattr(loaded, "__file__", None) == init:
            return loaded
        spec = importlib.util.spec_from_file_location(
            SIBLING_PACKAGE, init, submodule_search_locations=[os.path.dirname(init)]
        )
        if spec is None or spec.loader is None:  # pragma: no cover - a file exists
            raise ImportError(f"cannot load {init}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[SIBLING_PACKAGE] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[SIBLING_PACKAGE]
            raise
        return module
    # The installed console script, or this file run from the source tree
    # (nothing in wrapper/ is named like the package, so nothing shadows it).
    from bounded_query.broker import protocol

    return protocol


@dataclass(frozen=True)
class Assessment:
    """The verdict on one schema: either ``error`` is set, or the cost fields are."""

    raw_bytes: int
    error: str | None = None
    cardinality: int = 0
    saturated: bool = False
    charge: int = 0

    @property
    def valid(self) -> bool:
        return self.error is None

    def per_run(self, budgets: dict[str, int]) -> dict[str, int]:
        """How many questions of this charge each metered budget funds (14.1)."""
        return {name: bits // self.charge for name, bits in budgets.items()}


def run_budgets(protocol: ModuleType) -> dict[str, int]:
    """Spec 14.1: the metered sensitivities' run budgets in bits, from the
    protocol package's policy module (``public`` is unmetered; ``sealed``'s 0
    bits never fund a question)."""
    proto: Any = protocol
    return {str(name): int(bits) for name, bits in proto.policy.METERED_BUDGETS.items()}


def assess(raw: bytes, protocol: ModuleType) -> Assessment:
    """Judge raw schema bytes the way the broker judges the decoded header.

    Never raises on bad input: an invalid schema is an ``Assessment`` with
    ``error`` naming what is wrong and where.
    """
    proto: Any = protocol
    limit = int(proto.MAX_SCHEMA_BYTES)
    if len(raw) > limit:
        return Assessment(len(raw), error=f"schema: {len(raw)} bytes, over the {limit}-byte limit")
    try:
        obj = proto.strict_parse_json(raw, max_bytes=limit, max_depth=proto.MAX_OUTPUT_DEPTH)
        schema = proto.parse_schema(obj)
    except (proto.JSONError, proto.SchemaError) as exc:
        return Assessment(len(raw), error=str(exc))
    card = int(proto.cardinality(schema))
    return Assessment(
        len(raw),
        cardinality=card,
        saturated=card == int(proto.SATURATED),
        charge=int(proto.charge(schema)),
    )


def render(result: Assessment, protocol: ModuleType, as_json: bool) -> str:
    """The report for ``result``: a few lines of text, or one JSON object."""
    proto: Any = protocol
    status_bits = int(proto.RESULT_STATUS_BIT_COST)
    timing_bits = int(proto.TIMING_BUCKET_BITS)
    budgets = run_budgets(protocol)
    if as_json:
        doc: dict[str, object] = {"valid": result.valid, "schemaBytes": result.raw_bytes}
        if result.error is not None:
            doc["error"] = result.error
        else:
            doc.update(
                {
                    # A string: cardinalities exceed every JSON reader's exact integers.
                    "cardinality": str(result.cardinality),
                    "saturated": result.saturated,
                    "chargeBits": result.charge,
                    "statusBits": status_bits,
                    "schemaBits": result.charge - status_bits - timing_bits,
                    "timingBits": timing_bits,
                    "questionsPerRun": {"public": None, **result.per_run(budgets)},
                }
            )
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n"
    if result.error is not None:
        return f"schema: invalid\nreason: {result.error}\n"
    if result.saturated:
        card = "more than 2**1024 (saturated: charged as 2**1024 + 1)"
    else:
        card = str(result.cardinality)
    schema_bits = result.charge - status_bits - timing_bits
    counts = result.per_run(budgets)
    lines = [
        "schema: valid",
        f"size: {result.raw_bytes} bytes (max {int(proto.MAX_SCHEMA_BYTES)})",
        f"cardinality: {card}",
        f"charge: {result.charge} bits = {status_bits} status + {schema_bits} schema"
        f" (ceil(log2(cardinality))) + {timing_bits} timing",
        "questions of this charge per run:",
        f"  internal ({budgets['internal']} bits): {counts['internal']}",
        f"  confidential ({budgets['confidential']} bits): {counts['confidential']}",
        "  public: unmetered (not debited)",
        f"  sealed ({budgets['sealed']} bits): {counts['sealed']} (never runs)",
    ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> tuple[bytes | None, bool]:
    """Return ``(schema bytes or None for stdin, as_json)``.

    Raises:
        UsageError: an unknown option, a positional, a repeated option or a
            missing value.
    """
    schema: bytes | None = None
    as_json = False
    seen: set[str] = set()
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in seen:
            raise UsageError(f"{arg} given twice")
        seen.add(arg)
        if arg == "--json":
            as_json = True
        elif arg == "--schema":
            if i + 1 >= len(argv):
                raise UsageError("--schema needs a value")
            schema = os.fsencode(argv[i + 1])
            i += 1
        else:
            raise UsageError(f"unexpected argument {arg!r}")
        i += 1
    return schema, as_json


def read_stdin(stream: TextIO | None, limit: int) -> bytes:
    """Read the schema from stdin, keeping at most ``limit + 1`` bytes.

    One byte over ``limit`` is enough to report the schema as too large.

    Raises:
        UsageError: stdin is missing or a terminal.
    """
    if stream is None or stream.isatty():
        raise UsageError("give --schema JSON or pipe the schema on stdin")
    data = b""
    while len(data) <= limit:
        chunk = stream.buffer.read(limit + 1 - len(data))
        if not chunk:
            break
        data += chunk
    return data


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point. Exit 0 valid, 1 invalid, 2 usage error."""
    args = sys.argv[1:] if argv is None else argv
    try:
        schema, as_json = parse_args(args)
        protocol = load_protocol()
        proto: Any = protocol
        raw = schema if schema is not None else read_stdin(sys.stdin, int(proto.MAX_SCHEMA_BYTES))
    except UsageError as exc:
        sys.stderr.write(f"bounded-query-cost: {exc}\n{USAGE}\n")
        return EXIT_USAGE
    result = assess(raw, protocol)
    sys.stdout.write(render(result, protocol, as_json))
    sys.stdout.flush()
    return EXIT_VALID if result.valid else EXIT_INVALID


if __name__ == "__main__":
    sys.exit(main())
