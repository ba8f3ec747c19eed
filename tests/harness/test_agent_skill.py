"""The bounded-agent SKILL.md and the agent ingress (spec 15.8, 15.9).

The skill is generated from the ``boundedAgents`` configuration: every limit
it states is the configuration's (checked with non-default values), every
charge is the protocol's, the provider caveat and the advice to prefer a
bounded query are there, and every example is copyable: its shell block,
run as written against the installed ``bounded-agent`` and a fake agent
broker, sends exactly the example's schema and task. The ingress that
``write_agent_subsystem_side`` lays out is checked as the agent sees it.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest

from bounded_query.broker import protocol
from bounded_query.broker.protocol import policy
from bounded_query.harness.configuration.config import BoundedAgentsConfig, PrivateRepo
from bounded_query.harness.lifecycle.paths import RunPaths
from bounded_query.harness.staging.outputs import write_agent_subsystem_side
from bounded_query.harness.staging.skill import AGENT_EXAMPLES, charge_of, render_agent_skill
from bounded_query.wrapper import bounded_query_cli as cli
from tests.wrapper.agent_frame import parse_agent_frame
from tests.wrapper.fakes import REPO_ROOT, Reply, http_reply, recorded_server

CONFIG = BoundedAgentsConfig(
    enabled=True,
    private_repos=(
        PrivateRepo("octo/alpha", "internal"),
        PrivateRepo("octo/beta", "confidential"),
        PrivateRepo("octo/docs", "public"),
        PrivateRepo("octo/vault", "sealed"),
    ),
    engine="claude",
    model="claude-test-model-7",
    timeout=97,
    max_task_bytes=1234,
    max_output_bytes=777,
    max_invocations=5,
    max_model_requests=3,
)


@pytest.fixture(scope="module")
def text() -> str:
    return render_agent_skill(CONFIG)


def test_every_repository_is_listed_with_its_own_budget(text: str) -> None:
    assert "It is this subsystem's own: bounded queries draw on a separate budget." in text
    assert "- `octo/alpha` — 64 bits/run (`internal`): room for 12 yes/no questions" in text
    assert "- `octo/beta` — 8 bits/run (`confidential`): room for 1 yes/no question" in text
    assert "- `octo/docs` — unmetered (`public`)" in text
    assert "- `octo/vault` — 0 bits/run (`sealed`): cannot fund any question" in text


def test_every_limit_is_the_configurations(text: str) -> None:
    assert "at most **5** requests per run" in text
    flat = " ".join(text.split())
    assert "A task is at most 1234 bytes of UTF-8 text" in flat
    assert "may take at most 97 s and at most 3 model requests" in flat
    assert "answer is at most 777 bytes of JSON" in flat
    assert "tasks up to 1234 bytes" in flat
    assert "one that runs past 97 s is an error" in flat
    # None of the defaults leaks in where the configuration says otherwise.
    for default in (
        f"at most **{policy.DEFAULT_AGENT_MAX_INVOCATIONS}** requests",
        f"{policy.DEFAULT_AGENT_MAX_TASK_BYTES} bytes of UTF-8",
        f"at most {policy.DEFAULT_AGENT_TIMEOUT_S} s",
    ):
        assert default not in flat


def test_the_provider_caveat_and_when_to_prefer_a_bounded_query(text: str) -> None:
    flat = " ".join(text.split())
    assert "## Before you ask: the provider sees the code" in text
    assert "the model provider of the `claude` engine (model `claude-test-model-7`)" in flat
    assert "The bit budget bounds what *you* learn, not what the provider sees" in flat
    assert "**Prefer a bounded query** whenever a deterministic script can answer" in flat
    # The caveat comes before anything that tells the agent how to ask.
    assert text.index("the provider sees the code") < text.index("## How to ask")


def test_the_dsl_buckets_and_the_charge_formula_come_from_the_protocol(text: str) -> None:
    flat = " ".join(text.split())
    assert '| union | `{"type":"union","variants":{"t":S,...}}`' in text
    assert f"Bounds: depth {protocol.MAX_SCHEMA_DEPTH}" in flat
    assert f"{protocol.MAX_SCHEMA_NODES} nodes" in flat
    buckets = "10 ms, 100 ms, 1 s, 10 s, 60 s, 600 s"
    assert len(protocol.TIMING_BUCKETS_MS) == 6
    assert f"({buckets})" in flat
    assert (
        f"charge = {protocol.RESULT_STATUS_BIT_COST} (ok/error) + ceil(log2(cardinality))"
        f" + {protocol.TIMING_BUCKET_BITS} (timing bucket)" in text
    )


def test_each_examples_charge_is_the_brokers(text: str) -> None:
    assert len(AGENT_EXAMPLES) >= 5
    for example in AGENT_EXAMPLES:
        card, bits = charge_of(example.schema)
        schema = protocol.parse_schema(example.schema)
        assert (card, bits) == (protocol.cardinality(schema), protocol.charge(schema))
        assert f"Cardinality {card}, charge {bits} bits." in text
        compact = json.dumps(example.schema, separators=(",", ":"), ensure_ascii=False)
        row = f"| `{compact}` | {card} |"
        assert row in text
        assert f"**{bits}** | {64 // bits} | {8 // bits} |" in text


def _example_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(bounded-agent [^\n]*<<'EOF'\n.*?\nEOF)\n```", text, flags=re.S)


def test_every_example_is_copyable(text: str, tmp_path: Path) -> None:
    """Each shell block, run by ``sh`` exactly as written, with the installed
    ``bounded-agent`` first on PATH: the fake broker receives a strict frame
    with the example's schema bytes and its task text, for the first usable
    (not sealed) repository."""
    paths = RunPaths(tmp_path / "private", tmp_path / "ingress")
    write_agent_subsystem_side(paths, CONFIG)
    blocks = _example_blocks(text)
    assert len(blocks) == len(AGENT_EXAMPLES)
    for example, block in zip(AGENT_EXAMPLES, blocks, strict=True):
        with recorded_server(Reply([http_reply(b'{"status":"error"}')])) as server:
            env = {
                "PATH": f"{paths.wrapper_dir}:/usr/bin:/bin",
                policy.ENV_AGENT_SOCKET: server.path,
            }
            done = subprocess.run(
                ["sh", "-c", block], env=env, capture_output=True, timeout=60, check=False
            )
            assert (done.stdout, done.stderr, done.returncode) == (
                b'{"status":"error"}\n',
                b"",
                0,
            )
        frame = parse_agent_frame(server.requests[0], CONFIG.max_task_bytes)
        assert frame.repo == "octo/alpha"
        compact = json.dumps(example.schema, separators=(",", ":"), ensure_ascii=False)
        assert frame.schema == compact.encode()
        assert frame.task == example.task.encode()


def test_the_mcp_snippets_register_the_agent_server(text: str) -> None:
    blocks = re.findall(r"```(json|toml)\n(.*?)\n```", text, flags=re.S)
    assert len(blocks) == 4
    for language, body in blocks:
        if language == "toml":
            server = tomllib.loads(body)["mcp_servers"]["bounded-agent"]
            assert server["env_vars"] == list(policy.AGENT_SUBSYSTEM_VARIABLES)
        else:
            server = json.loads(body)["mcpServers"]["bounded-agent"]
            assert server["env"] == {v: "${" + v + "}" for v in policy.AGENT_SUBSYSTEM_VARIABLES}
        assert server["command"] == "bounded-query-mcp"
    assert "claude mcp add-json bounded-agent" in text
    assert "bounded-agent://SKILL.md" in text


def test_no_private_path_or_secret_shape_appears(text: str) -> None:
    assert "/var/tmp" not in text
    assert "awf-bounded-agent-private" not in text
    assert "API_KEY" not in text


# --- the agent ingress ---------------------------------------------------------------


def test_the_agent_ingress_as_the_agent_sees_it(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "private", tmp_path / "ingress")
    write_agent_subsystem_side(paths, CONFIG)
    mode = lambda p: stat.S_IMODE(os.lstat(p).st_mode)  # noqa: E731
    assert mode(paths.ingress_root) == 0o755
    assert mode(paths.socket_dir) == 0o770
    assert sorted(os.listdir(paths.ingress_root)) == ["run", "skill"]
    assert sorted(os.listdir(paths.skill_dir)) == ["SKILL.md", "bin"]
    assert sorted(os.listdir(paths.wrapper_dir)) == [
        "bounded-agent",
        "bounded-agent.json",
        "bounded-query-cost",
        "bounded-query-mcp",
        "bq_protocol",
    ]
    for directory in (paths.skill_dir, paths.wrapper_dir, paths.wrapper_dir / "bq_protocol"):
        assert mode(directory) == 0o555
    for name in ("bounded-agent", "bounded-query-cost", "bounded-query-mcp"):
        assert mode(paths.wrapper_dir / name) == 0o555
    assert mode(paths.skill_file) == 0o444
    assert mode(paths.wrapper_dir / "bounded-agent.json") == 0o444
    assert paths.skill_file.read_text(encoding="utf-8") == render_agent_skill(CONFIG)
    source = (REPO_ROOT / "wrapper" / "bounded_query_cli.py").read_bytes()
    assert (paths.wrapper_dir / "bounded-agent").read_bytes() == source
    limits = (paths.wrapper_dir / "bounded-agent.json").read_bytes()
    assert cli.decode_agent_limits(limits, policy.ENCLAVE_MAX_TASK_BYTES) == 1234
    with pytest.raises(FileExistsError, match="agent ingress root"):
        write_agent_subsystem_side(paths, CONFIG)


def test_the_sealed_ingress_enforces_the_runs_task_limit(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "private", tmp_path / "ingress")
    write_agent_subsystem_side(paths, CONFIG)
    program = str(paths.wrapper_dir / "bounded-agent")
    args = ["--repo", "octo/alpha", "--schema", '{"type":"boolean"}']
    ok = b'{"status":"ok","result":false}'
    with recorded_server(Reply([http_reply(ok)])) as server:
        env = {**os.environ, policy.ENV_AGENT_SOCKET: server.path, cli.TEST_DEADLINE_ENV: "5"}
        outs = [
            subprocess.run(
                [program, *args], input=task, env=env, capture_output=True, timeout=60, check=False
            ).stdout
            for task in (b"x" * 1234, b"x" * 1235)
        ]
    assert outs == [ok + b"\n", b'{"status":"error"}\n']
    assert len(server.requests) == 1


def test_the_lifecycle_hook_writes_the_same_ingress(tmp_path: Path) -> None:
    """``skill.write_agent_ingress`` (the hook the run lifecycle looks up) fills a
    created ingress root exactly as ``write_agent_subsystem_side`` does."""
    from bounded_query.harness.staging import skill
    from bounded_query.harness.staging.outputs import create_ingress_root

    hooked = RunPaths(tmp_path / "p1", tmp_path / "hooked")
    create_ingress_root(hooked)
    skill.write_agent_ingress(hooked, CONFIG)
    whole = RunPaths(tmp_path / "p2", tmp_path / "whole")
    write_agent_subsystem_side(whole, CONFIG)

    def tree(root: Path) -> dict[str, bytes | None]:
        return {
            str(path.relative_to(root)): None if path.is_dir() else path.read_bytes()
            for path in sorted(root.rglob("*"))
        }

    assert tree(hooked.ingress_root) == tree(whole.ingress_root)
