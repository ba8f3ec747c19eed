"""Reusable hypothesis strategies for the finite schema DSL (spec 14.3, 14.5).

Schemas are generated as plain JSON data (what an agent sends), independent
of the protocol package's node classes, so the tests compare the package
against separately written oracles:

* :func:`schema_objs` - schema documents within the structural bounds
  (``valid_schema_objs`` additionally filters through ``parse_schema``);
* :func:`small_schema_objs` - schemas small enough to enumerate;
* :func:`values_for` - values conforming to a schema document;
* :func:`mutated_values_for` - values guaranteed *not* to conform;
* :func:`renderings` - random but valid JSON spellings of a value (whitespace,
  key order, escapes), all with one canonical form;
* :func:`all_values` / :func:`brute_cardinality` - exhaustive enumeration.

Import as ``from tests.protocol.strategies import ...`` (run pytest as
``python -m pytest`` from the repository root).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

from hypothesis import strategies as st

from bounded_query.broker.protocol import (
    MAX_LITERAL_STRING_BYTES,
    MAX_SAFE_INTEGER,
    MAX_SCHEMA_DEPTH,
    SchemaError,
    parse_schema,
)

__all__ = [
    "all_values",
    "brute_cardinality",
    "literals",
    "mutated_values_for",
    "naive_cardinality",
    "names",
    "renderings",
    "schema_objs",
    "small_schema_objs",
    "valid_schema_objs",
    "values_for",
]

JSON = Any

_LITERAL_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=20
).filter(lambda s: len(s.encode()) <= MAX_LITERAL_STRING_BYTES)
_SAFE_INTS = st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER)

names = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,8}", fullmatch=True)


def literals(kind: str | None = None) -> st.SearchStrategy[JSON]:
    """Literals of one JSON type (``"s"``, ``"i"``, ``"b"``, ``"n"``) or of any."""
    by_kind: dict[str, st.SearchStrategy[JSON]] = {
        "s": _LITERAL_TEXT,
        "i": st.one_of(st.integers(-3, 3), _SAFE_INTS),
        "b": st.booleans(),
        "n": st.none(),
    }
    if kind is None:
        return st.one_of(*by_kind.values())
    return by_kind[kind]


def _key(value: JSON) -> tuple[str, JSON]:
    return (type(value).__name__, value)


@st.composite
def _enum(draw: st.DrawFn, max_values: int) -> JSON:
    kind = draw(st.sampled_from("sibn"))
    values = draw(st.lists(literals(kind), min_size=1, max_size=max_values, unique_by=_key))
    return {"type": "enum", "values": values}


@st.composite
def _integer(draw: st.DrawFn, max_width: int | None) -> JSON:
    if max_width is None:
        lo = draw(st.one_of(st.integers(-5, 5), _SAFE_INTS))
        hi = draw(st.one_of(st.integers(lo, lo + 5), st.integers(lo, MAX_SAFE_INTEGER)))
        hi = min(hi, MAX_SAFE_INTEGER)
    else:
        lo = draw(st.integers(-5, 5))
        hi = draw(st.integers(lo, lo + max_width - 1))
    return {"type": "integer", "minimum": lo, "maximum": hi}


def _leaves(max_enum: int, max_int_width: int | None) -> st.SearchStrategy[JSON]:
    return st.one_of(
        st.just({"type": "boolean"}),
        st.builds(lambda v: {"type": "const", "value": v}, literals()),
        _enum(max_enum),
        _integer(max_int_width),
    )


def _nodes(
    depth: int, max_depth: int, width: int, max_len: int, leaves: st.SearchStrategy[JSON]
) -> st.SearchStrategy[JSON]:
    """A node at ``depth`` (the root is 0, as in spec 14.3); only leaves at ``max_depth``."""
    if depth >= max_depth:
        return leaves
    child = _nodes(depth + 1, max_depth, width, max_len, leaves)
    # Objects and tuples need at least one field/item, unions one variant.
    named = st.dictionaries(names, child, min_size=1, max_size=width)
    return st.one_of(
        leaves,
        st.builds(lambda f: {"type": "object", "fields": f}, named),
        st.builds(
            lambda i: {"type": "tuple", "items": i}, st.lists(child, min_size=1, max_size=width)
        ),
        st.builds(
            lambda i, n: {"type": "array", "items": i, "length": n},
            child,
            st.integers(0, max_len),
        ),
        st.builds(
            lambda v: {"type": "union", "variants": v},
            named,
        ),
    )


def schema_objs(
    max_depth: int = MAX_SCHEMA_DEPTH, width: int = 3, max_len: int = 64
) -> st.SearchStrategy[JSON]:
    """Schema documents whose deepest node is at ``max_depth`` at most (the root is 0).

    Most, not all, satisfy the node and byte bounds.
    """
    return _nodes(0, max_depth, width, max_len, _leaves(6, None))


def _parses(obj: JSON) -> bool:
    try:
        parse_schema(obj)
    except SchemaError:
        return False
    return True


def valid_schema_objs(
    max_depth: int = MAX_SCHEMA_DEPTH, width: int = 3, max_len: int = 64
) -> st.SearchStrategy[JSON]:
    """Schema documents that ``parse_schema`` accepts."""
    return schema_objs(max_depth, width, max_len).filter(_parses)


def small_schema_objs() -> st.SearchStrategy[JSON]:
    """Schemas whose values can be enumerated (cardinality stays small)."""
    return _nodes(0, 3, 2, 3, _leaves(3, 3))


def values_for(schema: JSON) -> st.SearchStrategy[JSON]:
    """Values that conform to ``schema`` (a valid schema document)."""
    kind = schema["type"]
    if kind == "boolean":
        return st.booleans()
    if kind == "const":
        return st.just(schema["value"])
    if kind == "enum":
        return st.sampled_from(schema["values"])
    if kind == "integer":
        return st.integers(schema["minimum"], schema["maximum"])
    if kind == "object":
        fields = schema["fields"]
        return st.fixed_dictionaries({k: values_for(v) for k, v in fields.items()}).map(
            lambda d: {k: d[k] for k in fields}  # schema order, whatever the strategy did
        )
    if kind == "tuple":
        return st.tuples(*[values_for(v) for v in schema["items"]]).map(list)
    if kind == "array":
        n = schema["length"]
        return st.lists(values_for(schema["items"]), min_size=n, max_size=n)
    variants = schema["variants"]
    return st.sampled_from(sorted(variants)).flatmap(
        lambda tag: values_for(variants[tag]).map(lambda v: {"tag": tag, "value": v})
    )


#: A string that can never be a literal (longer than 64 UTF-8 bytes).
_NOT_A_LITERAL = "x" * (MAX_LITERAL_STRING_BYTES + 1)
#: An object key that can never be a field name or union tag.
_NOT_A_NAME = "-extra"


@st.composite
def mutated_values_for(draw: st.DrawFn, schema: JSON, value: JSON) -> JSON:
    """Mutate ``value`` (conforming to ``schema``) so that it no longer conforms.

    One location is changed; every mutation breaks a rule of spec 14.5
    (type, range, membership, fields, length or tag).
    """
    kind = schema["type"]
    # Descend into a child with some probability when there is one.
    if kind == "object" and schema["fields"] and draw(st.booleans()):
        name = draw(st.sampled_from(sorted(schema["fields"])))
        return {**value, name: draw(mutated_values_for(schema["fields"][name], value[name]))}
    if kind == "tuple" and schema["items"] and draw(st.booleans()):
        i = draw(st.integers(0, len(schema["items"]) - 1))
        new = list(value)
        new[i] = draw(mutated_values_for(schema["items"][i], value[i]))
        return new
    if kind == "array" and schema["length"] and draw(st.booleans()):
        i = draw(st.integers(0, schema["length"] - 1))
        new = list(value)
        new[i] = draw(mutated_values_for(schema["items"], value[i]))
        return new
    if kind == "union" and draw(st.booleans()):
        sub = schema["variants"][value["tag"]]
        return {"tag": value["tag"], "value": draw(mutated_values_for(sub, value["value"]))}
    # Mutate here.
    generic = [_NOT_A_LITERAL, 1.5, [value], {_NOT_A_NAME: value}]
    if kind == "boolean":
        options = [0, 1, None, "true", *generic]
    elif kind in ("const", "enum"):
        options = [*generic]
        if type(value) is int:
            options += [float(value), str(value), value is not True]
    elif kind == "integer":
        options = [schema["maximum"] + 1, schema["minimum"] - 1, float(value), str(value), True]
        options += [*generic]
    elif kind == "object":
        options = [{**value, _NOT_A_NAME: 1}, list(value.values()), *generic[:2]]
        if value:
            drop = draw(st.sampled_from(sorted(value)))
            options.append({k: v for k, v in value.items() if k != drop})
    elif kind in ("tuple", "array"):
        options = [[*value, None], {"0": value}, *generic[:2]]
        if value:
            options.append(value[:-1])
    else:  # union
        options = [
            {"tag": _NOT_A_NAME, "value": value["value"]},
            {**value, "extra": 1},
            {"tag": value["tag"]},
            {"value": value["value"]},
            [value["tag"], value["value"]],
            *generic[:2],
        ]
    return draw(st.sampled_from(options))


def _render_string(draw: st.DrawFn, s: str) -> str:
    out = ['"']
    for ch in s:
        code = ord(ch)
        escaped = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n"}.get(ch)
        escaped = escaped or {"\r": "\\r", "\t": "\\t"}.get(ch)
        if code < 0x20 or escaped or draw(st.integers(0, 7)) == 0:
            if escaped and draw(st.booleans()):
                out.append(escaped)
            elif ch == "/" and draw(st.booleans()):
                out.append("\\/")
            elif code > 0xFFFF:
                hi = 0xD800 + ((code - 0x10000) >> 10)
                lo = 0xDC00 + ((code - 0x10000) & 0x3FF)
                out.append(f"\\u{hi:04x}\\u{lo:04X}")
            else:
                out.append(f"\\u{code:04x}" if draw(st.booleans()) else f"\\u{code:04X}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


@st.composite
def renderings(draw: st.DrawFn, value: JSON) -> str:
    """A random valid JSON spelling of ``value`` (whitespace, key order, escapes)."""

    def ws() -> str:
        return draw(st.text(alphabet=" \t\n\r", max_size=2))

    def render(v: JSON) -> str:
        if isinstance(v, dict):
            keys = draw(st.permutations(list(v)))
            inner = ",".join(
                f"{ws()}{_render_string(draw, k)}{ws()}:{ws()}{render(v[k])}{ws()}" for k in keys
            )
            return "{" + (inner or ws()) + "}"
        if isinstance(v, list):
            inner = ",".join(f"{ws()}{render(x)}{ws()}" for x in v)
            return "[" + (inner or ws()) + "]"
        if isinstance(v, str):
            return _render_string(draw, v)
        return json.dumps(v)

    return ws() + render(value) + ws()


def all_values(schema: JSON) -> Iterator[JSON]:
    """Every value a schema document admits (use only on small schemas)."""
    kind = schema["type"]
    if kind == "boolean":
        yield from (False, True)
    elif kind == "const":
        yield schema["value"]
    elif kind == "enum":
        yield from schema["values"]
    elif kind == "integer":
        yield from range(schema["minimum"], schema["maximum"] + 1)
    elif kind == "object":
        fields = list(schema["fields"].items())
        for combo in itertools.product(*[list(all_values(v)) for _, v in fields]):
            yield {name: item for (name, _), item in zip(fields, combo, strict=True)}
    elif kind == "tuple":
        for combo in itertools.product(*[list(all_values(v)) for v in schema["items"]]):
            yield list(combo)
    elif kind == "array":
        items = list(all_values(schema["items"]))
        for combo in itertools.product(items, repeat=schema["length"]):
            yield list(combo)
    else:
        for tag, sub in schema["variants"].items():
            for v in all_values(sub):
                yield {"tag": tag, "value": v}


def naive_cardinality(schema: JSON) -> int:
    """Exact cardinality by the spec's definition, unbounded (small schemas only)."""
    kind = schema["type"]
    if kind == "boolean":
        return 2
    if kind == "const":
        return 1
    if kind == "enum":
        return len(schema["values"])
    if kind == "integer":
        return int(schema["maximum"] - schema["minimum"] + 1)
    if kind == "union":
        return sum(naive_cardinality(v) for v in schema["variants"].values())
    if kind == "array":
        return int(naive_cardinality(schema["items"]) ** schema["length"])
    subs = schema["fields"].values() if kind == "object" else schema["items"]
    product = 1
    for sub in subs:
        product *= naive_cardinality(sub)
    return product


def brute_cardinality(schema: JSON) -> int:
    """Count the values of ``schema`` by enumeration (check naive_cardinality first)."""
    return sum(1 for _ in all_values(schema))
