"""The invocation pipeline end to end, in process, with the scripted fake runner."""

from __future__ import annotations

import json
import os

import jsonschema
import trio

import bounded_query.broker.service as service_module
from bounded_query.broker import admission
from bounded_query.broker.journal import Admitted, Debit, JournalFile, Launched, Outcome
from bounded_query.broker.workspace import WorkspaceOps, remove_tree
from tests.broker.conftest import serving
from tests.broker.helpers import (
    ERROR,
    RUN_ID,
    body_of,
    exchange,
    request_bytes,
)

OK_TRUE = b'{"status":"ok","result":true}'


def _journal(broker) -> list:
    journal = JournalFile.open(broker.private / "state" / "journal", RUN_ID)
    try:
        return list(journal.replayed[1:])
    finally:
        journal.close()


async def _audit(broker, count: int) -> list[dict]:
    """The audit lines, once ``count`` exist (they are written after each response)."""
    path = broker.private / "audit" / "audit.jsonl"
    for _ in range(1000):
        lines = path.read_text().splitlines()
        if len(lines) >= count:
            return [json.loads(line) for line in lines]
        await trio.sleep(0.005)
    raise AssertionError("audit lines missing")


async def test_valid_request_ok(broker):
    response = await exchange(broker.socket, request_bytes("write true"))
    assert body_of(response) == OK_TRUE
    records = _journal(broker)
    kinds = [type(r) for r in records]
    assert kinds == [Admitted, Debit, Launched, Outcome]
    assert records[0].repo == "octo/public"
    assert records[0].charge == 5  # 1 + ceil(log2 2) + 3
    assert records[3].result == "ok"
    assert len(broker.runner.calls) == 1
    call = broker.runner.calls[0]
    assert call.seed_dir == broker.private / "seeds" / "0001"
    assert call.workspace.parent == broker.private / "work"
    assert not call.workspace.exists()
    assert call.run_id == RUN_ID


async def test_output_is_canonicalized(broker):
    schema = (
        b'{"type":"object","fields":{"b":{"type":"boolean"},'
        b'"a":{"type":"integer","minimum":0,"maximum":9}}}'
    )
    response = await exchange(
        broker.socket, request_bytes('write  { "a" : 7 , "b":false }', schema=schema)
    )
    # Schema field order and no whitespace, whatever the script wrote.
    assert body_of(response) == b'{"status":"ok","result":{"b":false,"a":7}}'


async def test_invalid_request_debits_nothing_and_never_runs(broker):
    bad = [
        request_bytes("write true", schema=b'{"type":"string"}'),
        request_bytes("", repo="octo/internal"),
        request_bytes("write true", method="GET"),
        request_bytes("write true", target="/health"),
        request_bytes("write true", repo="../etc"),
        request_bytes("write true", extra=[("X-AWF-Debug", "1")]),
    ]
    for raw in bad:
        assert body_of(await exchange(broker.socket, raw)) == ERROR
    records = _journal(broker)
    assert all(isinstance(r, Admitted) and r.rejection == "invalid-request" for r in records)
    assert len(records) == len(bad)
    assert broker.runner.calls == []
    assert broker.server.service.accounts.ledger.spent_by_repo() == {}
    assert broker.server.service.accounts.ledger.invocations == len(bad)


async def test_unknown_repo_is_rejected_before_launch(broker):
    response = await exchange(broker.socket, request_bytes("write true", repo="octo/other"))
    assert body_of(response) == ERROR
    assert _journal(broker) == [
        Admitted(_journal(broker)[0].invocation_id, rejection="repo-not-allowed")
    ]
    assert broker.runner.calls == []


async def test_repo_lookup_is_case_insensitive(broker):
    response = await exchange(broker.socket, request_bytes("write true", repo="OCTO/Public"))
    assert body_of(response) == OK_TRUE
    assert _journal(broker)[0].repo == "octo/public"


async def test_sealed_never_runs(broker):
    schema = b'{"type":"const","value":1}'
    response = await exchange(
        broker.socket, request_bytes("write 1", repo="octo/sealed", schema=schema)
    )
    assert body_of(response) == ERROR
    (record,) = _journal(broker)
    assert record.rejection == "bit-budget-exhausted"
    assert broker.runner.calls == []
    assert not any((broker.private / "work").iterdir())


async def test_confidential_budget_is_spent_and_never_refunded(broker):
    # confidential: 8 bits. A boolean costs 5; the second one does not fit.
    first = await exchange(
        broker.socket, request_bytes("fail query-timeout", repo="octo/confidential")
    )
    assert body_of(first) == ERROR
    second = await exchange(broker.socket, request_bytes("write true", repo="octo/confidential"))
    assert body_of(second) == ERROR
    # A const (4 bits) would not fit either: 8 - 5 = 3.
    third = await exchange(
        broker.socket,
        request_bytes("write 1", repo="octo/confidential", schema=b'{"type":"const","value":1}'),
    )
    assert body_of(third) == ERROR
    assert len(broker.runner.calls) == 1
    assert broker.server.service.accounts.ledger.spent("octo/confidential") == 5
    rejections = [r.rejection for r in _journal(broker) if isinstance(r, Admitted)]
    assert rejections == [None, "bit-budget-exhausted", "bit-budget-exhausted"]


async def test_internal_budget_exact_fit(broker):
    # internal: 64 bits; 16 const queries of 4 bits fit exactly, the 17th does not.
    const = b'{"type":"const","value":"x"}'
    for _ in range(16):
        response = await exchange(
            broker.socket, request_bytes('write "x"', repo="octo/internal", schema=const)
        )
        assert body_of(response) == b'{"status":"ok","result":"x"}'
    response = await exchange(
        broker.socket, request_bytes('write "x"', repo="octo/internal", schema=const)
    )
    assert body_of(response) == ERROR
    assert broker.server.service.accounts.ledger.spent("octo/internal") == 64


async def test_public_is_unmetered(broker):
    for _ in range(20):
        assert body_of(await exchange(broker.socket, request_bytes("write true"))) == OK_TRUE


async def test_runner_failures_are_canonical_errors(broker):
    scripts = [
        "fail query-timeout",
        "fail query-nonzero-exit",
        "fail query-launch-failed",
        "raise",
        "write maybe",
        "write true\nbig 9000",
        "symlink /etc/hostname",
        "fifo",
        "dir",
        "",  # empty script is an invalid request
        "sleep 0",  # no result file
        "write " + "[" * 100,
    ]
    for script in scripts:
        response = await exchange(broker.socket, request_bytes(script))
        assert body_of(response) == ERROR, script
    assert not any((broker.private / "work").iterdir())
    categories = [line["category"] for line in await _audit(broker, len(scripts))]
    assert categories[:4] == [
        "query-timeout",
        "query-nonzero-exit",
        "query-launch-failed",
        "runner-internal",
    ]
    assert categories[4:9] == ["invalid-output"] * 5
    assert categories[9] == "invalid-request"


async def test_result_file_exactly_at_size_limit(broker):
    schema = b'{"type":"const","value":1}'
    # 8192 bytes: "1" followed by whitespace is still one JSON value.
    script = "write 1" + " " * (8192 - 1)
    response = await exchange(broker.socket, request_bytes(script, schema=schema))
    assert body_of(response) == b'{"status":"ok","result":1}'
    script = "write 1" + " " * 8192
    response = await exchange(broker.socket, request_bytes(script, schema=schema))
    assert body_of(response) == ERROR


async def test_cleanup_of_readonly_tree(broker):
    response = await exchange(broker.socket, request_bytes("write true\nnested"))
    assert body_of(response) == OK_TRUE
    assert not any((broker.private / "work").iterdir())


async def test_max_invocations_counts_rejections(tmp_path):
    import trio

    from bounded_query.broker.server import BrokerServer
    from tests.broker.helpers import load, make_root
    from tests.fakes.runner import ScriptedRunner

    config, seed_map = load(make_root(tmp_path, max_invocations=3))
    runner = ScriptedRunner()
    server = BrokerServer(config, seed_map, runner)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve)
        sock = config.socket_path
        assert body_of(await exchange(sock, request_bytes("write true", method="PUT"))) == ERROR
        assert body_of(await exchange(sock, request_bytes("write true"))) == OK_TRUE
        assert body_of(await exchange(sock, request_bytes("write true"))) == OK_TRUE
        assert body_of(await exchange(sock, request_bytes("write true"))) == ERROR
        assert len(runner.calls) == 2
        assert server.service is not None
        assert server.service.accounts.ledger.invocations == 3
        server.stop()


async def test_audit_holds_no_request_data(broker):
    secret_script = "write true\n# SECRET-SCRIPT-TEXT"
    await exchange(broker.socket, request_bytes(secret_script, repo="octo/internal"))
    await exchange(broker.socket, request_bytes("write SECRET-OUTPUT"))
    await exchange(broker.socket, request_bytes("write true", repo="evil/unconfigured-name"))
    entries = await _audit(broker, 3)
    text = (broker.private / "audit" / "audit.jsonl").read_text()
    for needle in ("SECRET", "evil", "unconfigured", str(broker.private)):
        assert needle not in text
    # The configured slug is the only value with a "/" (issue 14: every
    # response names its repository when the request named a configured one).
    assert [e["repo"] for e in entries] == ["octo/internal", "octo/public", None]
    assert [e["kind"] for e in entries] == ["boolean", "boolean", "boolean"]
    for entry in entries:
        rest = {k: v for k, v in entry.items() if k != "repo"}
        assert "/" not in json.dumps(rest).replace("bounded-query-audit/v1", "")
    assert set(entries[0]) == {
        "_schema",
        "timestamp",
        "invocationId",
        "repo",
        "kind",
        "sensitivity",
        "charge",
        "bucketMs",
        "category",
        "time",
    }
    assert entries[0]["sensitivity"] == "internal"
    assert entries[0]["charge"] == 5
    # Normally the 10 ms bucket; a loaded machine's fsync can push it to the next.
    assert entries[0]["bucketMs"] in (10, 100, 1000)
    assert isinstance(entries[0]["time"], float)
    assert entries[1]["category"] == "invalid-output"
    assert entries[2]["category"] == "repo-not-allowed"
    from bounded_query.harness.records.events import schema_path

    schema = json.loads(schema_path("bounded-query-audit/v1").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    for entry in entries:
        jsonschema.validate(entry, schema)


async def test_socket_and_ready_file_permissions(broker):
    mode = os.stat(broker.socket).st_mode & 0o777
    assert mode == 0o660
    assert (os.stat(broker.socket.parent).st_mode & 0o777) == 0o770
    ready = broker.private / "control" / "ready"
    assert (os.stat(ready).st_mode & 0o777) == 0o600
    assert json.loads(ready.read_text()) == {"pid": os.getpid(), "degraded": []}


async def test_journal_failure_fails_closed(broker):
    service = broker.server.service
    service.accounts.journal.close()  # every later append fails with EBADF
    response = await exchange(broker.socket, request_bytes("write true"))
    assert body_of(response) == ERROR
    assert service.broken
    response = await exchange(broker.socket, request_bytes("write true"))
    assert body_of(response) == ERROR
    assert broker.runner.calls == []
    assert service.accounts.ledger.invocations == 0  # nothing was counted without its record


async def test_a_bug_costs_one_answer_not_the_broker(broker_doc, capfd, monkeypatch):
    """A bug while checking the answer (injected into the classification)."""
    bug = [True]
    classify = admission.classify

    def buggy_classify(*args, **kwargs):
        if bug:
            raise RuntimeError("bug")
        return classify(*args, **kwargs)

    monkeypatch.setattr(service_module, "classify", buggy_classify)
    async with serving(broker_doc) as broker:
        response = await exchange(broker.socket, request_bytes("write true"))
        assert body_of(response) == ERROR
        assert not any((broker.private / "work").iterdir())
        err = capfd.readouterr().err
        assert '"event": "broker-bug"' in err
        assert "write true" not in err
        bug.clear()
        response = await exchange(broker.socket, request_bytes("write true"))
        assert body_of(response) == OK_TRUE
        records = _journal(broker)
        assert Outcome(records[0].invocation_id, "interrupted", "broker-internal") in records


async def test_workspace_cleanup_failure_is_an_error(broker_doc):
    async with serving(broker_doc, workspace=WorkspaceOps(remove=lambda path: False)) as broker:
        response = await exchange(broker.socket, request_bytes("write true"))
        assert body_of(response) == ERROR  # a valid answer is discarded
        entries = await _audit(broker, 1)
        assert entries[-1]["category"] == "cleanup-failed"
        records = _journal(broker)
        assert records[-1] == Outcome(records[0].invocation_id, "error", "cleanup-failed")
        for leftover in (broker.private / "work").iterdir():
            assert remove_tree(leftover)
