"""Finite-disclosure protocol v2: schema DSL, bit charge, strict output parsing, requests.

Pure logic, standard library only, relative imports only: the harness copies
this directory verbatim next to the agent's wrapper (``bounded-query-cost``),
so it must not import anything else from ``bounded_query`` (spec 14.3-14.5;
docs/architecture.md "Fixed interfaces").

Module map:

* ``_constants``  the 14.3 bounds and the limits beyond the reference
* ``_errors``     SchemaError, RequestError, JSONError (caller faults)
* ``_strict_json`` strict parser of untrusted bytes (14.5)
* ``_schema``     schema nodes, parse_schema, cardinality, charge (14.3)
* ``_text``       the one canonical JSON string escaping
* ``_values``     check_output: validation and canonical re-serialization (14.5)
* ``_request``    Request, parse_request, parse_frame, slugs, base64url (14.2, 14.3)
* ``_agent_request`` AgentRequest, parse_agent_frame, parse_agent_request (15.3)
* ``policy``      the shared policy facts: budgets, limits, runtimes, labels,
  defaults, the slug rule, the query uid, memory limits (14.1, 14.2, 14.7)
"""

from __future__ import annotations

from . import policy
from ._agent_request import (
    FORBIDDEN_CONTROL_HEADERS,
    AgentRequest,
    parse_agent_frame,
    parse_agent_request,
)
from ._constants import (
    CANONICAL_ERROR_BODY,
    MAX_ARRAY_LENGTH,
    MAX_ENUM_VALUES,
    MAX_LITERAL_STRING_BYTES,
    MAX_NAME_CHARS,
    MAX_OBJECT_FIELDS,
    MAX_OUTPUT_DEPTH,
    MAX_RESULT_BYTES,
    MAX_SAFE_INTEGER,
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_HEADER_CHARS,
    MAX_SCHEMA_NODES,
    MAX_SCRIPT_BYTES,
    MAX_SLUG_CHARS,
    MAX_TUPLE_ITEMS,
    MAX_UNION_VARIANTS,
    PROTOCOL_VERSION,
    RESULT_STATUS_BIT_COST,
    SATURATED,
    SATURATION_LIMIT,
    TIMING_BUCKET_BITS,
    TIMING_BUCKETS_MS,
)
from ._errors import JSONError, RequestError, SchemaError
from ._request import (
    Request,
    check_request_line,
    decode_schema_header,
    encode_schema_header,
    is_valid_slug,
    parse_frame,
    parse_request,
    schema_from_header,
    schema_from_object,
)
from ._schema import (
    ArrayNode,
    BooleanNode,
    ConstNode,
    EnumNode,
    IntegerNode,
    LiteralValue,
    Node,
    ObjectNode,
    Schema,
    TupleNode,
    UnionNode,
    cardinality,
    ceil_log2,
    charge,
    parse_schema,
)
from ._strict_json import NumberToken, strict_parse_json
from ._text import json_string
from ._values import canonicalize, check_output, ok_body

__all__ = [
    "CANONICAL_ERROR_BODY",
    "FORBIDDEN_CONTROL_HEADERS",
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
    "AgentRequest",
    "ArrayNode",
    "BooleanNode",
    "ConstNode",
    "EnumNode",
    "IntegerNode",
    "JSONError",
    "LiteralValue",
    "Node",
    "NumberToken",
    "ObjectNode",
    "Request",
    "RequestError",
    "Schema",
    "SchemaError",
    "TupleNode",
    "UnionNode",
    "canonicalize",
    "cardinality",
    "ceil_log2",
    "charge",
    "check_output",
    "check_request_line",
    "decode_schema_header",
    "encode_schema_header",
    "is_valid_slug",
    "json_string",
    "ok_body",
    "parse_agent_frame",
    "parse_agent_request",
    "parse_frame",
    "parse_request",
    "parse_schema",
    "policy",
    "schema_from_header",
    "schema_from_object",
    "strict_parse_json",
]
