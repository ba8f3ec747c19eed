"""Seed map, broker config, SKILL.md and the wrapper directory (spec 14.6, 14.8)."""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bounded_query.broker import protocol
from bounded_query.broker.config import parse_config, parse_seed_map
from bounded_query.harness.configuration.config import BoundedQueriesConfig, PrivateRepo
from bounded_query.harness.lifecycle.paths import run_paths
from bounded_query.harness.staging.outputs import (
    broker_config_doc,
    remove_roots,
    seed_map_doc,
    write_agent_side,
    write_json_private,
)
from bounded_query.harness.staging.seeds import StagedSeed, create_private_root
from bounded_query.harness.staging.skill import EXAMPLES, charge_of, render_skill
from tests.harness.bq_harness_helpers import var_tmp_base

CONFIG = BoundedQueriesConfig(
    enabled=True,
    private_repos=(
        PrivateRepo("octo/alpha", "internal"),
        PrivateRepo("octo/beta", "confidential"),
        PrivateRepo("octo/docs", "public"),
        PrivateRepo("octo/vault", "sealed"),
    ),
    max_invocations=17,
)
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def paths(tmp_path):
    with var_tmp_base() as base:
        result = run_paths(os.getuid(), tmp_path, secrets.token_hex(16), base=base)
        create_private_root(result)
        yield result


def test_seed_map_and_broker_config_are_accepted_by_the_broker(paths):
    seeds = [
        StagedSeed("octo/alpha", "internal", "a" * 32, "1" * 40, paths.seeds_dir / ("a" * 32), 0.1),
        StagedSeed("octo/vault", "sealed", "b" * 32, "2" * 40, paths.seeds_dir / ("b" * 32), 0.1),
    ]
    write_json_private(paths.seed_map, seed_map_doc(seeds))
    doc = broker_config_doc(paths, "ab" * 16, CONFIG)
    write_json_private(paths.broker_config, doc)
    for path in (paths.seed_map, paths.broker_config):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    seed_map = parse_seed_map(json.loads(paths.seed_map.read_text()))
    entry = seed_map.lookup("OCTO/ALPHA")
    assert entry is not None
    assert (entry.seed_id, entry.sensitivity, entry.commit) == ("a" * 32, "internal", "1" * 40)
    broker = parse_config(json.loads(paths.broker_config.read_text()))
    assert broker.socket_path == paths.socket_path
    assert broker.ready_path == paths.ready_file
    assert broker.audit_path == paths.audit_log
    assert broker.journal_path == paths.journal
    assert broker.seeds_root == paths.seeds_dir
    assert broker.max_invocations == 17
    assert set(doc) == {
        "version",
        "runId",
        "socketPath",
        "socketUid",
        "socketGid",
        "privateRoot",
        "seedMap",
        "runtime",
        "timeout",
        "memoryLimit",
        "maxInvocations",
        "image",
        "dockerHost",
        "hostPathMap",
    }


def test_skill_lists_every_repository_with_its_budget():
    text = render_skill(CONFIG)
    assert "- `octo/alpha` — 64 bits/run (`internal`)" in text
    assert "- `octo/beta` — 8 bits/run (`confidential`)" in text
    assert "- `octo/docs` — unmetered (`public`)" in text
    assert "- `octo/vault` — 0 bits/run (`sealed`)" in text
    assert "at most **17** requests per run" in text
    assert "charge = 1 (ok/error) + ceil(log2(cardinality)) + 3 (timing bucket)" in text
    assert "10 ms, 100 ms, 1 s, 10 s, 60 s, 600 s" in text
    assert "/var/tmp" not in text


def test_skill_has_a_copyable_example_for_every_schema_kind():
    kinds = {e.kind for e in EXAMPLES}
    assert kinds == {"const", "boolean", "enum", "integer", "object", "tuple", "array", "union"}
    text = render_skill(CONFIG)
    for example in EXAMPLES:
        compact = json.dumps(example.schema, separators=(",", ":"))
        assert f"--schema '{compact}' <<'EOF'" in text
        # The example script is valid Python.
        compile(example.script, example.kind, "exec")


def test_worked_table_numbers_come_from_the_protocol():
    text = render_skill(CONFIG)
    for example in EXAMPLES:
        schema = protocol.parse_schema(example.schema)
        card, bits = int(protocol.cardinality(schema)), int(protocol.charge(schema))
        assert charge_of(example.schema) == (card, bits)
        row = next(
            line
            for line in text.splitlines()
            if line.startswith(f"| `{json.dumps(example.schema, separators=(',', ':'))}` |")
        )
        assert f"| {card} |" in row
        assert f"**{bits}**" in row
        assert row.endswith(f"| {64 // bits} | {8 // bits} |")


def test_skill_says_what_each_budget_buys_and_how_to_keep_a_ledger():
    text = render_skill(CONFIG)
    # boolean = 1 + 1 + 3 = 5 bits; the largest answer leaves room for status and timing.
    assert (
        "64 bits/run (`internal`): room for 12 yes/no questions, or a single answer"
        " with up to 2^60 possible values" in text
    )
    assert (
        "8 bits/run (`confidential`): room for 1 yes/no question, or a single answer"
        " with up to 16 possible values" in text
    )
    assert "0 bits/run (`sealed`): cannot fund any question" in text
    assert "unmetered (`public`): no bit budget" in text
    assert "keep your own ledger" in text
    assert '| union | `{"type":"union","variants":{"t":S,...}}` | `{"tag":"t","value":<S>}`' in text


def test_skill_shows_the_cost_tools_real_output(paths):
    write_agent_side(paths, CONFIG)
    done = subprocess.run(
        [
            sys.executable,
            str(paths.wrapper_dir / "bounded-query-cost"),
            "--schema",
            '{"type":"boolean"}',
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    text = paths.skill_file.read_text()
    assert '$ bounded-query-cost --schema \'{"type":"boolean"}\'\n' + done.stdout in text


def test_agent_side_is_read_only_and_verbatim(paths):
    write_agent_side(paths, CONFIG)
    wrapper = paths.wrapper_dir
    source = REPO_ROOT / "wrapper/bounded_query_cli.py"
    assert (wrapper / "bounded-query").read_bytes() == source.read_bytes()
    assert (wrapper / "bounded-query-cost").read_bytes() == (
        REPO_ROOT / "wrapper/bounded_query_cost.py"
    ).read_bytes()
    for name in ("bounded-query", "bounded-query-cost"):
        assert stat.S_IMODE((wrapper / name).stat().st_mode) == 0o555
    for source in (REPO_ROOT / "broker/protocol").glob("*.py"):
        copy = wrapper / "bq_protocol" / source.name
        assert copy.read_bytes() == source.read_bytes()
        assert stat.S_IMODE(copy.stat().st_mode) == 0o444
    for directory in (paths.skill_dir, wrapper, wrapper / "bq_protocol"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o555
    assert stat.S_IMODE(paths.skill_file.stat().st_mode) == 0o444
    assert paths.skill_file.read_text() == render_skill(CONFIG)
    assert stat.S_IMODE(paths.socket_dir.stat().st_mode) == 0o770
    remove_roots(paths)
    assert not paths.ingress_root.exists()
    assert not paths.private_root.exists()


def test_cost_tool_in_wrapper_dir_runs_standalone_with_the_shipped_protocol(paths):
    write_agent_side(paths, CONFIG)
    schema = '{"type":"integer","minimum":0,"maximum":1000}'
    done = subprocess.run(
        [
            sys.executable,
            "-I",
            str(paths.wrapper_dir / "bounded-query-cost"),
            "--json",
            "--schema",
            schema,
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["chargeBits"] == charge_of(json.loads(schema))[1] == 14


def test_example_repo_builds_with_three_commits(tmp_path):
    from bounded_query.harness.demo import build_example_repo

    head = build_example_repo(tmp_path / "w")
    assert len(head) == 40
    assert build_example_repo(tmp_path / "again") == head  # fixed dates: reproducible
    assert (tmp_path / "w" / "VERSION").read_text() == "2.3.1\n"
