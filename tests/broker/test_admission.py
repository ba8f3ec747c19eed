"""The pure admission and outcome core as tables, without trio (broker/admission.py).

Every branch of :func:`admit` (cap, broken, stopping, each validation
failure, unknown repository, each affordability case, the launch) and of
:func:`classify` (runner bug, each reported failure, missing, invalid and
valid output), plus "nothing but our own verdict" for hostile frames.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bounded_query.broker.admission import (
    Admit,
    Classified,
    RawRequest,
    Reject,
    admit,
    classify,
)
from bounded_query.broker.config import SeedEntry, SeedMap
from bounded_query.broker.journal import Admitted, Debit, Launched, Outcome, Record
from bounded_query.broker.ledger import Ledger
from bounded_query.broker.protocol import (
    CANONICAL_ERROR_BODY,
    charge,
    encode_schema_header,
    ok_body,
    parse_schema,
)
from bounded_query.broker.runner import FAILURE_CATEGORIES, RunReport
from tests.broker.helpers import REPOS, raw_request, request_bytes

ID = "ab" * 16
SEED_MAP = SeedMap(
    {
        repo: SeedEntry(repo, f"{index + 1:04x}", sensitivity, "a" * 40)
        for index, (repo, sensitivity) in enumerate(REPOS.items())
    }
)
BOOL = b'{"type":"boolean"}'  # 5 bits
INT_1000 = b'{"type":"integer","minimum":0,"maximum":1000}'  # 14 bits


def _ledger(invocations: int = 0, spent: dict[str, int] | None = None) -> Ledger:
    """A ledger folded from real records: ``invocations`` counted, ``spent`` debited."""
    records: list[Record] = []
    for index, (repo, bits) in enumerate((spent or {}).items()):
        inv = f"{index + 1:08x}"
        records += [Admitted(inv, repo=repo, charge=bits), Debit(inv, repo, bits)]
        records.append(Outcome(inv, "ok"))
    for index in range(invocations - len(spent or {})):
        records.append(Admitted(f"f{index:07x}", rejection="invalid-request"))
    ledger = Ledger.from_records(records)
    assert ledger.invocations == invocations
    return ledger


def _request(script: str = "print(1)", **options: object) -> RawRequest:
    return raw_request(request_bytes(script, **options))  # type: ignore[arg-type]


def _with_header(name: bytes, value: bytes, *, drop: bytes | None = None) -> RawRequest:
    base = _request()
    headers = [(k, v) for k, v in base.headers if k != drop]
    return RawRequest(base.method, base.target, base.http_version, (*headers, (name, value)), b"x")


# -- admit: rejections --------------------------------------------------------

REJECTIONS = [
    # (name, request, ledger, cap, options, category, counted, detail fragment)
    ("broken", _request(), _ledger(), 10, {"broken": True}, "broker-internal", False, None),
    ("cap reached", _request(), _ledger(10), 10, {}, "max-invocations", False, None),
    ("past the cap", _request(), _ledger(11), 10, {}, "max-invocations", False, None),
    # Order: a broken journal wins over the cap, the cap over stopping.
    (
        "broken at cap",
        _request(),
        _ledger(10),
        10,
        {"broken": True},
        "broker-internal",
        False,
        None,
    ),
    (
        "stopping at cap",
        _request(),
        _ledger(10),
        10,
        {"accepting": False},
        "max-invocations",
        False,
        None,
    ),
    ("stopping", _request(), _ledger(), 10, {"accepting": False}, "broker-stopping", True, None),
    (
        "HTTP/1.0",
        _request(version="HTTP/1.0"),
        _ledger(),
        10,
        {},
        "invalid-request",
        True,
        "HTTP/1.1",
    ),
    ("GET", _request(method="GET"), _ledger(), 10, {}, "invalid-request", True, None),
    ("wrong target", _request(target="/other"), _ledger(), 10, {}, "invalid-request", True, None),
    ("empty script", _request(""), _ledger(), 10, {}, "invalid-request", True, None),
    ("invalid slug", _request(repo="not a slug"), _ledger(), 10, {}, "invalid-request", True, None),
    (
        "invalid schema",
        _request(schema=b'{"type":"integer","minimum":3,"maximum":1}'),
        _ledger(),
        10,
        {},
        "invalid-request",
        True,
        None,
    ),
    (
        "unknown schema type",
        _request(schema=b'{"type":"float"}'),
        _ledger(),
        10,
        {},
        "invalid-request",
        True,
        None,
    ),
    (
        "version 1",
        _with_header(b"x-awf-query-version", b"1", drop=b"x-awf-query-version"),
        _ledger(),
        10,
        {},
        "invalid-request",
        True,
        "must be 2",
    ),
    (
        "missing repo header",
        _with_header(b"x-other", b"1", drop=b"x-awf-repo"),
        _ledger(),
        10,
        {},
        "invalid-request",
        True,
        "missing x-awf-repo",
    ),
    (
        "duplicate repo header",
        _with_header(b"x-awf-repo", b"octo/public"),
        _ledger(),
        10,
        {},
        "invalid-request",
        True,
        "duplicate x-awf-repo",
    ),
    (
        "non-canonical schema header",
        _with_header(b"x-awf-schema-b64", b"!!", drop=b"x-awf-schema-b64"),
        _ledger(),
        10,
        {},
        "invalid-request",
        True,
        None,
    ),
]


@pytest.mark.parametrize(
    ("request_", "ledger", "cap", "options", "category", "counted", "detail"),
    [case[1:] for case in REJECTIONS],
    ids=[case[0] for case in REJECTIONS],
)
def test_rejections(request_, ledger, cap, options, category, counted, detail):
    before = (ledger.invocations, ledger.spent_by_repo())
    verdict = admit(request_, SEED_MAP, ledger, cap, ID, **options)
    assert isinstance(verdict, Reject)
    assert verdict.category == category
    assert verdict.counted is counted
    expected = (Admitted(ID, rejection=category),) if counted else ()
    assert verdict.records == expected
    assert verdict.entry is None  # nothing was looked up before these checks
    if detail is not None:
        assert verdict.detail is not None
        assert detail in verdict.detail
    # The script never reaches the detail (the audit log is not a channel).
    assert "print(1)" not in (verdict.detail or "")
    assert (ledger.invocations, ledger.spent_by_repo()) == before  # admit is pure


LOOKUPS = [
    # (repo named, schema, spent so far, category or None for a launch, budget entry)
    ("octo/unknown", BOOL, {}, "repo-not-allowed", None),
    ("octo/sealed", b'{"type":"const","value":1}', {}, "bit-budget-exhausted", "octo/sealed"),
    ("octo/sealed", BOOL, {}, "bit-budget-exhausted", "octo/sealed"),
    ("octo/confidential", INT_1000, {}, "bit-budget-exhausted", "octo/confidential"),
    (
        "octo/confidential",
        BOOL,
        {"octo/confidential": 4},
        "bit-budget-exhausted",
        "octo/confidential",
    ),
    ("octo/confidential", BOOL, {"octo/confidential": 3}, None, "octo/confidential"),  # 3 + 5 == 8
    ("octo/internal", INT_1000, {"octo/internal": 50}, None, "octo/internal"),  # 50 + 14 == 64
    ("octo/internal", INT_1000, {"octo/internal": 51}, "bit-budget-exhausted", "octo/internal"),
    ("OCTO/Internal", BOOL, {"octo/internal": 59}, None, "octo/internal"),  # lookup ignores case
    ("octo/public", INT_1000, {"octo/public": 10**9}, None, "octo/public"),  # unmetered
]


@pytest.mark.parametrize(("repo", "schema", "spent", "category", "entry"), LOOKUPS)
def test_lookup_charge_and_affordability(repo, schema, spent, category, entry):
    ledger = _ledger(len(spent), spent)
    verdict = admit(_request(repo=repo, schema=schema), SEED_MAP, ledger, 100, ID)
    bits = charge(parse_schema(json.loads(schema)))
    if category is not None:
        assert isinstance(verdict, Reject)
        assert verdict.category == category
        assert verdict.records == (Admitted(ID, rejection=category),)
        assert verdict.entry == (None if entry is None else SEED_MAP.lookup(entry))
        assert verdict.kind is not None  # the frame parsed
        return
    assert isinstance(verdict, Admit)
    assert verdict.entry == SEED_MAP.lookup(entry)
    assert verdict.charge == bits
    assert verdict.payload == b"print(1)"
    assert verdict.records == (
        Admitted(ID, repo=verdict.entry.repo, charge=bits),
        Debit(ID, verdict.entry.repo, bits),
        Launched(ID),
    )
    # The records fold: count + 1, exactly the charge debited from the canonical slug.
    ledger.apply(verdict.records[0])
    ledger.apply(verdict.records[1])
    assert ledger.spent(entry) == spent.get(entry, 0) + bits


def test_the_last_slot_is_usable_and_then_the_cap_holds():
    ledger = _ledger(9)
    verdict = admit(_request(), SEED_MAP, ledger, 10, ID)
    assert isinstance(verdict, Admit)
    for record in verdict.records:
        ledger.apply(record)
    after = admit(_request(), SEED_MAP, ledger, 10, "cd" * 16)
    assert after == Reject("max-invocations")


def test_admit_reports_the_schema_kind():
    cases = {BOOL: "boolean", INT_1000: "integer", b'{"type":"const","value":1}': "const"}
    for schema, kind in cases.items():
        verdict = admit(_request(schema=schema), SEED_MAP, _ledger(), 10, ID)
        assert isinstance(verdict, Admit)
        assert verdict.kind == kind


def test_hostile_frames_get_nothing_but_a_verdict():
    """Random header names, values and bodies: a Reject or an Admit, never an exception."""
    rng = random.Random(11_3)
    names = [b"x-awf-query-version", b"x-awf-repo", b"x-awf-schema-b64", b"x-awf-x", b"host"]
    good_schema = encode_schema_header(BOOL)
    values = [b"2", b"octo/public", good_schema, b"", b"\xff\xfe", b"a" * 5000, b"=" * 3]
    categories = set()
    for _ in range(3000):
        headers = tuple((rng.choice(names), rng.choice(values)) for _ in range(rng.randrange(0, 6)))
        body = rng.choice([b"", b"print(1)", b"\xff", b"x" * 70_000])
        method = rng.choice([b"POST", b"GET", b"post"])
        request = RawRequest(method, rng.choice([b"/query", b"/"]), b"1.1", headers, body)
        verdict = admit(request, SEED_MAP, _ledger(), 10, ID)
        categories.add(verdict.category if isinstance(verdict, Reject) else "launch")
    assert "invalid-request" in categories
    assert categories <= {"invalid-request", "launch"}


# -- classify -----------------------------------------------------------------

FIELDS = {"a": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 3}}
SCHEMA = parse_schema({"type": "object", "fields": FIELDS})  # fmt: skip
GOOD = b'{"n":2,"a":false}'
CANONICAL = '{"a":false,"n":2}'

CLASSIFY = [
    # (name, report, raw, category, canonical)
    ("runner bug", None, GOOD, "runner-internal", None),
    *[(name, RunReport(failure=name), GOOD, name, None) for name in sorted(FAILURE_CATEGORIES)],
    ("no result file", RunReport(), None, "invalid-output", None),
    ("empty", RunReport(), b"", "invalid-output", None),
    ("not JSON", RunReport(), b"{nope", "invalid-output", None),
    ("wrong type", RunReport(), b'{"a":1,"n":2}', "invalid-output", None),
    ("out of range", RunReport(), b'{"a":true,"n":4}', "invalid-output", None),
    ("missing field", RunReport(), b'{"a":true}', "invalid-output", None),
    ("extra field", RunReport(), b'{"a":true,"n":1,"x":0}', "invalid-output", None),
    ("duplicate key", RunReport(), b'{"a":true,"a":false,"n":1}', "invalid-output", None),
    ("ok, re-serialized", RunReport(), GOOD, "ok", CANONICAL),
    ("ok, trailing newline", RunReport(), GOOD + b"\n", "ok", CANONICAL),
]


@pytest.mark.parametrize(
    ("report", "raw", "category", "canonical"),
    [case[1:] for case in CLASSIFY],
    ids=[case[0] for case in CLASSIFY],
)
def test_classify(report, raw, category, canonical):
    result = classify(report, raw, SCHEMA)
    assert result == Classified(category, canonical)
    if canonical is None:
        assert result.body == CANONICAL_ERROR_BODY
        assert result.outcome(ID) == Outcome(ID, "error", category)
    else:
        assert result.body == ok_body(canonical)
        assert result.body == b'{"status":"ok","result":' + canonical.encode() + b"}"
        assert result.outcome(ID) == Outcome(ID, "ok")


def test_every_failure_category_is_covered():
    assert {case[3] for case in CLASSIFY} >= FAILURE_CATEGORIES


@pytest.mark.parametrize(("category", "canonical"), [("ok", None), ("invalid-output", "true")])
def test_an_answer_exactly_when_ok(category, canonical):
    with pytest.raises(ValueError, match="exactly when"):
        Classified(category, canonical)


# -- the layering -------------------------------------------------------------


def _imports(module: str) -> set[str]:
    import ast
    import importlib

    path = importlib.import_module(module).__file__
    assert path is not None
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_core_is_pure_and_the_pipeline_never_sees_the_transport():
    core = _imports("bounded_query.broker.admission")
    assert not core & {"trio", "os", "socket", "docker", "h11", "time"}
    assert "bounded_query.broker.http" not in core
    assert "bounded_query.broker.http" not in _imports("bounded_query.broker.service")
