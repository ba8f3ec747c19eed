"""The finite schema DSL: nodes, parsing, cardinality and bit charge (spec 14.3).

Theory of operation: :func:`parse_schema` walks a plain Python object (what
``json.loads`` or :func:`strict_parse_json` returns) once, top-down, and
builds immutable node values. Every size is checked *before* the work it
bounds: the depth and node count when a node is entered, the number of
fields/items/variants/values before iterating them, a literal's character
count before encoding it, and a running count of serialized literal bytes
so that a wide enum is refused as soon as it cannot fit MAX_SCHEMA_BYTES.
The walk therefore does bounded work for any input object.

Cardinality is computed bottom-up during the walk with exact Python ints,
saturating at :data:`SATURATED` (2**1024 + 1) as soon as a product, power or
sum would exceed 2**1024; a power is tested with bit-length arithmetic before
it is computed, so nested maximum-length arrays never build a huge number.

Rules where the reference implementation is the arbiter (docs/architecture.md decision 6,
"Everywhere else, match the reference exactly"):

* the root node is at depth 0 and a node deeper than MAX_SCHEMA_DEPTH (6) is
  refused: seven levels of nodes, i.e. six nested containers and a leaf;
* an enum needs at least one value, a union at least one variant, an object
  at least one field and a tuple at least one item: an empty container is
  refused with its location, like an empty enum (a constant answer is
  written ``const``); array ``length`` is 0..64 (length 0 has cardinality 1);
* the integer token ``-0`` is the integer 0 (the strict parser reads it so).

Further rules; "(decision 6)" marks a deliberate strict-side deviation from
the reference (tests/protocol/conformance.yaml has a row for each):

* integer bounds and integer literals are plain safe integers: Python ``int``
  (never ``bool``, ``float`` or a :class:`NumberToken`) with
  ``|n| <= 2**53 - 1``, and ``minimum <= maximum``; a number token with a
  fraction or an exponent (``1.0``, ``1e0``, ``-0.0``, ``-0e0``) is refused
  (decision 6);
* literal strings are valid Unicode (no lone surrogates: decision 6), at
  most 64 UTF-8 bytes, with no C0, DEL or C1 control character (DEL and C1:
  decision 6);
* field names and union tags fullmatch ``[A-Za-z][A-Za-z0-9_]{0,63}``;
* the compact serialization (``separators=(",", ":")``,
  ``ensure_ascii=False``, UTF-8) must be at most MAX_SCHEMA_BYTES; it is
  computed from the parsed nodes, whose canonical text has exactly the size
  of ``json.dumps`` of the input (literals contain no characters that
  ``json.dumps`` escapes differently);
* every node has exactly the keys its type allows.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Tuple, Union  # noqa: UP035  (Python 3.8, see LiteralValue)

from ._constants import (
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
)
from ._errors import SchemaError
from ._text import json_string

__all__ = [
    "ArrayNode",
    "BooleanNode",
    "ConstNode",
    "EnumNode",
    "IntegerNode",
    "LiteralKey",
    "LiteralValue",
    "Node",
    "ObjectNode",
    "Schema",
    "TupleNode",
    "UnionNode",
    "cardinality",
    "ceil_log2",
    "charge",
    "literal_key",
    "parse_schema",
]

# Runtime aliases use typing.Union/Tuple, not ``X | Y``/``tuple[...]``: this
# package is shipped verbatim to agents (bq_protocol) and imports on Python 3.8.
#: A literal of const/enum: a string, a safe integer, a boolean or null.
LiteralValue = Union[str, int, bool, None]  # noqa: UP007
#: A literal tagged with its JSON type, because in Python ``True == 1``:
#: ``("s", "x")``, ``("i", 1)``, ``("b", True)``, ``("n", None)``.
LiteralKey = Tuple[str, LiteralValue]  # noqa: UP006

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_JSON_TYPE_NAMES = {"s": "string", "i": "integer", "b": "boolean", "n": "null"}


def literal_key(value: object) -> LiteralKey | None:
    """Tag a parsed JSON scalar with its JSON type, or None if it is not a literal type.

    Only the type is checked here (``bool`` is told apart from ``int``;
    floats and number tokens are not literals); ranges are checked elsewhere.
    """
    if value is None:
        return ("n", None)
    t = type(value)
    if t is bool:
        return ("b", value)  # type: ignore[return-value]
    if t is int:
        return ("i", value)  # type: ignore[return-value]
    if t is str:
        return ("s", value)  # type: ignore[return-value]
    return None


def literal_json(key: LiteralKey) -> str:
    """Canonical JSON text of a literal."""
    kind, value = key
    if kind == "s":
        return json_string(value)  # type: ignore[arg-type]
    if kind == "i":
        return str(value)
    if kind == "b":
        return "true" if value else "false"
    return "null"


@dataclass(frozen=True)
class ConstNode:
    """``{"type":"const","value":<literal>}``: cardinality 1."""

    value: LiteralValue
    key: LiteralKey = field(repr=False, compare=False)


@dataclass(frozen=True)
class BooleanNode:
    """``{"type":"boolean"}``: cardinality 2."""


@dataclass(frozen=True)
class EnumNode:
    """``{"type":"enum","values":[...]}``: unique literals of one JSON type."""

    values: tuple[LiteralValue, ...]
    keys: frozenset[LiteralKey] = field(repr=False, compare=False)


@dataclass(frozen=True)
class IntegerNode:
    """``{"type":"integer","minimum":N,"maximum":M}``: inclusive safe range."""

    minimum: int
    maximum: int


@dataclass(frozen=True)
class ObjectNode:
    """``{"type":"object","fields":{...}}``: all fields required, in schema order."""

    fields: tuple[tuple[str, Node], ...]
    names: frozenset[str] = field(repr=False, compare=False)


@dataclass(frozen=True)
class TupleNode:
    """``{"type":"tuple","items":[...]}``: fixed length, per-position schemas."""

    items: tuple[Node, ...]


@dataclass(frozen=True)
class ArrayNode:
    """``{"type":"array","items":<schema>,"length":N}``: fixed length, uniform items."""

    items: Node
    length: int


@dataclass(frozen=True)
class UnionNode:
    """``{"type":"union","variants":{...}}``: value is ``{"tag":..,"value":..}``."""

    variants: tuple[tuple[str, Node], ...]
    by_tag: Mapping[str, Node] = field(repr=False, compare=False)


Node = Union[  # noqa: UP007
    ConstNode,
    BooleanNode,
    EnumNode,
    IntegerNode,
    ObjectNode,
    TupleNode,
    ArrayNode,
    UnionNode,
]


@dataclass(frozen=True)
class Schema:
    """A parsed, valid response schema (only :func:`parse_schema` builds one).

    ``cardinality`` is exact up to 2**1024 and :data:`SATURATED` above;
    ``charge`` is ``1 + ceil(log2(cardinality)) + 3`` bits; ``canonical`` is
    the compact JSON text of the schema (keys in a fixed order), whose UTF-8
    size is at most MAX_SCHEMA_BYTES.
    """

    root: Node
    cardinality: int
    charge: int
    canonical: str = field(repr=False, compare=False)


def ceil_log2(n: int) -> int:
    """Exact ``ceil(log2(n))`` for ``n >= 1`` (never ``math.log2``, which rounds)."""
    if n < 1:
        raise ValueError("ceil_log2 needs n >= 1")
    return (n - 1).bit_length()


def _saturate(n: int) -> int:
    return SATURATED if n > SATURATION_LIMIT else n


def _mul(a: int, b: int) -> int:
    """Saturating product of two cardinalities (each at most SATURATED)."""
    return _saturate(a * b)  # at most ~2050 bits: cheap, exact


def _pow(base: int, exp: int) -> int:
    """Saturating ``base ** exp`` without building a number above ~2**1100."""
    if base == 1 or exp == 0:
        return 1
    # base >= 2**(bits-1), so base**exp >= 2**((bits-1)*exp).
    if (base.bit_length() - 1) * exp > SATURATION_LIMIT.bit_length() - 1:
        return SATURATED
    return _saturate(base**exp)  # at most 1024 + exp <= 1088 bits


def cardinality(schema: Schema) -> int:
    """Number of distinct values ``schema`` admits (spec 14.3), saturated at SATURATED."""
    return schema.cardinality


def charge(schema: Schema) -> int:
    """Information charge in bits: ``1 + ceil(log2(cardinality)) + 3`` (spec 14.3)."""
    return schema.charge


class _Walk:
    """State of one parse: node count and the running literal byte estimate."""

    __slots__ = ("literal_bytes", "nodes")

    def __init__(self) -> None:
        self.nodes = 0
        self.literal_bytes = 0

    def node(self, obj: object, where: str, depth: int) -> tuple[Node, int, str]:
        """Parse one node at ``depth`` (the root is 0); return it, its cardinality, its JSON."""
        if depth > MAX_SCHEMA_DEPTH:
            raise SchemaError(f"{where}: nesting deeper than {MAX_SCHEMA_DEPTH}")
        self.nodes += 1
        if self.nodes > MAX_SCHEMA_NODES:
            raise SchemaError(f"{where}: more than {MAX_SCHEMA_NODES} schema nodes")
        if not isinstance(obj, dict):
            raise SchemaError(f"{where}: must be an object")
        kind = obj.get("type")
        if not isinstance(kind, str):
            raise SchemaError(f"{where}: missing or non-string 'type'")
        allowed = _KEYS.get(kind)
        if allowed is None:
            raise SchemaError(f"{where}: unknown type {_short(kind)}")
        _exact_keys(obj, allowed, where)
        if kind == "boolean":
            return BooleanNode(), 2, '{"type":"boolean"}'
        if kind == "const":
            key = self.literal(obj["value"], f"{where}.value")
            value = key[1]
            return ConstNode(value, key), 1, f'{{"type":"const","value":{literal_json(key)}}}'
        if kind == "enum":
            return self.enum(obj["values"], where)
        if kind == "integer":
            lo = _safe_int(obj["minimum"], f"{where}.minimum")
            hi = _safe_int(obj["maximum"], f"{where}.maximum")
            if hi < lo:
                raise SchemaError(f"{where}: maximum must be >= minimum")
            text = f'{{"type":"integer","minimum":{lo},"maximum":{hi}}}'
            return IntegerNode(lo, hi), hi - lo + 1, text
        if kind == "object":
            pairs, card, text = self.named(obj["fields"], f"{where}.fields", depth, "fields")
            names = frozenset(name for name, _ in pairs)
            return ObjectNode(pairs, names), card, f'{{"type":"object","fields":{text}}}'
        if kind == "union":
            pairs, card, text = self.named(obj["variants"], f"{where}.variants", depth, "variants")
            node = UnionNode(pairs, MappingProxyType(dict(pairs)))
            return node, card, f'{{"type":"union","variants":{text}}}'
        if kind == "tuple":
            return self.tuple_(obj["items"], where, depth)
        # kind == "array"
        length = obj["length"]
        if type(length) is not int or not 0 <= length <= MAX_ARRAY_LENGTH:
            raise SchemaError(f"{where}.length: must be an integer from 0 to {MAX_ARRAY_LENGTH}")
        item, item_card, item_text = self.node(obj["items"], f"{where}.items", depth + 1)
        text = f'{{"type":"array","items":{item_text},"length":{length}}}'
        return ArrayNode(item, length), _pow(item_card, length), text

    def literal(self, value: object, where: str) -> LiteralKey:
        key = literal_key(value)
        if key is None:
            raise SchemaError(f"{where}: literal must be a string, safe integer, boolean or null")
        kind = key[0]
        if kind == "i":
            _safe_int(value, where)
        elif kind == "s":
            _literal_string(value, where)  # type: ignore[arg-type]
        return key

    def enum(self, values: object, where: str) -> tuple[Node, int, str]:
        if not isinstance(values, list):
            raise SchemaError(f"{where}.values: must be an array")
        if not 1 <= len(values) <= MAX_ENUM_VALUES:
            raise SchemaError(f"{where}.values: must have 1 to {MAX_ENUM_VALUES} values")
        fast = _fast_enum(values)
        if fast is not None and self.literal_bytes + len(fast[1]) + 1 <= MAX_SCHEMA_BYTES:
            kind, text = fast
            self.literal_bytes += len(text) + 1
            node = EnumNode(tuple(values), frozenset((kind, v) for v in values))
            return node, len(values), f'{{"type":"enum","values":[{text}]}}'
        # The slow path finds and names the first offending value.
        keys: list[LiteralKey] = []
        seen: set[LiteralKey] = set()
        texts: list[str] = []
        for i, value in enumerate(values):
            at = f"{where}.values[{i}]"
            key = self.literal(value, at)
            if keys and key[0] != keys[0][0]:
                raise SchemaError(
                    f"{at}: enum values must all be of one JSON type "
                    f"({_JSON_TYPE_NAMES[keys[0][0]]})"
                )
            if key in seen:
                raise SchemaError(f"{at}: duplicate enum value")
            seen.add(key)
            keys.append(key)
            text = literal_json(key)
            self.literal_bytes += len(text) + 1
            if self.literal_bytes > MAX_SCHEMA_BYTES:
                raise SchemaError(f"{at}: serialized schema exceeds {MAX_SCHEMA_BYTES} bytes")
            texts.append(text)
        node = EnumNode(tuple(k[1] for k in keys), frozenset(keys))
        return node, len(keys), f'{{"type":"enum","values":[{",".join(texts)}]}}'

    def named(
        self, obj: object, where: str, depth: int, what: str
    ) -> tuple[tuple[tuple[str, Node], ...], int, str]:
        """Object fields (product) or union variants (sum)."""
        if not isinstance(obj, dict):
            raise SchemaError(f"{where}: must be an object")
        is_union = what == "variants"
        limit = MAX_UNION_VARIANTS if is_union else MAX_OBJECT_FIELDS
        if not 1 <= len(obj) <= limit:
            raise SchemaError(f"{where}: must have 1 to {limit} {what}")
        pairs: list[tuple[str, Node]] = []
        texts: list[str] = []
        card = 0 if is_union else 1
        for name, sub in obj.items():
            if not isinstance(name, str) or _NAME.fullmatch(name) is None:
                label = "union tag" if is_union else "field name"
                raise SchemaError(
                    f"{where}: invalid {label} {_short(name)} "
                    "(must match [A-Za-z][A-Za-z0-9_]{0,63})"
                )
            node, sub_card, sub_text = self.node(sub, f"{where}.{name}", depth + 1)
            pairs.append((name, node))
            texts.append(f'"{name}":{sub_text}')
            card = _saturate(card + sub_card) if is_union else _mul(card, sub_card)
        return tuple(pairs), card, "{" + ",".join(texts) + "}"

    def tuple_(self, items: object, where: str, depth: int) -> tuple[Node, int, str]:
        if not isinstance(items, list):
            raise SchemaError(f"{where}.items: must be an array")
        if not 1 <= len(items) <= MAX_TUPLE_ITEMS:
            raise SchemaError(f"{where}.items: must have 1 to {MAX_TUPLE_ITEMS} items")
        nodes: list[Node] = []
        texts: list[str] = []
        card = 1
        for i, sub in enumerate(items):
            node, sub_card, sub_text = self.node(sub, f"{where}.items[{i}]", depth + 1)
            nodes.append(node)
            texts.append(sub_text)
            card = _mul(card, sub_card)
        return TupleNode(tuple(nodes)), card, f'{{"type":"tuple","items":[{",".join(texts)}]}}'


_KEYS: dict[str, frozenset[str]] = {
    "const": frozenset({"type", "value"}),
    "boolean": frozenset({"type"}),
    "enum": frozenset({"type", "values"}),
    "integer": frozenset({"type", "minimum", "maximum"}),
    "object": frozenset({"type", "fields"}),
    "tuple": frozenset({"type", "items"}),
    "array": frozenset({"type", "items", "length"}),
    "union": frozenset({"type", "variants"}),
}


def _short(value: object) -> str:
    """A bounded rendering of an offending name for an error message."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _exact_keys(obj: dict[object, object], allowed: frozenset[str], where: str) -> None:
    if len(obj) == len(allowed) and all(k in obj for k in allowed):
        return
    for name in sorted(allowed):
        if name not in obj:
            raise SchemaError(f"{where}: missing key {name!r}")
    for key in obj:
        if key not in allowed:
            raise SchemaError(f"{where}: unexpected key {_short(key)}")
    raise SchemaError(f"{where}: wrong keys")  # pragma: no cover - unreachable


def _fast_enum(values: list[object]) -> tuple[str, str] | None:
    """Validate a whole integer or string enum at once; return (kind, values JSON) or None.

    The common wide enums cost one C-level pass per check instead of a Python
    loop per value (a 4096-byte integer enum has ~1000 values). None means
    "not obviously valid": the caller's per-value loop then reports the first
    offending value precisely.
    """
    first = type(values[0])
    if first is int:
        if not all(type(v) is int for v in values):
            return None
        ints: list[int] = values  # type: ignore[assignment]
        if min(ints) < -MAX_SAFE_INTEGER or max(ints) > MAX_SAFE_INTEGER:
            return None
        if len(set(ints)) != len(ints):
            return None
        return "i", ",".join(map(str, ints))
    if first is str:
        if not all(type(v) is str for v in values):
            return None
        strs: list[str] = values  # type: ignore[assignment]
        if max(map(len, strs)) > MAX_LITERAL_STRING_BYTES or len(set(strs)) != len(strs):
            return None
        joined = " ".join(strs)
        if _CONTROL.search(joined) is not None:
            return None
        if not joined.isascii():
            try:
                longest = max(len(v.encode("utf-8")) for v in strs)
            except UnicodeEncodeError:  # a lone surrogate
                return None
            if longest > MAX_LITERAL_STRING_BYTES:
                return None
        if '"' in joined or "\\" in joined:
            return "s", ",".join(map(json_string, strs))
        return "s", '"' + '","'.join(strs) + '"'
    return None


def _safe_int(value: object, where: str) -> int:
    if type(value) is not int:
        raise SchemaError(f"{where}: must be an integer (not a float, boolean or string)")
    if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        raise SchemaError(f"{where}: must be a safe integer (|n| <= 2**53 - 1)")
    return value


def _literal_string(value: str, where: str) -> None:
    # One character is at least one UTF-8 byte: refuse long strings before encoding.
    if len(value) > MAX_LITERAL_STRING_BYTES:
        raise SchemaError(f"{where}: string longer than {MAX_LITERAL_STRING_BYTES} UTF-8 bytes")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise SchemaError(f"{where}: string is not valid Unicode (lone surrogate)") from None
    if size > MAX_LITERAL_STRING_BYTES:
        raise SchemaError(f"{where}: string longer than {MAX_LITERAL_STRING_BYTES} UTF-8 bytes")
    if _CONTROL.search(value) is not None:
        raise SchemaError(f"{where}: string contains a control character")


def parse_schema(obj: object) -> Schema:
    """Parse and validate a finite-DSL response schema (spec 14.3).

    ``obj`` is plain JSON data as produced by ``json.loads`` or
    :func:`strict_parse_json`. See the module docstring for every rule.

    Returns:
        The immutable :class:`Schema` with its cardinality and charge.

    Raises:
        SchemaError: for any invalid input; the message names the location
            (``schema``, ``schema.fields.count``, ``schema.items[2]``, ...).
    """
    walk = _Walk()
    root, card, text = walk.node(obj, "schema", 0)
    size = len(text.encode("utf-8"))
    if size > MAX_SCHEMA_BYTES:
        raise SchemaError(f"schema: serialized schema is {size} bytes (max {MAX_SCHEMA_BYTES})")
    bits = RESULT_STATUS_BIT_COST + ceil_log2(card) + TIMING_BUCKET_BITS
    return Schema(root, card, bits, text)
