"""Package-level contracts: stdlib-only, relative imports, public API, own errors only."""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path

import pytest

import bounded_query.broker.protocol as protocol
from bounded_query.broker.protocol import (
    JSONError,
    RequestError,
    SchemaError,
    check_output,
    encode_schema_header,
    parse_frame,
    parse_schema,
    strict_parse_json,
)

PACKAGE_DIR = Path(protocol.__file__).parent


def test_only_stdlib_and_relative_imports() -> None:
    stdlib = sys.stdlib_module_names
    for path in sorted(PACKAGE_DIR.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name.split(".")[0] in stdlib, (path.name, alias.name)
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                assert node.module is not None
                assert node.module.split(".")[0] in stdlib | {"__future__"}, (
                    path.name,
                    node.module,
                )


def test_works_when_copied_under_another_name(tmp_path: Path) -> None:
    # The harness copies the directory verbatim next to the wrapper.
    target = tmp_path / "bq_protocol_copy"
    target.mkdir()
    for path in PACKAGE_DIR.glob("*.py"):
        (target / path.name).write_bytes(path.read_bytes())
    spec = importlib.util.spec_from_file_location(
        "bq_protocol_copy", target / "__init__.py", submodule_search_locations=[str(target)]
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bq_protocol_copy"] = module
    try:
        spec.loader.exec_module(module)
        assert module.charge(module.parse_schema({"type": "boolean"})) == 5
        assert all(not name.startswith("bounded_query") for name in module.__dict__)
    finally:
        for name in [n for n in sys.modules if n.startswith("bq_protocol_copy")]:
            del sys.modules[name]


def test_public_api() -> None:
    expected = {
        "parse_schema",
        "cardinality",
        "charge",
        "check_output",
        "parse_request",
        "parse_frame",
        "Request",
        "Schema",
        "SchemaError",
        "RequestError",
        "JSONError",
        "MAX_SCHEMA_DEPTH",
        "MAX_SCHEMA_NODES",
        "MAX_SCHEMA_BYTES",
        "MAX_ENUM_VALUES",
        "MAX_OBJECT_FIELDS",
        "MAX_TUPLE_ITEMS",
        "MAX_ARRAY_LENGTH",
        "MAX_UNION_VARIANTS",
        "MAX_LITERAL_STRING_BYTES",
        "RESULT_STATUS_BIT_COST",
        "TIMING_BUCKET_BITS",
        "TIMING_BUCKETS_MS",
        "MAX_SCRIPT_BYTES",
        "MAX_RESULT_BYTES",
        "CANONICAL_ERROR_BODY",
        "ok_body",
        "is_valid_slug",
        "check_request_line",
        "encode_schema_header",
        "strict_parse_json",
        "SATURATED",
    }
    assert expected <= set(protocol.__all__)
    assert all(hasattr(protocol, name) for name in protocol.__all__)
    assert issubclass(SchemaError, ValueError)
    assert issubclass(RequestError, ValueError)
    assert issubclass(JSONError, ValueError)


DOCUMENTS = [
    b'{"a": [1, -2, "x\\u00e9\\ud83d\\ude00"], "b": {"c": null, "d": true}}',
    '{"type":"object","fields":{"n":{"type":"enum","values":["é","\\"q"]}}}'.encode(),
]


@pytest.mark.parametrize("doc", DOCUMENTS)
def test_every_prefix_and_byte_drop_is_ours(doc: bytes) -> None:
    """Fed byte by byte (every prefix) and with each byte dropped: only JSONError."""
    parsed_prefixes = []
    for i in range(len(doc) + 1):
        try:
            strict_parse_json(doc[:i])
        except JSONError:
            continue
        parsed_prefixes.append(i)
    assert parsed_prefixes == [len(doc)]
    for i in range(len(doc)):
        try:
            strict_parse_json(doc[:i] + doc[i + 1 :])
        except JSONError:
            continue


@pytest.mark.parametrize("doc", DOCUMENTS)
def test_schema_header_prefixes_are_request_errors(doc: bytes) -> None:
    schema_doc = b'{"type":"tuple","items":[{"type":"const","value":"\xc3\xa9"}]}'
    for i in range(len(schema_doc) + 1):
        headers = [
            (b"x-awf-query-version", b"2"),
            (b"x-awf-repo", b"o/r"),
            (b"x-awf-schema-b64", encode_schema_header(schema_doc[:i])),
        ]
        try:
            parse_frame(headers, doc[: i or 1])
        except RequestError:
            assert i < len(schema_doc)
            continue
        assert i == len(schema_doc)


def test_truncated_outputs_never_raise() -> None:
    schema = parse_schema({"type": "array", "items": {"type": "boolean"}, "length": 3})
    raw = json.dumps([True, False, True]).encode()
    results = [check_output(raw[:i], schema) for i in range(len(raw) + 1)]
    assert results[-1] == "[true,false,true]"
    assert all(r is None for r in results[:-1])
