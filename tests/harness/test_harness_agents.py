"""The bounded-agent subsystem's lifecycle without an engine (harness/lifecycle/agents.py).

* The plan: names derived from the run id (two runs never collide), a
  ``/28`` of the pool per run, the proxy at the subnet's second address,
  the proxy's configuration accepted by the proxy's own parser and
  listening on the enclave side only, the agent broker's document carrying
  the agents.md keys, the proxy container holding no credential anywhere
  and never the agent run label (the agent broker's reconcile would remove
  its proxy).
* The credential: taken out of the run's environment; missing is an
  operator error naming the variable; written 0400, owned by the proxy.
* Roots: the reaper's arm names both pairs, and refuses an agent pair of
  another run; the reap and the sweep remove a dead run's agent roots.
* The agent's variables: the three ``AWF_BOUNDED_AGENT_*``, and nothing
  naming the agent private root; its container mounts the agent ingress.
* A run with agents enabled whose engine cannot create the networks (the
  fake Engine API) fails closed before the agent: exit 2, nothing left,
  the credential in no event and no summary.
"""

from __future__ import annotations

import dataclasses
import io
import ipaddress
import json
import os
import secrets
import stat
from pathlib import Path

import pytest
import trio
import trio.testing

from bounded_query.broker.apiproxy import parse_config as parse_proxy_config
from bounded_query.broker.protocol.policy import (
    API_PROXY_PORT,
    ENCLAVE_API_PROXY_ALIAS,
    ENCLAVE_NETWORK,
    ENCLAVE_SUBNET_POOL,
    ENV_AGENT_REPOS,
    ENV_AGENT_SKILL,
    ENV_AGENT_SOCKET,
    LABEL_AGENT_HARNESS,
    LABEL_AGENT_RUN,
    SUBSYSTEM_AGENT,
)
from bounded_query.harness import RunOptions, run
from bounded_query.harness.agent.spec import AgentContainer, AgentUser, container_body
from bounded_query.harness.agent.supervise import agent_environment
from bounded_query.harness.configuration.agents import default_target, provider_of
from bounded_query.harness.configuration.config import (
    ApiTarget,
    BoundedAgentsConfig,
    PrivateRepo,
)
from bounded_query.harness.lifecycle import agents as agents_module
from bounded_query.harness.lifecycle import orchestrate
from bounded_query.harness.lifecycle.agents import (
    AgentSetupError,
    agent_broker_config_doc,
    candidate_subnets,
    plan_agents,
    proxy_address,
    proxy_config_doc,
    proxy_container_body,
    take_credential,
    write_proxy_files,
)
from bounded_query.harness.lifecycle.paths import agent_run_paths, run_paths
from bounded_query.harness.lifecycle.reaper import Arm, ReaperMessageError, decode_message, reap
from bounded_query.harness.lifecycle.sweep import (
    MODE_RUN,
    OwnerRecord,
    sweep_stale_roots,
    write_owner_record,
)
from bounded_query.harness.records.events import EventSink
from bounded_query.harness.staging.outputs import create_ingress_root
from bounded_query.harness.staging.seeds import create_private_root
from tests.harness.bq_harness_helpers import FAKE_BROKER, HOST_AGENT, make_repo, var_tmp_base

UID = os.getuid()
REPO_ROOT = Path(__file__).resolve().parents[2]
CREDENTIAL = "sk-ant-REAL-" + secrets.token_hex(12)
TARGET = ApiTarget("http", "provider.test", 9000, "/v1beta")
AGENTS = BoundedAgentsConfig(
    enabled=True,
    private_repos=(PrivateRepo("octo/alpha", "confidential"),),
    runtime="docker",
    engine="claude",
    model="claude-test-model",
    target=TARGET,
)


def plan_for(run_id: str, base: Path = Path("/var/tmp"), **extra):
    return plan_agents(
        AGENTS,
        run_id=run_id,
        uid=UID,
        euid=os.geteuid(),
        workspace=Path("/work/ws"),
        base=base,
        seed_sources={},
        target=TARGET,
        credential_variable="ANTHROPIC_API_KEY",
        **extra,
    )


# -- the plan ----------------------------------------------------------------


def test_two_runs_get_their_own_names_and_subnets_from_the_pool():
    one, two = plan_for(secrets.token_hex(16)), plan_for(secrets.token_hex(16))
    assert one.network.startswith(ENCLAVE_NETWORK + "-")
    for a, b in ((one.network, two.network), (one.proxy_name, two.proxy_name)):
        assert a != b
    assert one.egress_network != two.egress_network
    assert one.egress_created
    pool = ipaddress.IPv4Network(ENCLAVE_SUBNET_POOL)
    for subnet in one.subnets:
        net = ipaddress.IPv4Network(subnet)
        assert net.prefixlen == 28
        assert net.subnet_of(pool)
    assert len(set(one.subnets)) == len(one.subnets) > 1
    assert candidate_subnets(one.run_id) == one.subnets  # derived, not random
    # The agent roots are the query roots' twins (same suffix, own prefix).
    query = run_paths(UID, Path("/work/ws"), one.run_id)
    assert one.paths.private_root.name.split("-")[-2:] == query.private_root.name.split("-")[-2:]
    assert "awf-bounded-agent-private-" in one.paths.private_root.name
    assert "awf-bounded-agent-ingress-" in one.paths.ingress_root.name


def test_an_operator_egress_network_is_used_and_never_created():
    plan = plan_for(secrets.token_hex(16), egress_network="corp-egress")
    assert (plan.egress_network, plan.egress_created) == ("corp-egress", False)


def test_the_proxy_is_at_the_subnets_second_address():
    assert proxy_address("10.213.4.16/28") == "10.213.4.18"


def test_the_proxy_config_is_the_proxys_own_and_listens_on_the_enclave_side_only():
    plan = plan_for(secrets.token_hex(16))
    doc = proxy_config_doc(plan, "10.213.4.18")
    config = parse_proxy_config(json.loads(json.dumps(doc)))
    assert (config.listen_host, config.listen_port) == ("10.213.4.18", API_PROXY_PORT)
    assert config.client_hosts == frozenset({f"{ENCLAVE_API_PROXY_ALIAS}:{API_PROXY_PORT}"})
    assert config.model == AGENTS.model
    assert config.engine == "claude"
    assert config.max_model_tokens == AGENTS.max_model_tokens
    assert config.upstream.url(b"/x") == "http://provider.test:9000/v1beta/x"
    assert config.allow_insecure  # http only because the target is http
    assert CREDENTIAL not in json.dumps(doc)


def test_a_default_target_is_the_providers_https_api():
    plan = plan_agents(
        AGENTS,
        run_id=secrets.token_hex(16),
        uid=UID,
        euid=0,
        workspace=Path("/w"),
        base=Path("/var/tmp"),
        seed_sources={},
        target=default_target(provider_of("claude")),
        credential_variable="ANTHROPIC_API_KEY",
    )
    config = parse_proxy_config(proxy_config_doc(plan, "10.213.0.2"))
    assert config.upstream.scheme == "https"
    assert not config.allow_insecure


def test_an_engine_without_an_enclave_fails_closed():
    with pytest.raises(AgentSetupError, match="no enclave"):
        plan_agents(
            dataclasses.replace(AGENTS, engine="gemini"),
            run_id=secrets.token_hex(16),
            uid=UID,
            euid=0,
            workspace=Path("/w"),
            base=Path("/var/tmp"),
            seed_sources={},
            target=TARGET,
            credential_variable="GEMINI_API_KEY",
        )


def test_the_agent_broker_document_names_the_subsystem_and_the_enclave():
    plan = plan_for(secrets.token_hex(16))
    doc = agent_broker_config_doc(plan, address="10.213.4.18", docker_host="unix:///d.sock")
    assert doc["subsystem"] == SUBSYSTEM_AGENT
    enclave = doc["enclave"]
    assert isinstance(enclave, dict)
    assert set(enclave) == {
        "engine",
        "model",
        "network",
        "proxyAddress",
        "proxyPort",
        "controlSocket",
        "nanoCpus",
        "pidsLimit",
        "tmpfsBytes",
        "maxOutputBytes",
        "maxTaskBytes",
    }
    assert enclave["network"] == plan.network
    assert enclave["proxyAddress"] == "10.213.4.18"
    assert enclave["controlSocket"] == str(plan.paths.proxy_control_socket)
    assert enclave["nanoCpus"] == 1_000_000_000
    assert doc["socketPath"] == str(plan.paths.socket_path)
    assert doc["privateRoot"] == str(plan.paths.private_root)
    assert doc["image"] == "bounded-query-enclave-claude:latest"


def test_the_proxy_container_holds_no_credential_and_not_the_agent_run_label():
    plan = plan_for(secrets.token_hex(16))
    body = proxy_container_body(plan)
    text = json.dumps(body)
    assert CREDENTIAL not in text
    assert "API_KEY" not in text
    assert body["Env"] == []
    assert LABEL_AGENT_RUN not in body["Labels"]
    assert body["Labels"][LABEL_AGENT_HARNESS] == plan.run_id
    host = body["HostConfig"]
    assert host["ReadonlyRootfs"]
    assert host["CapDrop"] == ["ALL"]
    assert "no-new-privileges:true" in host["SecurityOpt"]
    mounts = {m["Target"]: m for m in host["Mounts"]}
    assert mounts["/run/bq/credential"]["ReadOnly"]
    assert mounts["/run/bq/credential"]["Source"] == str(plan.paths.proxy_credential)
    assert not mounts["/run/bq/control"]["ReadOnly"]


# -- the credential ------------------------------------------------------------


def test_the_credential_is_taken_out_of_the_environment():
    env = {"ANTHROPIC_API_KEY": CREDENTIAL, "PATH": "/bin"}
    assert take_credential(env, "ANTHROPIC_API_KEY") == CREDENTIAL.encode()
    assert env == {"PATH": "/bin"}
    with pytest.raises(AgentSetupError, match="ANTHROPIC_API_KEY is not set") as raised:
        take_credential({"ANTHROPIC_API_KEY": ""}, "ANTHROPIC_API_KEY")
    assert CREDENTIAL not in str(raised.value)


def test_the_credential_file_is_0400_and_the_proxys_directories_its_own(tmp_path):
    plan = plan_for(secrets.token_hex(16), base=tmp_path)
    plan.paths.private_root.mkdir(mode=0o700)
    write_proxy_files(plan, CREDENTIAL.encode())
    info = os.lstat(plan.paths.proxy_credential)
    assert stat.S_IMODE(info.st_mode) == 0o400
    assert plan.paths.proxy_credential.read_bytes() == CREDENTIAL.encode() + b"\n"
    assert stat.S_IMODE(os.lstat(plan.paths.proxy_dir).st_mode) == 0o700
    for directory in (plan.paths.proxy_control_dir, plan.paths.usage_dir):
        assert stat.S_IMODE(os.lstat(directory).st_mode) == 0o700
    if os.geteuid() == 0:
        assert info.st_uid == plan.proxy_user[0] != 0
        assert os.lstat(plan.paths.proxy_dir).st_uid == 0  # only the harness's user enters
    with pytest.raises(FileExistsError):  # never rewritten through a planted file
        write_proxy_files(plan, b"other")


# -- roots: the reaper and the sweep -------------------------------------------


def _roots(base: Path, run_id: str, *, agent_owner: str | None = None):
    query = run_paths(UID, Path("/work/ws"), run_id, base)
    agent = agent_run_paths(UID, Path("/work/ws"), run_id, base)
    for paths in (query, agent):
        create_private_root(paths)
        owner = run_id if paths is query or agent_owner is None else agent_owner
        record = OwnerRecord(MODE_RUN, 999_999_999, 1, "", os.readlink("/proc/self/ns/pid"), owner)
        write_owner_record(paths.private_root, record)
        create_ingress_root(paths)
        (paths.seeds_dir / "seed").mkdir()
        (paths.seeds_dir / "seed" / "secret.py").write_text("S = 1\n")
    return query, agent


def test_the_arm_names_both_pairs_and_refuses_another_runs_agent_pair(tmp_path):
    run_id = secrets.token_hex(16)
    query = run_paths(UID, Path("/w"), run_id, tmp_path)
    agent = agent_run_paths(UID, Path("/w"), run_id, tmp_path)
    arm = Arm(
        run_id,
        "unix:///d.sock",
        str(query.private_root),
        str(query.ingress_root),
        1,
        agent_private_root=str(agent.private_root),
        agent_ingress_root=str(agent.ingress_root),
    )
    assert decode_message(arm.encode()) == arm
    assert arm.all_paths == (query, agent)
    other = agent_run_paths(UID, Path("/w"), secrets.token_hex(16), tmp_path)
    for private, ingress in (
        (str(other.private_root), str(other.ingress_root)),  # another run's suffix
        (str(agent.private_root), str(query.ingress_root)),  # not a pair
        (str(query.private_root), str(query.ingress_root)),  # the query prefixes
    ):
        with pytest.raises(ReaperMessageError):
            dataclasses.replace(arm, agent_private_root=private, agent_ingress_root=ingress)
    # An older arm without the agent pair still decodes to one pair.
    plain = dataclasses.replace(arm, agent_private_root="", agent_ingress_root="")
    decoded = decode_message(plain.encode())
    assert isinstance(decoded, Arm)
    assert decoded.all_paths == (query,)


def test_the_reap_removes_the_agent_roots_of_its_run_only():
    run_id = secrets.token_hex(16)
    with var_tmp_base() as base:
        query, agent = _roots(base, run_id)
        arm = Arm(
            run_id,
            "tcp://engine:2375",
            str(query.private_root),
            str(query.ingress_root),
            0,
            agent_private_root=str(agent.private_root),
            agent_ingress_root=str(agent.ingress_root),
        )
        reaped = reap(arm, {}, engine=lambda *_: 0, settle_s=0.0, session=None)
        assert reaped.roots == "removed"
        assert sorted(os.listdir(base)) == []
        # An agent root whose record names another run is kept, and said so.
        run_id = secrets.token_hex(16)
        query, agent = _roots(base, run_id, agent_owner=secrets.token_hex(16))
        reaped = reap(
            dataclasses.replace(
                arm,
                run_id=run_id,
                private_root=str(query.private_root),
                ingress_root=str(query.ingress_root),
                agent_private_root=str(agent.private_root),
                agent_ingress_root=str(agent.ingress_root),
            ),
            {},
            engine=lambda *_: 0,
            settle_s=0.0,
        )
        assert reaped.roots == "not-this-run"
        assert not query.private_root.exists()
        assert agent.private_root.exists()


def test_the_sweep_removes_a_dead_runs_agent_roots_and_reconciles_its_run():
    run_id = secrets.token_hex(16)
    reconciled: list[str] = []
    with var_tmp_base() as base:
        _roots(base, run_id)
        sink = EventSink(io.StringIO())
        result = sweep_stale_roots(base, UID, sink, reconciled.append)
        assert result.removed == 2
        assert os.listdir(base) == []
    assert reconciled == [run_id, run_id]


# -- the agent's variables -----------------------------------------------------


def test_the_agent_gets_the_three_agent_variables_and_nothing_naming_its_private_root():
    run_id = secrets.token_hex(16)
    query = run_paths(UID, Path("/w"), run_id)
    agent = agent_run_paths(UID, Path("/w"), run_id)
    from bounded_query.harness.configuration.config import BoundedQueriesConfig

    config = BoundedQueriesConfig(enabled=True, private_repos=(PrivateRepo("octo/q", "internal"),))
    env = {"PATH": "/usr/bin", "LEAK": str(agent.private_root / "seeds"), "KEEP": "yes"}
    out = agent_environment(env, query, config, agents=(agent, ("octo/alpha", "octo/beta")))
    assert out[ENV_AGENT_SOCKET] == str(agent.socket_path)
    assert out[ENV_AGENT_SKILL] == str(agent.skill_file)
    assert out[ENV_AGENT_REPOS] == "octo/alpha,octo/beta"
    # bounded-agent first on PATH (its MCP server serves both tools), then bounded-query
    assert out["PATH"].split(":")[:3] == [
        str(agent.wrapper_dir),
        str(query.wrapper_dir),
        "/usr/bin",
    ]
    assert "LEAK" not in out
    assert out["KEEP"] == "yes"
    without = agent_environment(env, query, config)
    assert ENV_AGENT_SOCKET not in without
    body = container_body(
        AgentContainer(
            image="img",
            argv=("true",),
            workspace="/w",
            socket_dir=str(query.socket_dir),
            skill_dir=str(query.skill_dir),
            env=out,
            user=AgentUser(20000, 20000),
            run_id=run_id,
            owner="{}",
            extra_mounts=((str(agent.socket_dir), False), (str(agent.skill_dir), True)),
        )
    )
    mounts = {m["Target"]: m["ReadOnly"] for m in body["HostConfig"]["Mounts"]}  # type: ignore[index]
    assert mounts[str(agent.socket_dir)] is False
    assert mounts[str(agent.skill_dir)] is True
    assert not any(str(agent.private_root) in target for target in mounts)


# -- a run that cannot set the subsystem up fails closed -----------------------


def _with_agents(agents: BoundedAgentsConfig):
    """``load_reported`` with the normalized ``boundedAgents`` value (the section's
    parsing is agent-harness's: this gives the lifecycle the value it consumes)."""
    original = orchestrate.load_reported  # type: ignore[attr-defined]

    def load(*args, **kwargs):
        loaded = original(*args, **kwargs)
        return None if loaded is None else dataclasses.replace(loaded, agents=agents)

    return load


async def test_a_run_whose_engine_refuses_the_networks_exits_2_before_the_agent(
    tmp_path, fake_engine, monkeypatch
):
    monkeypatch.setattr(orchestrate, "load_reported", _with_agents(AGENTS))
    source = tmp_path / "src"
    make_repo(source, {"README.md": "hi\n"})
    config = tmp_path / "c.json"
    config.write_text(
        json.dumps(
            {
                "boundedQueries": {
                    "enabled": True,
                    "privateRepos": [{"repo": "octo/alpha", "sensitivity": "internal"}],
                }
            }
        )
    )
    marker = tmp_path / "agent-ran"
    summary = tmp_path / "summary.md"
    stream = io.StringIO()
    with var_tmp_base() as base:
        options = RunOptions(
            config_source=str(config),
            agent=("touch", str(marker)),
            seed_sources={"octo/alpha": source},
            workspace=tmp_path,
            base=base,
            broker_command=FAKE_BROKER,
            probe_runtime=False,
            allow_insecure_api_target=True,  # the test target is http
            **HOST_AGENT,
        )
        env = {
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(REPO_ROOT),
            "DOCKER_HOST": fake_engine.docker_host,
            "ANTHROPIC_API_KEY": CREDENTIAL,
            "GITHUB_STEP_SUMMARY": str(summary),
        }
        status = await run(options, EventSink(stream), env)
        assert os.listdir(base) == []
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert status == 2, events
    assert not marker.exists()
    failed = next((e for e in events if e["event"] == "agent_setup_failed"), None)
    assert failed is not None, [e for e in events if "fail" in e["event"] or "error" in e["event"]]
    assert failed["subsystem"] == SUBSYSTEM_AGENT
    staged = [e for e in events if e["event"] == "repo_staged"]
    assert [e["subsystem"] for e in staged] == ["bounded-query", "bounded-agent"]
    assert [e for e in events if e["event"] == "roots_removed"][-1]["subsystem"] == SUBSYSTEM_AGENT
    assert CREDENTIAL not in stream.getvalue()
    assert CREDENTIAL not in summary.read_text()
    # The teardown's reconcile asked for the agent labels and the harness's networks.
    listed = [label for labels in fake_engine.listed_labels("containers") for label in labels]
    assert any(label.startswith(LABEL_AGENT_RUN + "=") for label in listed)
    assert fake_engine.listed_labels("networks")


async def test_a_run_without_the_credential_is_refused_before_staging(
    tmp_path, fake_engine, monkeypatch
):
    monkeypatch.setattr(orchestrate, "load_reported", _with_agents(AGENTS))
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"boundedQueries": {"enabled": True, "privateRepos": []}}))
    stream = io.StringIO()
    with var_tmp_base() as base:
        options = RunOptions(
            config_source=str(config),
            agent=("true",),
            workspace=tmp_path,
            base=base,
            broker_command=FAKE_BROKER,
            probe_runtime=False,
            allow_insecure_api_target=True,  # the test target is http
            **HOST_AGENT,
        )
        env = {"PATH": os.environ["PATH"], "DOCKER_HOST": fake_engine.docker_host}
        status = await run(options, EventSink(stream), env)
        assert os.listdir(base) == []
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert status == 2
    problems = [e for e in events if e["event"] == "preflight_error"]
    assert any("ANTHROPIC_API_KEY" in json.dumps(problem) for problem in problems), problems
    assert not [e for e in events if e["event"] == "staging_started"]


def test_the_module_keeps_the_engine_out_of_its_pure_half():
    source = Path(agents_module.__file__).read_text()
    head = source.split("# -- the shell (blocking)")[0]
    assert "import docker" not in head
    assert "import trio" not in head
    assert trio  # the run tests above are trio tests


# -- records: the relay, --keep-state and report -------------------------------


def _fill_state(paths, repos) -> None:
    from tests.harness.test_harness_summary import audit_bytes, journal_bytes

    for directory in (paths.journal.parent, paths.audit_log.parent, paths.usage_dir):
        directory.mkdir(parents=True, exist_ok=True)
    paths.journal.write_bytes(journal_bytes())
    paths.audit_log.write_bytes(audit_bytes())
    paths.broker_config.write_text(json.dumps({"version": 1, "runtime": "docker"}))
    doc = {
        "version": 1,
        "repos": [
            {"repo": r, "seedId": f"s{i}", "sensitivity": s, "commit": "0" * 40}
            for i, (r, s) in enumerate(repos)
        ],
    }
    paths.seed_map.write_text(json.dumps(doc))


def test_keep_state_and_report_cover_the_agent_subsystem_but_never_its_credential(tmp_path):
    import jsonschema

    from bounded_query.harness.records.events import schema_path
    from bounded_query.harness.records.report import (
        REPORT_SCHEMA,
        keep_agent_state,
        keep_state,
        load_state,
        report_document,
        report_markdown,
    )
    from tests.harness.test_harness_summary import REPOS

    run_id = secrets.token_hex(16)
    query = run_paths(UID, Path("/w"), run_id, tmp_path / "roots")
    agent = agent_run_paths(UID, Path("/w"), run_id, tmp_path / "roots")
    _fill_state(query, REPOS)
    _fill_state(agent, REPOS)
    agent.usage_log.write_text('{"category": "forwarded"}\n{"category": "refused"}\n')
    agent.proxy_credential.write_text(CREDENTIAL)
    kept = tmp_path / "kept"
    copied = keep_state(query, kept)
    copied += [f"bounded-agent/{name}" for name in keep_agent_state(agent, kept / "bounded-agent")]
    assert "bounded-agent/proxy/usage/usage.jsonl" in copied
    assert "bounded-agent/audit/audit.jsonl" in copied
    assert not [name for name in copied if "credential" in name]
    for _dirpath, _dirs, files in os.walk(kept):
        for name in files:
            assert CREDENTIAL.encode() not in (Path(_dirpath) / name).read_bytes()
    state = load_state(kept)
    assert state.agents is not None
    assert state.agents.usage_records == 2
    text = report_markdown(state)
    assert "### Bounded queries — runtime `docker`, from the kept state" in text
    assert "### Bounded agents — runtime `docker`, from the kept state" in text
    assert "API proxy usage records: 2." in text
    doc = report_document(state)
    schema = json.loads(schema_path(REPORT_SCHEMA).read_text(encoding="utf-8"))
    jsonschema.validate(doc, schema)
    assert doc["boundedAgents"]["usageRecords"] == 2
    assert doc["boundedAgents"]["repos"] == doc["repos"]  # the same fixture on both ledgers
    # A crashed run's query root finds its sibling agent root.
    assert load_state(query.private_root).agents is not None
    assert "boundedAgents" not in report_document(load_state(kept, with_agents=False))


async def test_the_agent_brokers_lines_are_relayed_naming_the_subsystem():
    from bounded_query.harness.lifecycle.broker_log import relay_broker_log

    send, receive = trio.testing.memory_stream_one_way_pair()
    stream = io.StringIO()
    sink = EventSink(stream)
    await send.send_all(b'{"event": "broker-ready", "subsystem": "forged"}\nnot json\n')
    await send.aclose()
    await relay_broker_log(receive, sink, SUBSYSTEM_AGENT)
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [r["event"] for r in records] == ["broker-ready", "broker-line-unparsed"]
    assert [r["subsystem"] for r in records] == [SUBSYSTEM_AGENT] * 2


async def test_compose_refuses_an_enabled_agents_section_before_staging(tmp_path):
    from bounded_query.harness.configuration.config import BoundedQueriesConfig, LoadedConfig
    from bounded_query.harness.lifecycle.prepare import prepare

    loaded = LoadedConfig(
        BoundedQueriesConfig(enabled=True, private_repos=(PrivateRepo("octo/q", "internal"),)),
        (),
        "test",
        agents=AGENTS,
    )
    stream = io.StringIO()
    with var_tmp_base() as base:
        options = RunOptions(config_source="-", agent=("true",), workspace=tmp_path, base=base)
        env = {"PATH": os.environ["PATH"]}
        assert await prepare(options, loaded, env, EventSink(stream)) is None
        assert os.listdir(base) == []
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [e["event"] for e in events] == ["preflight_error", "preflight_failed"]
    assert "compose" in json.dumps(events[0])


async def test_agents_without_queries_are_refused_not_dropped(tmp_path, fake_engine, monkeypatch):
    monkeypatch.setattr(orchestrate, "load_reported", _with_agents(AGENTS))
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"boundedQueries": {"enabled": False}}))
    marker = tmp_path / "agent-ran"
    stream = io.StringIO()
    with var_tmp_base() as base:
        options = RunOptions(
            config_source=str(config),
            agent=("touch", str(marker)),
            workspace=tmp_path,
            base=base,
            broker_command=FAKE_BROKER,
            probe_runtime=False,
            allow_insecure_api_target=True,  # the test target is http
            **HOST_AGENT,
        )
        env = {"PATH": os.environ["PATH"], "ANTHROPIC_API_KEY": CREDENTIAL}
        status = await run(options, EventSink(stream), env)
        assert os.listdir(base) == []
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert status == 2
    assert not marker.exists()
    assert "boundedQueries" in json.dumps([e for e in events if e["event"] == "preflight_error"])
    assert CREDENTIAL not in stream.getvalue()


async def test_a_host_agent_user_is_checked_against_the_agent_root_and_broker_too(
    tmp_path, monkeypatch
):
    from bounded_query.harness.agent import supervise
    from bounded_query.harness.configuration.config import BoundedQueriesConfig, Problem

    checks: list = []

    def host_agent_problems(check):  # a fake probe: the agent root's check fails
        checks.append(check)
        if check.private_root.name.startswith("awf-bounded-agent-private-"):
            return [Problem("--agent-user", "can traverse the private root", "fix")]
        return []

    monkeypatch.setattr(supervise, "host_agent_problems", host_agent_problems)
    run_id = secrets.token_hex(16)
    query = run_paths(UID, tmp_path, run_id, tmp_path)
    agent = agent_run_paths(UID, tmp_path, run_id, tmp_path)
    marker = tmp_path / "agent-ran"
    options = RunOptions(
        config_source="-",
        agent=("touch", str(marker)),
        workspace=tmp_path,
        agent_on_host=True,
        agent_user=AgentUser(20005, 20005),
    )
    stream = io.StringIO()
    status = await supervise.run_confined_agent(
        options,
        {"PATH": os.environ["PATH"]},
        supervise.Supervision(),
        options.agent_user,
        EventSink(stream),
        paths=query,
        config=BoundedQueriesConfig(enabled=True),
        run_id=run_id,
        docker_host="unix:///nonexistent.sock",
        broker_pid=4321,
        agents=(agent, ("octo/alpha",)),
        agent_broker_pid=1234,
    )
    assert status == 2
    assert not marker.exists()
    query_check, agent_check = checks
    assert query_check.private_root == query.private_root
    assert query_check.pids == (os.getpid(), 4321)
    assert (agent_check.private_root, agent_check.journal) == (agent.private_root, agent.journal)
    assert agent_check.socket_path == agent.socket_path
    assert agent_check.pids == (1234,)
