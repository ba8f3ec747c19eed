"""The bounded-agent preflight refuses before anything is staged (spec 15.2, 15.7)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import secrets
import socket
import stat
from pathlib import Path
from typing import Any

import pytest

from bounded_query.broker.protocol import policy
from bounded_query.harness.configuration.agent_preflight import (
    PROBE_ROLE,
    AgentPreflightInputs,
    agent_api_target,
    agent_preflight,
    agent_runtime_problems,
    agent_static_problems,
    copilot_byok_target,
    credential_variable,
    enclave_image_problems,
    validate_network_name,
)
from bounded_query.harness.configuration.config import (
    ApiTarget,
    BoundedAgentsConfig,
    PrivateRepo,
)
from bounded_query.harness.configuration.images import enclave_recipe
from bounded_query.harness.configuration.sbx_capability import (
    SbxObservation,
    enclave_sbx_report,
    observe_sbx,
)
from bounded_query.harness.records.events import EventSink
from bounded_query.harness.records.notices import problems_event

#: A credential value no output may ever contain.
SECRET = "sk-ant-" + secrets.token_hex(16)
BYOK_SECRET = "sk-byok-" + secrets.token_hex(16)
REPOS = (PrivateRepo("octo/alpha", "internal"),)
CLAUDE = BoundedAgentsConfig(
    enabled=True,
    private_repos=REPOS,
    engine="claude",
    model="claude-sonnet-4-5",
    target=ApiTarget("https", "api.anthropic.com", 443, ""),
)
RUN_ID = "ab" * 16


@pytest.fixture
def docker_sock(tmp_path):
    path = tmp_path / "docker.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    yield f"unix://{path}"
    server.close()


def inputs(docker_sock: str, **overrides: Any) -> AgentPreflightInputs:
    env = overrides.pop(
        "env", {"ANTHROPIC_API_KEY": SECRET, "GH_TOKEN": "t0ken", "DOCKER_HOST": docker_sock}
    )
    return AgentPreflightInputs(config=overrides.pop("config", CLAUDE), env=env, **overrides)


def locations(problems: list[Any]) -> list[str]:
    return sorted(p.location for p in problems)


def no_secret(problems: list[Any]) -> None:
    text = " ".join(f"{p} {p!r}" for p in problems)
    assert SECRET not in text
    assert BYOK_SECRET not in text


def test_good_claude_inputs_pass(docker_sock):
    assert agent_static_problems(inputs(docker_sock)) == []


def test_disabled_checks_nothing(docker_sock):
    assert agent_static_problems(inputs(docker_sock, config=BoundedAgentsConfig(), env={})) == []


@pytest.mark.parametrize("engine", ["codex", "gemini"])
def test_engines_without_an_adapter_fail_closed(docker_sock, engine):
    config = dataclasses.replace(CLAUDE, engine=engine)
    env = {
        "DOCKER_HOST": docker_sock,
        "GH_TOKEN": "t",
        **{name: SECRET for name in policy.AGENT_CREDENTIAL_VARIABLES[engine][-1:]},
    }
    problems = agent_static_problems(inputs(docker_sock, config=config, env=env))
    assert locations(problems) == ["boundedAgents.engine"]
    assert "no enclave adapter and image yet; it fails closed" in problems[0].message
    assert problems[0].hint == 'use "claude", "copilot"'
    no_secret(problems)


@pytest.mark.parametrize("value", [None, "", "   "])
def test_the_provider_credential_must_be_in_the_environment(docker_sock, value):
    env = {"GH_TOKEN": "t", "DOCKER_HOST": docker_sock}
    if value is not None:
        env["ANTHROPIC_API_KEY"] = value
    problems = agent_static_problems(inputs(docker_sock, env=env))
    assert locations(problems) == ["ANTHROPIC_API_KEY"]
    assert "export ANTHROPIC_API_KEY" in problems[0].hint


def test_copilot_byok_needs_an_openai_type_and_a_v1_base_url(docker_sock):
    config = dataclasses.replace(CLAUDE, engine="copilot")
    env = {"GH_TOKEN": "t", "DOCKER_HOST": docker_sock, "COPILOT_PROVIDER_API_KEY": BYOK_SECRET}
    problems = agent_static_problems(inputs(docker_sock, config=config, env=env))
    assert locations(problems) == ["COPILOT_PROVIDER_BASE_URL", "COPILOT_PROVIDER_TYPE"]
    no_secret(problems)
    env |= {"COPILOT_PROVIDER_TYPE": "openai", "COPILOT_PROVIDER_BASE_URL": "http://gw:8080/v1"}
    problems = agent_static_problems(inputs(docker_sock, config=config, env=env))
    assert locations(problems) == ["COPILOT_PROVIDER_BASE_URL"]
    insecure = next(p for p in problems if p.location == "COPILOT_PROVIDER_BASE_URL")
    assert "--allow-insecure-api-target" in insecure.hint
    allowed = inputs(docker_sock, config=config, env=env, allow_insecure_api_target=True)
    assert locations(agent_static_problems(allowed)) == []
    assert credential_variable("copilot", env) == "COPILOT_PROVIDER_API_KEY"
    assert agent_api_target(config, env) == ApiTarget("http", "gw", 8080, "")
    env["COPILOT_PROVIDER_BASE_URL"] = "https://gw.example/openai/v1"
    assert copilot_byok_target(env) == ApiTarget("https", "gw.example", 443, "/openai")
    for bad in ("https://gw.example", "gw.example/v1", "https://gw.example/v1/", "https://U@g/v1"):
        with pytest.raises(ValueError, match=r"COPILOT_PROVIDER_BASE_URL|host"):
            copilot_byok_target({"COPILOT_PROVIDER_BASE_URL": bad})


def test_copilot_github_token_route_uses_the_configured_target(docker_sock):
    config = dataclasses.replace(
        CLAUDE, engine="copilot", target=ApiTarget("https", "api.githubcopilot.com", 443, "")
    )
    env = {"GH_TOKEN": "t", "DOCKER_HOST": docker_sock, "COPILOT_GITHUB_TOKEN": SECRET}
    problems = agent_static_problems(inputs(docker_sock, config=config, env=env))
    assert locations(problems) == []
    assert credential_variable("copilot", env) == "COPILOT_GITHUB_TOKEN"
    assert agent_api_target(config, env) == config.target


def test_a_plain_http_target_needs_the_flag(docker_sock):
    config = dataclasses.replace(CLAUDE, target=ApiTarget("http", "127.0.0.1", 8080, ""))
    problems = agent_static_problems(inputs(docker_sock, config=config))
    assert locations(problems) == ["apiProxy.targets.anthropic.host"]
    assert "clear text" in problems[0].message
    allowed = inputs(docker_sock, config=config, allow_insecure_api_target=True)
    assert agent_static_problems(allowed) == []


def test_the_staging_credential_is_needed_for_cloned_repositories(docker_sock):
    env = {"ANTHROPIC_API_KEY": SECRET, "DOCKER_HOST": docker_sock, "GITHUB_TOKEN": " "}
    problems = agent_static_problems(inputs(docker_sock, env=env))
    assert locations(problems) == ["GH_TOKEN/GITHUB_TOKEN"]
    assert "octo/alpha" in problems[0].message
    sourced = inputs(docker_sock, env=env, seed_sources={"octo/alpha": Path("/")})
    assert agent_static_problems(sourced) == []
    env |= {"GH_TOKEN": "t", "GITHUB_SERVER_URL": "http://git.example"}
    assert locations(agent_static_problems(inputs(docker_sock, env=env))) == ["GITHUB_SERVER_URL"]


def test_the_docker_host_must_be_a_unix_socket(docker_sock, tmp_path):
    for host in ("tcp://127.0.0.1:2375", f"unix://{tmp_path}/missing.sock"):
        env = {"ANTHROPIC_API_KEY": SECRET, "GH_TOKEN": "t", "DOCKER_HOST": host}
        assert locations(agent_static_problems(inputs(docker_sock, env=env))) == ["DOCKER_HOST"]


def test_missing_repositories_and_model_are_refused(docker_sock):
    config = dataclasses.replace(CLAUDE, private_repos=(), model="")
    problems = agent_static_problems(inputs(docker_sock, config=config))
    assert locations(problems) == ["boundedAgents.model", "boundedAgents.privateRepos"]


@pytest.mark.parametrize("name", ["egress", "my-net.1", "a", "A_b-c", "x" * 63])
def test_egress_network_names_accepted(name):
    assert validate_network_name(name) == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "-x",
        ".x",
        "a b",
        "a/b",
        "x" * 64,
        "host",
        "none",
        "container:abc",
        "a\n",
        "awf-bounded-agent-1",
    ],
)
def test_egress_network_names_refused(docker_sock, name):
    with pytest.raises(ValueError, match="--api-proxy-egress-network"):
        validate_network_name(name)
    problems = agent_static_problems(inputs(docker_sock, egress_network=name))
    assert locations(problems) == ["--api-proxy-egress-network"]


# ------------------------------------------------------------------------ sbx


def _report_of(problem: Any) -> dict[str, Any]:
    text = problem.message
    return json.loads(text[text.index("{") :])


def test_sbx_is_refused_with_a_structured_per_capability_report(docker_sock):
    config = dataclasses.replace(CLAUDE, runtime="sbx")
    audited = SbxObservation("/usr/bin/sbx", "sbx version 0.37.1")
    for observation in (SbxObservation(), audited):
        problems = agent_static_problems(inputs(docker_sock, config=config, sbx=observation))
        assert locations(problems) == ["boundedAgents.runtime"]
        report = _report_of(problems[0])
        assert report == enclave_sbx_report(observation)
        assert report["supported"] is False
        assert report["fallback"] == "never"
        assert report["subsystem"] == policy.SUBSYSTEM_AGENT
        assert isinstance(report["capabilities"], list)
        assert len(report["capabilities"]) > 1
        for entry in report["capabilities"]:
            assert set(entry) == {"capability", "required", "available", "detail"}
            assert isinstance(entry["available"], bool)
        assert "api-proxy-only-network" in report["missing"]
        assert report["missing"] == [
            c["capability"] for c in report["capabilities"] if not c["available"]
        ]
        assert report["installed"]["version"] == observation.version
        assert "never falls back" in problems[0].hint


def _fake_sbx(tmp_path: Path, script: str) -> str:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "sbx"
    tool.write_text("#!/bin/sh\n" + script)
    tool.chmod(stat.S_IRWXU)
    return str(bindir)


def test_observe_sbx_only_asks_the_version(tmp_path):
    assert observe_sbx(str(tmp_path)) == SbxObservation()
    log = tmp_path / "argv"
    path = _fake_sbx(tmp_path, f'echo "$@" >> {log}\necho "sbx version 0.37.1"\n')
    seen = observe_sbx(path)
    assert seen == SbxObservation(str(Path(path) / "sbx"), "sbx version 0.37.1")
    assert log.read_text() == "version\n"
    assert enclave_sbx_report(seen)["supported"] is False


def test_observe_sbx_records_a_failing_binary(tmp_path):
    seen = observe_sbx(_fake_sbx(tmp_path, "echo broken\nexit 3\n"))
    assert (seen.version, seen.error) == ("broken", "exit status 3")


async def test_sbx_preflight_probes_nothing_but_the_version(docker_sock, tmp_path, monkeypatch):
    """Refused before the engine: an unreachable Docker host is not even looked at."""
    monkeypatch.setenv("PATH", _fake_sbx(tmp_path, 'echo "sbx version 0.37.1"\n'))
    config = dataclasses.replace(CLAUDE, runtime="sbx")
    problems = await agent_preflight(inputs(docker_sock, config=config), "unix:///nope", RUN_ID)
    assert locations(problems) == ["boundedAgents.runtime"]
    assert _report_of(problems[0])["installed"]["version"] == "sbx version 0.37.1"


# ----------------------------------------------------------------- the images


def test_enclave_image_labels_are_checked():
    recipe = enclave_recipe()
    image = policy.ENCLAVE_IMAGES["claude"]
    good = {
        policy.LABEL_IMAGE_ENGINE: "claude",
        policy.LABEL_IMAGE_ENGINE_VERSION: policy.ENCLAVE_ENGINE_VERSIONS["claude"],
        policy.LABEL_IMAGE_RECIPE: recipe,
    }
    assert enclave_image_problems("claude", image, good, recipe) == []
    missing = enclave_image_problems("claude", image, None, recipe)
    assert [p.location for p in missing] == ["enclave image"]
    assert "nothing can be pulled" in missing[0].message
    assert "enclave_image/build.sh claude" in missing[0].hint
    for key, value in (
        (policy.LABEL_IMAGE_ENGINE, "copilot"),
        (policy.LABEL_IMAGE_ENGINE_VERSION, "0.0.1"),
        (policy.LABEL_IMAGE_RECIPE, "0" * 64),
    ):
        stale = enclave_image_problems("claude", image, {**good, key: value}, recipe)
        assert len(stale) == 1
        assert key in stale[0].message
        assert stale[0].hint.startswith("rebuild it")
        short = {k: v for k, v in good.items() if k != key}
        assert len(enclave_image_problems("claude", image, short, recipe)) == 1


async def test_a_static_problem_skips_the_engine(docker_sock):
    env = {"GH_TOKEN": "t", "DOCKER_HOST": docker_sock}
    problems = await agent_preflight(inputs(docker_sock, env=env), "unix:///nope", RUN_ID)
    assert locations(problems) == ["ANTHROPIC_API_KEY"]


async def test_an_unreachable_engine_is_refused(tmp_path):
    problems = await agent_runtime_problems(CLAUDE, f"unix://{tmp_path}/no.sock", RUN_ID)
    assert locations(problems) == ["DOCKER_HOST"]


# ------------------------------------------------------- against the real engine

ENGINE_HOST = "unix:///var/run/docker.sock"


def _probe_leftovers(client: Any, run_id: str) -> list[Any]:
    return client.containers.list(
        all=True, filters={"label": [f"{policy.LABEL_AGENT_RUN}={run_id}"]}
    )


@pytest.mark.engine
async def test_claude_on_docker_passes_against_the_real_engine(docker_client):
    problems = await agent_runtime_problems(CLAUDE, ENGINE_HOST, RUN_ID)
    assert problems == []


@pytest.mark.engine
async def test_gvisor_is_refused_where_runsc_cannot_network(docker_client):
    """This machine's runsc cannot start a networked container: a refusal, never runc.

    (tests/enclave/conftest.py: dockerd 20.10 with Debian's runsc refuses any
    networked container.) When a runsc that can network arrives, this test
    fails: then assert the probe passes instead.
    """
    run_id = secrets.token_hex(16)
    config = dataclasses.replace(CLAUDE, runtime="gvisor")
    problems = await agent_runtime_problems(config, ENGINE_HOST, run_id)
    assert locations(problems) == ["boundedAgents.runtime"]
    assert "never falls back to runc" in problems[0].message
    assert "runsc-net" in problems[0].message
    # The probe carried the run label: nothing of it is left.
    assert _probe_leftovers(docker_client, run_id) == []
    assert (
        docker_client.containers.list(
            all=True, filters={"label": [f"{policy.LABEL_ROLE}={PROBE_ROLE}"]}
        )
        == []
    )


@pytest.mark.engine
async def test_the_egress_network_must_exist_and_not_be_internal(docker_client):
    missing = f"bq-agent-harness-test-{secrets.token_hex(4)}"
    problems = await agent_runtime_problems(CLAUDE, ENGINE_HOST, RUN_ID, egress_network=missing)
    assert locations(problems) == ["--api-proxy-egress-network"]
    assert "does not exist" in problems[0].message
    network = docker_client.networks.create(
        missing, driver="bridge", internal=True, labels={"bq-test": "agent-harness"}
    )
    try:
        problems = await agent_runtime_problems(CLAUDE, ENGINE_HOST, RUN_ID, egress_network=missing)
        assert "is internal" in problems[0].message
    finally:
        network.remove()
    bridge = await agent_runtime_problems(CLAUDE, ENGINE_HOST, RUN_ID, egress_network="bridge")
    assert bridge == []


@pytest.mark.engine
async def test_preflight_refusals_stage_nothing(docker_client, tmp_path, docker_sock):
    """Every refusal leaves no file and no container behind (the run never started)."""
    before = sorted(os.listdir(tmp_path))
    run_id = secrets.token_hex(16)
    env = {"ANTHROPIC_API_KEY": SECRET, "GH_TOKEN": "t", "DOCKER_HOST": ENGINE_HOST}
    cases = [
        dataclasses.replace(CLAUDE, runtime="gvisor"),
        dataclasses.replace(CLAUDE, runtime="sbx"),
        dataclasses.replace(CLAUDE, engine="codex"),
    ]
    for config in cases:
        problems = await agent_preflight(
            AgentPreflightInputs(config=config, env=env), ENGINE_HOST, run_id
        )
        assert problems, config
        no_secret(problems)
    assert sorted(os.listdir(tmp_path)) == before
    assert _probe_leftovers(docker_client, run_id) == []


def test_no_refusal_event_carries_a_credential(docker_sock, tmp_path):
    """Every refusal, as the operator sees it (events), names variables, never values."""
    stream = io.StringIO()
    sink = EventSink(stream)
    env = {
        "ANTHROPIC_API_KEY": SECRET,
        "COPILOT_PROVIDER_API_KEY": BYOK_SECRET,
        "COPILOT_PROVIDER_TYPE": BYOK_SECRET,
        "COPILOT_PROVIDER_BASE_URL": f"https://{BYOK_SECRET}@gw.example/v1",
        "DOCKER_HOST": docker_sock,
    }
    for config in (
        dataclasses.replace(CLAUDE, engine="copilot"),
        dataclasses.replace(CLAUDE, runtime="sbx"),
        dataclasses.replace(CLAUDE, target=ApiTarget("http", "gw", 80, "")),
        dataclasses.replace(CLAUDE, private_repos=(), model=""),
    ):
        problems = agent_static_problems(inputs(docker_sock, config=config, env=env))
        assert problems
        problems_event(sink, "preflight_error", problems)
    text = stream.getvalue()
    assert text.count("preflight_error") >= 6
    assert SECRET not in text
    assert BYOK_SECRET not in text
