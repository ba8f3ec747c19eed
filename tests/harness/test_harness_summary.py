"""Events, step summary, environments and command-line parsing (seed 000 5.3, 5.4, 8.5)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from bounded_query.broker.audit import AuditRecord, RefusalSummary, format_record, format_summary
from bounded_query.broker.journal import Admitted, Debit, Header, Outcome, Record, encode_record
from bounded_query.harness.__main__ import UsageError, main, parse_seed_sources
from bounded_query.harness.agent.supervise import agent_environment
from bounded_query.harness.configuration.config import BoundedQueriesConfig, PrivateRepo
from bounded_query.harness.configuration.preflight import PreflightInputs, static_problems
from bounded_query.harness.lifecycle.broker_child import broker_environment
from bounded_query.harness.lifecycle.paths import RunPaths
from bounded_query.harness.records.events import EventSink, append_step_summary
from bounded_query.harness.records.usage import render_summary, usage_from_state

REPOS = [("octo/alpha", "internal"), ("octo/docs", "public"), ("octo/vault", "sealed")]


def journal_bytes() -> bytes:
    records: list[Record] = [
        Header("ab" * 8),
        Admitted("01", repo="Octo/Alpha", charge=5),
        Debit("01", "Octo/Alpha", 5),
        Outcome("01", "ok"),
        Admitted("02", repo="octo/alpha", charge=14),
        Debit("02", "octo/alpha", 14),
        Outcome("02", "error", "query-timeout"),
        Admitted("03", rejection="bit-budget-exhausted"),
        Admitted("04", repo="octo/docs", charge=9),
        Debit("04", "octo/docs", 9),  # public is unmetered, but its bits are counted
        Outcome("04", "ok"),
    ]
    return b"".join(encode_record(r) for r in records)


def audit_bytes() -> bytes:
    return (
        b"".join(
            format_record(r)
            for r in [
                AuditRecord("01", "ok", "internal", 5, 1000),
                AuditRecord("02", "query-timeout", "internal", 14, 60000),
                AuditRecord("03", "bit-budget-exhausted"),
                AuditRecord("04", "ok", "public", 9, 1000),
            ]
        )
        + b"not json\n"
    )


def test_usage_joins_journal_and_audit_per_repository():
    usage = usage_from_state(REPOS, journal_bytes(), audit_bytes())
    alpha, docs, vault = usage.repos
    assert (alpha.spent_bits, alpha.invocations) == (19, 2)
    assert alpha.buckets == {1000: 1, 60000: 1}
    assert alpha.outcomes == {"ok": 1, "query-timeout": 1}
    assert (docs.spent_bits, docs.invocations, docs.budget) == (9, 1, None)
    assert (vault.spent_bits, vault.invocations, vault.budget) == (0, 0, 0)
    assert usage.refused == 1
    assert usage.refusals == {"bit-budget-exhausted": 1}
    assert usage.notes == ()


def test_summary_table_and_degraded_notice():
    usage = usage_from_state(REPOS, journal_bytes(), audit_bytes())
    text = render_summary(usage, exit_code=3, runtime="gvisor", degraded=["step: x|y"])
    assert text.startswith("### Bounded queries — runtime `gvisor`, exit 3")
    assert "> **Degraded mode**" in text
    assert "> - step: x\\|y" in text
    row = "| `octo/alpha` | internal | 64 | 19 | 2 | 1 s: 1, 60 s: 1 | ok: 1, query-timeout: 1 |"
    assert row in text
    assert "| `octo/docs` | public | unmetered | 9 | 1 |" in text
    assert "| **Total** | | | **28** | **3** | | |" in text
    assert "Refused before launch (any repository): 1 (bit-budget-exhausted: 1)." in text
    clean = render_summary(usage, exit_code=0, runtime="docker")
    assert "Degraded" not in clean


def test_missing_or_corrupt_state_is_a_visible_degradation():
    usage = usage_from_state(REPOS, None, None)
    assert len(usage.notes) == 2
    assert "Degraded mode" in render_summary(usage, exit_code=0, runtime="docker")
    corrupt = journal_bytes()[:20] + b"\xff" * 8 + journal_bytes()[28:]
    assert "unreadable" in usage_from_state(REPOS, corrupt, b"").notes[0]


def test_events_are_jsonl_with_timestamps():
    stream = io.StringIO()
    sink = EventSink(stream, clock=lambda: 0.0)
    sink.emit("x", a=1, path=Path("/p"))
    assert json.loads(stream.getvalue()) == {
        "_schema": "bounded-query-event/v1",
        "timestamp": "1970-01-01T00:00:00.000Z",
        "event": "x",
        "a": 1,
        "path": "/p",
    }


def test_broken_event_stream_never_raises_and_is_recorded():
    stream = io.StringIO()
    stream.close()
    sink = EventSink(stream)
    sink.emit("x")
    assert sink.degraded == ["event stream (stderr) failed; some JSONL events are missing"]


def test_step_summary_append_and_failure(tmp_path):
    sink = EventSink(io.StringIO())
    target = tmp_path / "s.md"
    assert append_step_summary(str(target), "a", sink)
    assert append_step_summary(str(target), "b\n", sink)
    assert target.read_text() == "a\nb\n"
    assert not append_step_summary(None, "x", sink)
    assert not append_step_summary(str(tmp_path / "no" / "dir.md"), "x", sink)
    assert sink.degraded[0].startswith("step summary: cannot write")


def test_agent_environment_removes_tokens_and_adds_three_variables():
    paths = RunPaths(Path("/var/tmp/p"), Path("/var/tmp/i"))
    config = BoundedQueriesConfig(
        enabled=True,
        private_repos=(PrivateRepo("o/a", "internal"), PrivateRepo("o/b", "sealed")),
    )
    env = agent_environment(
        {"GH_TOKEN": "x", "GITHUB_TOKEN": "y", "PATH": "/usr/bin", "KEEP": "1"}, paths, config
    )
    assert "GH_TOKEN" not in env
    assert "GITHUB_TOKEN" not in env
    assert env["KEEP"] == "1"
    assert env["AWF_BOUNDED_QUERY_SOCKET"] == "/var/tmp/i/run/broker.sock"
    assert env["AWF_BOUNDED_QUERY_SKILL"] == "/var/tmp/i/skill/SKILL.md"
    assert env["AWF_BOUNDED_QUERY_REPOS"] == "o/a,o/b"
    assert env["PATH"] == "/var/tmp/i/skill/bin:/usr/bin"


def test_broker_environment_is_minimal_and_credential_free():
    env = broker_environment({"PATH": "/bin", "GH_TOKEN": "x", "HOME": "/root", "LANG": "C"})
    assert env == {"PATH": "/bin", "LANG": "C"}


def test_seed_source_parsing():
    parsed = parse_seed_sources(["Octo/Alpha=/x", "o/b=rel"])
    assert parsed["octo/alpha"] == Path("/x")
    assert parsed["o/b"].is_absolute()
    for bad in (["o/a"], ["o/a="], ["o/a/b=/x"], ["o/a=/x", "O/A=/y"], ["o/a\n=/x"]):
        with pytest.raises(UsageError):
            parse_seed_sources(bad)


def test_unsafe_server_url_fails_preflight(tmp_path):
    config = BoundedQueriesConfig(enabled=True, private_repos=(PrivateRepo("o/a", "internal"),))
    inputs = PreflightInputs(
        config=config,
        paths=RunPaths(tmp_path / "p", tmp_path / "i"),
        env={"GH_TOKEN": "t", "GITHUB_SERVER_URL": "https://u:p@host", "DOCKER_HOST": "tcp://x"},
    )
    locations = sorted(p.location for p in static_problems(inputs))
    assert locations == ["DOCKER_HOST", "GITHUB_SERVER_URL"]


def test_run_usage_errors_exit_2(tmp_path, capsys):
    config = tmp_path / "c.json"
    config.write_text("{}")
    assert main(["run", "--config", str(config)]) == 2
    assert main(["run", "--config", str(config), "--seed-source", "bad", "--", "true"]) == 2
    events = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [e["event"] for e in events] == ["usage_error", "usage_error"]


# -- every response explained (issue 14 item 2) --------------------------------


def _explained_state() -> tuple[bytes, bytes]:
    records: list[Record] = [
        Header("cd" * 8),
        Admitted("a1", repo="octo/alpha", charge=5),
        Debit("a1", "octo/alpha", 5),
        Outcome("a1", "ok"),
        Admitted("a2", rejection="bit-budget-exhausted"),
        Admitted("a3", rejection="invalid-request"),
        Admitted("a4", rejection="repo-not-allowed"),
        Admitted("a5", rejection="bit-budget-exhausted"),
    ]
    audit = [
        AuditRecord("a1", "ok", "internal", 5, 1000, repo="octo/alpha"),
        AuditRecord("a2", "bit-budget-exhausted", "sealed", None, 10, repo="octo/vault"),
        AuditRecord("a3", "invalid-request", None, None, 10, detail="schema: bad"),
        AuditRecord("a4", "repo-not-allowed", None, None, 10),
        # A repo the configuration does not hold can never be credited.
        AuditRecord("a5", "bit-budget-exhausted", "internal", None, 10, repo="evil/x"),
    ]
    summary = format_summary(
        RefusalSummary((("max-invocations", 40), ("malformed-http", 2)), 1.0, 2.0)
    )
    return (
        b"".join(encode_record(r) for r in records),
        b"".join(format_record(r) for r in audit) + summary,
    )


def test_refusals_are_attributed_to_the_configured_repository_they_named():
    journal, audit = _explained_state()
    usage = usage_from_state(REPOS, journal, audit)
    alpha, _docs, vault = usage.repos
    assert vault.refusals == {"bit-budget-exhausted": 1}
    assert alpha.refusals == {}
    assert usage.unattributed == {
        "bit-budget-exhausted": 1,
        "invalid-request": 1,
        "repo-not-allowed": 1,
    }
    assert usage.refused == 4
    assert usage.uncounted == {"malformed-http": 2, "max-invocations": 40}
    assert [(r.invocation_id, r.repo, r.category) for r in usage.responses] == [
        ("a1", "octo/alpha", "ok"),
        ("a2", "octo/vault", "bit-budget-exhausted"),
        ("a3", None, "invalid-request"),
        ("a4", None, "repo-not-allowed"),
        ("a5", None, "bit-budget-exhausted"),
    ]
    text = render_summary(usage, exit_code=0, runtime="docker")
    assert text.startswith("### Bounded queries")
    assert "| `octo/vault` | sealed | 0 | 0 | 0 | — | — | bit-budget-exhausted: 1 |" in text
    assert (
        "| *not attributable* | | | | | | |"
        " bit-budget-exhausted: 1, invalid-request: 1, repo-not-allowed: 1 |"
    ) in text
    assert "malformed-http: 2, max-invocations: 40" in text
    assert "<details>\n<summary>Every counted response (5)</summary>" in text
    assert "| `a1` | `octo/alpha` | ok | 5 | 1 s |" in text
    assert "| `a3` | *not attributable* | invalid-request | — | 10 ms |" in text
    assert text.rstrip().endswith("</details>")
    assert "evil" not in text


def test_summary_of_ten_thousand_invocations_stays_under_one_mebibyte():
    ids = [f"{i:032x}" for i in range(10_000)]
    records: list[object] = [Header("ef" * 8)]
    audit: list[bytes] = []
    for i, invocation_id in enumerate(ids):
        if i % 3:
            records += [
                Admitted(invocation_id, repo="octo/docs", charge=9),
                Debit(invocation_id, "octo/docs", 9),
            ]
            audit.append(
                format_record(AuditRecord(invocation_id, "ok", "public", 9, 1000, repo="octo/docs"))
            )
        else:
            records.append(Admitted(invocation_id, rejection="invalid-request"))
            audit.append(format_record(AuditRecord(invocation_id, "invalid-request")))
    journal = b"".join(encode_record(r) for r in records)  # type: ignore[arg-type]
    usage = usage_from_state(REPOS, journal, b"".join(audit))
    assert len(usage.responses) == 10_000
    text = render_summary(usage, exit_code=0, runtime="docker")
    assert len(text.encode()) < 1024 * 1024
    assert "Every counted response (10000)" in text
    assert text.rstrip().endswith("</details>")
    small = render_summary(usage, exit_code=0, runtime="docker", max_bytes=20_000)
    assert len(small.encode()) <= 20_000
    shown = small.count("| `0000")
    assert 0 < shown < 10_000
    assert f"… and {10_000 - shown} more responses (the summary's size limit)." in small
