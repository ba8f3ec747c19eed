"""``report --state DIR`` (issue 14 item 3): the summary of a kept or crashed run."""

from __future__ import annotations

import json

import jsonschema
import pytest

from bounded_query.harness.lifecycle.paths import RunPaths
from bounded_query.harness.records.events import schema_path
from bounded_query.harness.records.report import (
    REPORT_SCHEMA,
    load_state,
    report_document,
    report_markdown,
)
from tests.harness.test_harness_summary import REPOS, audit_bytes, journal_bytes


def _kept_root(tmp_path, *, journal=True, audit=True, broker=True, seed_map=True):
    root = tmp_path / "awf-bounded-query-private-0-x"
    paths = RunPaths(root, tmp_path / "ingress")
    for d in (paths.journal.parent, paths.audit_log.parent):
        d.mkdir(parents=True)
    if journal:
        paths.journal.write_bytes(journal_bytes())
    if audit:
        paths.audit_log.write_bytes(audit_bytes())
    if broker:
        paths.broker_config.write_text(json.dumps({"version": 1, "runtime": "gvisor"}))
    if seed_map:
        doc = {
            "version": 1,
            "repos": [
                {"repo": r, "seedId": f"s{i}", "sensitivity": s, "commit": "0" * 40}
                for i, (r, s) in enumerate(REPOS)
            ],
        }
        paths.seed_map.write_text(json.dumps(doc))
    return root


def test_a_kept_run_reports_what_the_run_summarized(tmp_path):
    state = load_state(_kept_root(tmp_path))
    text = report_markdown(state)
    assert text.startswith("### Bounded queries — runtime `gvisor`, from the kept state")
    row = "| `octo/alpha` | internal | 64 | 19 | 2 | 1 s: 1, 60 s: 1 | ok: 1, query-timeout: 1 |"
    assert row in text
    assert "Degraded" not in text


def test_json_report_is_typed_and_matches_its_schema(tmp_path):
    doc = report_document(load_state(_kept_root(tmp_path)))
    schema = json.loads(schema_path(REPORT_SCHEMA).read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(doc, schema)
    assert doc["_schema"] == "bounded-query-report/v1"
    alpha, docs, vault = doc["repos"]
    assert alpha == {
        "repo": "octo/alpha",
        "sensitivity": "internal",
        "budgetBits": 64,
        "spentBits": 19,
        "invocations": 2,
        "buckets": {"1000": 1, "60000": 1},
        "outcomes": {"ok": 1, "query-timeout": 1},
        "refusals": {},
    }
    assert (docs["budgetBits"], vault["budgetBits"]) == (None, 0)
    assert (doc["refused"], doc["refusals"]) == (1, {"bit-budget-exhausted": 1})
    assert doc["unattributed"] == {"bit-budget-exhausted": 1}
    assert [r["invocationId"] for r in doc["responses"]] == ["01", "02", "03", "04"]
    assert doc["responses"][1] == {
        "invocationId": "02",
        "repo": "octo/alpha",
        "category": "query-timeout",
        "charge": 14,
        "bucketMs": 60000,
    }
    assert doc["notes"] == []


def test_a_crashed_run_with_missing_files_is_reported_with_notes(tmp_path):
    root = _kept_root(tmp_path, audit=False, broker=False)
    state = load_state(root)
    text = report_markdown(state)
    assert "runtime `unknown`" in text
    assert "the broker configuration is missing or unreadable" in text
    assert "the audit log is missing" in text
    assert "| `octo/alpha` | internal | 64 | 19 | 2 | — |" in text, (
        "charges still come from the journal"
    )


def test_unreadable_seed_map_and_journal_are_notes_not_crashes(tmp_path):
    root = _kept_root(tmp_path, journal=False, seed_map=False)
    RunPaths(root, root).seed_map.write_text("{not json")
    doc = report_document(load_state(root))
    assert doc["repos"] == []
    assert any("seed map" in note for note in doc["notes"])
    assert any("journal is missing" in note for note in doc["notes"])


def test_a_state_path_that_is_not_a_directory_is_the_callers_fault(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        load_state(tmp_path / "nothing-here")


def test_report_command_prints_markdown_or_json(tmp_path, capsys):
    from bounded_query.harness.__main__ import main

    root = _kept_root(tmp_path)
    assert main(["report", "--state", str(root)]) == 0
    assert "| `octo/alpha` | internal | 64 | 19 |" in capsys.readouterr().out
    assert main(["report", "--state", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["repos"][0]["spentBits"] == 19
    assert main(["report", "--state", str(tmp_path / "gone")]) == 2
    err = capsys.readouterr().err
    assert "--state:" in err
    assert "is not a directory" in err
