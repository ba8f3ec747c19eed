"""Validation of query output against its schema and canonical re-serialization (spec 14.5).

Theory of operation: :func:`check_output` size-checks the raw result bytes,
parses them with the strict parser (:mod:`._strict_json`), then walks the
parsed value and the schema together, emitting the canonical text as it
goes: object fields in schema order, union values as
``{"tag":<tag>,"value":<value>}``, no whitespace, one string escaping
(:func:`json_string`), integers as plain decimal. Any mismatch stops the walk
and the whole output is rejected. Because canonical text never spends more
bytes than the accepted input did (escapes only shrink, whitespace is
dropped, keys are the same), the canonical result is at most
MAX_RESULT_BYTES too.

Nothing of the raw bytes survives: the agent sees only the canonical text.
"""

from __future__ import annotations

from ._constants import MAX_RESULT_BYTES
from ._errors import JSONError
from ._schema import (
    ArrayNode,
    BooleanNode,
    EnumNode,
    IntegerNode,
    Node,
    ObjectNode,
    Schema,
    TupleNode,
    UnionNode,
    literal_json,
    literal_key,
)
from ._strict_json import strict_parse_json

__all__ = ["canonicalize", "check_output", "ok_body"]

_OK_PREFIX = b'{"status":"ok","result":'


class _Mismatch(Exception):
    """The value does not conform to the schema (internal control flow only)."""


def _emit(node: Node, value: object, out: list[str]) -> None:
    if isinstance(node, BooleanNode):
        if value is True:
            out.append("true")
        elif value is False:
            out.append("false")
        else:
            raise _Mismatch
    elif isinstance(node, IntegerNode):
        # type() rather than isinstance(): bool is an int subclass.
        if type(value) is not int or not node.minimum <= value <= node.maximum:
            raise _Mismatch
        out.append(str(value))
    elif isinstance(node, ObjectNode):
        if type(value) is not dict or len(value) != len(node.fields):
            raise _Mismatch
        out.append("{")
        first = True
        for name, sub in node.fields:
            if name not in value:
                raise _Mismatch
            if not first:
                out.append(",")
            first = False
            out.append(f'"{name}":')
            _emit(sub, value[name], out)
        out.append("}")
    elif isinstance(node, TupleNode):
        if type(value) is not list or len(value) != len(node.items):
            raise _Mismatch
        out.append("[")
        for i, (sub, item) in enumerate(zip(node.items, value, strict=True)):
            if i:
                out.append(",")
            _emit(sub, item, out)
        out.append("]")
    elif isinstance(node, ArrayNode):
        if type(value) is not list or len(value) != node.length:
            raise _Mismatch
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _emit(node.items, item, out)
        out.append("]")
    elif isinstance(node, UnionNode):
        if type(value) is not dict or len(value) != 2:
            raise _Mismatch
        tag = value.get("tag")
        if type(tag) is not str or "value" not in value:
            raise _Mismatch
        variant = node.by_tag.get(tag)
        if variant is None:
            raise _Mismatch
        out.append(f'{{"tag":"{tag}","value":')
        _emit(variant, value["value"], out)
        out.append("}")
    elif isinstance(node, EnumNode):
        key = literal_key(value)
        if key is None or key not in node.keys:
            raise _Mismatch
        out.append(literal_json(key))
    else:  # ConstNode
        key = literal_key(value)
        if key is None or key != node.key:
            raise _Mismatch
        out.append(literal_json(key))


def canonicalize(value: object, schema: Schema) -> str | None:
    """Validate parsed JSON data against ``schema``; return its canonical text or None.

    ``value`` is data as returned by :func:`strict_parse_json`; integers
    outside the safe range never match (schema bounds are safe integers).
    """
    out: list[str] = []
    try:
        _emit(schema.root, value, out)
    except _Mismatch:
        return None
    return "".join(out)


def check_output(raw: bytes, schema: Schema) -> str | None:
    """Strictly parse and validate a query's raw output (spec 14.5).

    Returns:
        The canonical JSON text of the validated value, or None when ``raw``
        is larger than MAX_RESULT_BYTES, is not one strict JSON document, or
        does not conform exactly to ``schema``. Never raises on bad bytes.
    """
    if len(raw) > MAX_RESULT_BYTES:
        return None
    try:
        value = strict_parse_json(raw, max_bytes=MAX_RESULT_BYTES)
    except JSONError:
        return None
    return canonicalize(value, schema)


def ok_body(canonical: str) -> bytes:
    """The success envelope ``{"status":"ok","result":<canonical>}`` as bytes."""
    return _OK_PREFIX + canonical.encode("utf-8") + b"}"
