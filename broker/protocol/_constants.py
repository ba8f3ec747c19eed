"""Protocol v2 constants (spec 14.3, 14.3.1, 14.5; docs/architecture.md decisions 5 and 6).

Every limit the protocol enforces is named here with the reason it exists.
The names of the 14.3 table are the spec's own, so SKILL.md, tests and the
reference implementation's vector tables can refer to them verbatim.
"""

from __future__ import annotations

__all__ = [
    "CANONICAL_ERROR_BODY",
    "MAX_ARRAY_LENGTH",
    "MAX_ENUM_VALUES",
    "MAX_LITERAL_STRING_BYTES",
    "MAX_NAME_CHARS",
    "MAX_OBJECT_FIELDS",
    "MAX_OUTPUT_DEPTH",
    "MAX_RESULT_BYTES",
    "MAX_SAFE_INTEGER",
    "MAX_SCHEMA_BYTES",
    "MAX_SCHEMA_DEPTH",
    "MAX_SCHEMA_HEADER_CHARS",
    "MAX_SCHEMA_NODES",
    "MAX_SCRIPT_BYTES",
    "MAX_SLUG_CHARS",
    "MAX_TUPLE_ITEMS",
    "MAX_UNION_VARIANTS",
    "PROTOCOL_VERSION",
    "RESULT_STATUS_BIT_COST",
    "SATURATED",
    "SATURATION_LIMIT",
    "TIMING_BUCKETS_MS",
    "TIMING_BUCKET_BITS",
]

# --- 14.3 structural bounds of the finite schema DSL -------------------------

#: Max depth of a schema node; the root node is at depth 0, so seven levels of
#: nodes are allowed (six nested containers and a leaf), as in the reference.
MAX_SCHEMA_DEPTH = 6
#: Max total number of schema nodes (every const/boolean/.../union counts one).
MAX_SCHEMA_NODES = 64
#: Max size of the schema in bytes: the raw decoded header bytes as sent, and
#: the compact serialization (``separators=(",", ":")``, UTF-8, no ASCII
#: escaping) of the parsed schema.
MAX_SCHEMA_BYTES = 4096
#: Max values of one enum node.
MAX_ENUM_VALUES = 4096
#: Max fields of one object node (at least one is required).
MAX_OBJECT_FIELDS = 16
#: Max items of one tuple node (at least one is required).
MAX_TUPLE_ITEMS = 16
#: Max length of an array node (the length is fixed; 0 is allowed).
MAX_ARRAY_LENGTH = 64
#: Max variants of one union node.
MAX_UNION_VARIANTS = 16
#: Max UTF-8 bytes (not characters) of one literal string.
MAX_LITERAL_STRING_BYTES = 64

# --- 14.3 request limits -------------------------------------------------------

#: Max raw UTF-8 bytes of the query script (the request body).
MAX_SCRIPT_BYTES = 64 * 1024
#: The only wire protocol version (spec 14.9: no negotiation).
PROTOCOL_VERSION = 2

# --- 14.3 bit charge ---------------------------------------------------------------

#: ok/error is itself observable.
RESULT_STATUS_BIT_COST = 1
#: The six fixed response-timing boundaries, in milliseconds (14.3.1).
TIMING_BUCKETS_MS: tuple[int, ...] = (10, 100, 1_000, 10_000, 60_000, 600_000)
#: ceil(log2(len(TIMING_BUCKETS_MS))) = ceil(log2(6)) = 3, computed exactly.
TIMING_BUCKET_BITS = (len(TIMING_BUCKETS_MS) - 1).bit_length()

# --- Decisions that go beyond the reference (docs/architecture.md 5, 6) ----------------

#: Largest integer a JavaScript number represents exactly (2**53 - 1); schema
#: bounds, literals and result integers are limited to +-this value.
MAX_SAFE_INTEGER = 2**53 - 1
#: Cardinality is exact up to this value ...
SATURATION_LIMIT = 2**1024
#: ... and every larger cardinality is reported as this single value, so no
#: schema the bounds allow ever builds a huge integer (charge 1029 bits).
SATURATED = SATURATION_LIMIT + 1
#: Max raw bytes of the query's result file (14.5); larger output is rejected
#: before it is parsed.
MAX_RESULT_BYTES = 8192
#: Max container nesting of a parsed result or schema document. A conforming
#: result nests at most MAX_SCHEMA_DEPTH containers (only the six levels above
#: the leaves can be containers; each, a union's ``{"tag":..,"value":..}``
#: wrapper included, adds one); a schema document nests at most
#: 2 * MAX_SCHEMA_DEPTH + 2 (a container node and its fields/items per level,
#: then a leaf enum and its values). 32 leaves room and keeps the recursive
#: parser far from Python's recursion limit.
MAX_OUTPUT_DEPTH = 32
#: Max characters of an ``X-AWF-Schema-B64`` header: canonical unpadded
#: base64url of MAX_SCHEMA_BYTES bytes (checked before decoding).
MAX_SCHEMA_HEADER_CHARS = (MAX_SCHEMA_BYTES * 4 + 2) // 3
#: Max characters of an ``owner/repo`` slug (spec 14.2).
MAX_SLUG_CHARS = 140
#: Max characters of an object field name or union tag.
MAX_NAME_CHARS = 64
#: The single canonical failure response body (spec 14.4).
CANONICAL_ERROR_BODY = b'{"status":"error"}'
