"""``bounded-query-cost``: validity, exact cardinality, charge and per-run counts (14.1, 14.3)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bounded_query.broker import protocol
from bounded_query.wrapper import bounded_query_cost as cost
from tests.wrapper.fakes import COST_FILE, REPO_ROOT

PROTOCOL_DIR = REPO_ROOT / "broker" / "protocol"

BOOLEAN = '{"type":"boolean"}'
INT_0_255 = '{"type":"integer","minimum":0,"maximum":255}'
SATURATING = (
    '{"type":"array","length":64,"items":{"type":"array","length":64,"items":'
    '{"type":"integer","minimum":0,"maximum":9007199254740991}}}'
)


@pytest.fixture(scope="module")
def wrapper_dir(tmp_path_factory) -> Path:
    """The layout the harness ships: the tool plus a verbatim bq_protocol/ copy."""
    root = tmp_path_factory.mktemp("wrapper-dir")
    shutil.copyfile(COST_FILE, root / "bounded-query-cost")
    (root / "bounded-query-cost").chmod(0o755)
    shutil.copytree(
        PROTOCOL_DIR, root / "bq_protocol", ignore=shutil.ignore_patterns("__pycache__")
    )
    return root


def run_tool(command: list[str], args: list[str | bytes], stdin: bytes | None = None, **kw):
    return subprocess.run(
        [*command, *args],
        input=stdin if stdin is not None else b"",
        capture_output=True,
        timeout=30,
        check=False,
        **kw,
    )


@pytest.fixture(params=["source-file", "shipped-copy-isolated"])
def tool(request, wrapper_dir) -> list[str]:
    if request.param == "source-file":
        return [sys.executable, str(COST_FILE)]
    # -I -S: no site-packages, so only the sibling bq_protocol/ can answer.
    return [sys.executable, "-I", "-S", str(wrapper_dir / "bounded-query-cost")]


# ---------------------------------------------------------------------------
# In-process: the assessment itself

CASES = [
    # (schema, cardinality, charge, internal, confidential)
    ('{"type":"const","value":null}', 1, 4, 16, 2),
    (BOOLEAN, 2, 5, 12, 1),
    ('{"type":"enum","values":["a","b","c"]}', 3, 6, 10, 1),
    ('{"type":"enum","values":[1,2,3,4]}', 4, 6, 10, 1),
    (INT_0_255, 256, 12, 5, 0),
    ('{"type":"tuple","items":[{"type":"boolean"},{"type":"boolean"}]}', 4, 6, 10, 1),
    (
        '{"type":"union","variants":{"a":{"type":"boolean"},"b":{"type":"const","value":1}}}',
        3,
        6,
        10,
        1,
    ),
    ('{"type":"object","fields":{"a":{"type":"const","value":"x"}}}', 1, 4, 16, 2),
    ('{"type":"integer","minimum":-0,"maximum":3}', 4, 6, 10, 1),  # -0 is 0 (issue 10)
    # Seven levels (the root is depth 0): the deepest schema allowed (issue 10).
    ('{"type":"array","items":' * 6 + BOOLEAN + ',"length":1}' * 6, 2, 5, 12, 1),
    ('{"type":"array","items":{"type":"boolean"},"length":60}', 2**60, 64, 1, 0),
    ('{"type":"array","items":{"type":"boolean"},"length":61}', 2**61, 65, 0, 0),
]


@pytest.mark.parametrize(("schema", "card", "bits", "internal", "confidential"), CASES)
def test_assess_valid(schema, card, bits, internal, confidential):
    result = cost.assess(schema.encode(), protocol)
    assert result.valid
    assert result.cardinality == card
    assert result.charge == bits
    assert not result.saturated
    budgets = cost.run_budgets(protocol)
    assert result.per_run(budgets) == {
        "internal": internal,
        "confidential": confidential,
        "sealed": 0,
    }


def test_assess_saturated():
    result = cost.assess(SATURATING.encode(), protocol)
    assert result.valid
    assert result.saturated
    assert result.cardinality == protocol.SATURATED
    assert result.charge == 1 + 1025 + 3


INVALID = {
    "not-json": b"{",
    "empty": b"",
    "duplicate-key": b'{"type":"boolean","type":"boolean"}',
    "trailing-garbage": BOOLEAN.encode() + b" x",
    "invalid-utf8": b'{"type":"\xff"}',
    "unknown-type": b'{"type":"string"}',
    "extra-key": b'{"type":"boolean","x":1}',
    "bad-range": b'{"type":"integer","minimum":3,"maximum":1}',
    "float-bound": b'{"type":"integer","minimum":0,"maximum":1.0}',
    "empty-enum": b'{"type":"enum","values":[]}',
    "empty-object": b'{"type":"object","fields":{}}',
    "empty-tuple": b'{"type":"tuple","items":[]}',
    "minus-zero-float-bound": b'{"type":"integer","minimum":-0.0,"maximum":1}',
    "eight-levels": b'{"type":"array","items":' * 7 + BOOLEAN.encode() + b',"length":1}' * 7,
    "array-too-long": b'{"type":"array","items":{"type":"boolean"},"length":65}',
    # Valid JSON and a valid schema, but the raw bytes exceed the header limit.
    "raw-over-4096": BOOLEAN.encode() + b" " * (4097 - len(BOOLEAN)),
}


@pytest.mark.parametrize("raw", list(INVALID.values()), ids=list(INVALID))
def test_assess_invalid(raw):
    result = cost.assess(raw, protocol)
    assert not result.valid
    assert result.error


def test_raw_size_limit_is_inclusive():
    raw = BOOLEAN.encode() + b" " * (4096 - len(BOOLEAN))
    assert len(raw) == 4096
    assert cost.assess(raw, protocol).valid


def test_error_names_the_location():
    raw = b'{"type":"object","fields":{"n":{"type":"integer","minimum":3,"maximum":1}}}'
    error = cost.assess(raw, protocol).error
    assert error is not None
    assert "fields.n" in error


def test_assessment_agrees_with_the_broker_framing():
    """The tool judges a schema exactly as parse_frame judges the header."""
    for raw in [c[0].encode() for c in CASES] + list(INVALID.values()):
        headers = [
            (b"x-awf-query-version", b"2"),
            (b"x-awf-repo", b"octo/alpha"),
            (b"x-awf-schema-b64", protocol.encode_schema_header(raw)),
        ]
        try:
            request = protocol.parse_frame(headers, b"print(1)")
        except protocol.RequestError:
            assert not cost.assess(raw, protocol).valid, raw
        else:
            result = cost.assess(raw, protocol)
            assert result.valid, raw
            assert result.charge == protocol.charge(request.schema)


def test_sibling_package_is_preferred(wrapper_dir):
    loaded = cost.load_protocol(str(wrapper_dir))
    try:
        assert loaded.__name__ == "bq_protocol"
        assert loaded.__file__ is not None
        assert Path(loaded.__file__).parent == wrapper_dir / "bq_protocol"
        for schema, *_ in CASES:
            assert cost.assess(schema.encode(), loaded) == cost.assess(schema.encode(), protocol)
    finally:
        for name in [n for n in sys.modules if n == "bq_protocol" or n.startswith("bq_protocol.")]:
            del sys.modules[name]


def test_installed_package_is_the_fallback(tmp_path):
    assert cost.load_protocol(str(tmp_path)) is protocol


# ---------------------------------------------------------------------------
# As a program: both layouts, text and JSON, exit codes


def test_text_report(tool):
    proc = run_tool(tool, ["--schema", INT_0_255])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == b""
    text = proc.stdout.decode()
    assert "schema: valid" in text
    assert "cardinality: 256\n" in text
    assert "charge: 12 bits = 1 status + 8 schema" in text
    assert "internal (64 bits): 5\n" in text
    assert "confidential (8 bits): 0\n" in text


def test_json_report_from_stdin(tool):
    proc = run_tool(tool, ["--json"], stdin=BOOLEAN.encode() + b"\n")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc == {
        "valid": True,
        "schemaBytes": len(BOOLEAN) + 1,
        "cardinality": "2",
        "saturated": False,
        "chargeBits": 5,
        "statusBits": 1,
        "schemaBits": 1,
        "timingBits": 3,
        "questionsPerRun": {"public": None, "internal": 12, "confidential": 1, "sealed": 0},
    }


def test_saturated_report(tool):
    proc = run_tool(tool, ["--schema", SATURATING, "--json"])
    doc = json.loads(proc.stdout)
    assert doc["saturated"] is True
    assert doc["cardinality"] == str(2**1024 + 1)
    assert doc["chargeBits"] == 1029
    proc = run_tool(tool, ["--schema", SATURATING])
    assert b"saturated" in proc.stdout
    assert proc.returncode == 0


@pytest.mark.parametrize("raw", [INVALID["bad-range"], INVALID["not-json"], b'{"type":"\xff"}'])
def test_invalid_schema_exits_1(tool, raw):
    proc = run_tool(tool, [b"--schema", raw])
    assert proc.returncode == 1
    assert proc.stdout.startswith(b"schema: invalid\nreason: ")
    proc = run_tool(tool, ["--json"], stdin=raw)
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    assert doc["valid"] is False
    assert doc["error"]


def test_oversize_stdin_is_invalid(tool):
    proc = run_tool(tool, [], stdin=b" " * (1024 * 1024) + BOOLEAN.encode())
    assert proc.returncode == 1
    assert b"over the 4096-byte limit" in proc.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["--schema"],
        ["--schema", BOOLEAN, "--schema", BOOLEAN],
        ["--json", "--json"],
        ["--schema=" + BOOLEAN],
        [BOOLEAN],
        ["--verbose"],
    ],
)
def test_usage_errors_exit_2(tool, args):
    proc = run_tool(tool, args)
    assert proc.returncode == 2
    assert proc.stdout == b""
    assert b"usage: bounded-query-cost" in proc.stderr


def test_terminal_stdin_is_a_usage_error(tool):
    leader, follower = os.openpty()
    try:
        proc = subprocess.run(tool, stdin=follower, capture_output=True, timeout=30, check=False)
    finally:
        os.close(leader)
        os.close(follower)
    assert proc.returncode == 2


def test_isolated_copy_really_needs_its_sibling(tmp_path):
    """Control: without bq_protocol/, the -I -S layout cannot find any protocol."""
    target = tmp_path / "bounded-query-cost"
    shutil.copyfile(COST_FILE, target)
    proc = run_tool([sys.executable, "-I", "-S", str(target)], ["--schema", BOOLEAN])
    assert proc.returncode != 0
    assert b"ModuleNotFoundError" in proc.stderr


def test_shipped_copy_agrees_on_a_real_python_3_8(wrapper_dir):
    """The agent image may only have python3.8: the shipped tool and bq_protocol
    import there (no slotted dataclasses, no runtime ``X | Y``) and give the
    same verdict, charge and JSON report as here for every conformance schema."""
    import yaml

    from tests.conftest import require_python38

    python38 = require_python38()
    table = Path(__file__).resolve().parents[1] / "protocol" / "conformance.yaml"
    rows = yaml.safe_load(table.read_text(encoding="utf-8"))["schemas"]
    schemas = [row["schema"] for row in rows if "pad" not in row]
    assert len(schemas) > 40
    old = [python38, "-I", "-S", str(wrapper_dir / "bounded-query-cost"), "--json"]
    new = [sys.executable, "-I", "-S", str(wrapper_dir / "bounded-query-cost"), "--json"]
    for schema in schemas:
        there = run_tool(old, [], stdin=schema.encode())
        here = run_tool(new, [], stdin=schema.encode())
        assert there.stderr == b"", (schema, there.stderr[-500:])
        assert (there.returncode, there.stdout) == (here.returncode, here.stdout), schema
