"""The enclave runner's pure plan: settings, workspace files, topology verdicts, exit states."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from bounded_query.broker.agent_payload import AgentPayload
from bounded_query.broker.protocol import policy
from bounded_query.broker.runner import (
    FAILURE_CATEGORIES,
    EnclaveOptions,
    RunnerSettings,
    RunnerUnavailable,
)
from bounded_query.sandbox import create_enclave_runner
from bounded_query.sandbox.enclave_plan import (
    INHIBIT_IPV4_OPTION,
    ExpectedTopology,
    enclave_settings,
    exit_failure,
    probe_body,
    topology_verdict,
    workspace_files,
)
from bounded_query.sandbox.enclave_runner import EnclaveRunner
from bounded_query.sandbox.enclave_spec import (
    RESOLV_CONF,
    WORKSPACE_FILES,
    engine_file_contents,
    hosts_file,
)

RUN_ID = "0123456789abcdef" * 2
SETTINGS = RunnerSettings(
    runtime="docker",
    run_id=RUN_ID,
    image=policy.ENCLAVE_IMAGES["claude"],
    timeout_s=120,
    memory_bytes=512 * 1024**2,
)
OPTIONS = EnclaveOptions(
    engine="claude",
    model="claude-model-x",
    network="awf-bounded-agent-test",
    proxy_address="10.77.1.2",
    proxy_port=8080,
    control_socket=Path("/run/control/control.sock"),
    nano_cpus=1_000_000_000,
    pids_limit=policy.ENCLAVE_PIDS_LIMIT,
    tmpfs_bytes=policy.ENCLAVE_TMPFS_BYTES,
    max_output_bytes=policy.ENCLAVE_MAX_OUTPUT_BYTES,
    max_task_bytes=policy.DEFAULT_AGENT_MAX_TASK_BYTES,
)
PROXY_ID = "p" * 64
NETWORK_ID = "n" * 64


def test_settings_come_from_the_runner_settings_and_the_options() -> None:
    enclave = enclave_settings(SETTINGS, OPTIONS, 4)
    assert (enclave.runtime, enclave.run_id, enclave.image) == ("docker", RUN_ID, SETTINGS.image)
    assert (enclave.engine, enclave.model, enclave.network) == (
        "claude",
        "claude-model-x",
        OPTIONS.network,
    )
    assert (enclave.proxy_address, enclave.proxy_port) == ("10.77.1.2", 8080)
    assert enclave.memory_bytes == SETTINGS.memory_bytes
    assert (enclave.nano_cpus, enclave.pids_limit, enclave.tmpfs_bytes) == (
        OPTIONS.nano_cpus,
        OPTIONS.pids_limit,
        OPTIONS.tmpfs_bytes,
    )
    assert enclave.host_cpus == 4


def test_a_malformed_run_id_is_refused() -> None:
    with pytest.raises(ValueError, match="run id"):
        enclave_settings(RunnerSettings("docker", "XYZ", "img", 10, 512 * 1024**2), OPTIONS, None)


def _options(**changes: Any) -> EnclaveOptions:
    values = {name: getattr(OPTIONS, name) for name in EnclaveOptions.__slots__}
    values.update(changes)
    return EnclaveOptions(**values)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"proxy_address": "awf-api-proxy"}, "IPv4"),
        ({"model": "--dangerously-skip"}, "plain name"),
        ({"tmpfs_bytes": 1024**3}, "tmpfs_bytes"),
        ({"pids_limit": 0}, "pids_limit"),
    ],
)
def test_options_an_enclave_cannot_have_are_refused(changes, match) -> None:
    with pytest.raises(ValueError, match=match):
        EnclaveRunner(SETTINGS, _options(**changes))


def test_the_factory_blocks_sbx_and_engines_without_an_adapter() -> None:
    with pytest.raises(RunnerUnavailable, match="sbx"):
        create_enclave_runner(RunnerSettings("sbx", RUN_ID, "img", 10, 512 * 1024**2), OPTIONS)
    with pytest.raises(RunnerUnavailable, match="gemini"):
        create_enclave_runner(SETTINGS, _options(engine="gemini"))
    with pytest.raises(ValueError, match="unknown enclave runtime"):
        create_enclave_runner(RunnerSettings("podman", RUN_ID, "img", 10, 2**29), OPTIONS)
    assert isinstance(create_enclave_runner(SETTINGS, OPTIONS), EnclaveRunner)


def test_workspace_files_are_exactly_the_spec_files() -> None:
    enclave = enclave_settings(SETTINGS, OPTIONS, None)
    payload = AgentPayload(task="Is there a ünicode README?\n", schema='{"type":"boolean"}')
    files = workspace_files(enclave, payload)
    assert [f.name for f in files] == list(WORKSPACE_FILES)
    # copilot's enclave adds its constant /proc/stat, the same bytes every time
    copilot = enclave_settings(SETTINGS, _options(engine="copilot"), None)
    extra = {f.name: f for f in workspace_files(copilot, payload)}
    assert set(extra) - set(WORKSPACE_FILES) == {"proc-stat"}
    assert extra["proc-stat"].data == engine_file_contents("copilot")["proc-stat"]
    assert extra["proc-stat"].mode == 0o444
    by_name = {f.name: f for f in files}
    assert by_name["task.txt"].data == "Is there a ünicode README?\n".encode()
    assert by_name["schema.json"].data == b'{"type":"boolean"}'
    assert by_name["hosts"].data == hosts_file(enclave).encode()
    assert by_name["resolv.conf"].data == RESOLV_CONF.encode()
    result = by_name["result.json"]
    assert (result.data, result.mode, result.enclave_owned) == (b"", 0o600, True)
    for name in ("task.txt", "schema.json", "hosts", "resolv.conf"):
        assert (by_name[name].mode, by_name[name].enclave_owned) == (0o444, False)


def _network(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "Name": OPTIONS.network,
        "Id": NETWORK_ID,
        "Driver": "bridge",
        "Internal": True,
        "EnableIPv6": False,
        "Options": {INHIBIT_IPV4_OPTION: "true", "com.docker.network.bridge.enable_icc": "true"},
        "Containers": {
            PROXY_ID: {"Name": "proxy", "IPv4Address": "10.77.1.2/24", "IPv6Address": ""}
        },
    }
    doc.update(changes)
    return doc


PINNED = ExpectedTopology(OPTIONS.network, OPTIONS.proxy_address, NETWORK_ID, PROXY_ID)
UNPINNED = ExpectedTopology(OPTIONS.network, OPTIONS.proxy_address)


def test_the_network_as_set_up_is_accepted_and_pinned() -> None:
    verdict = topology_verdict(_network(), UNPINNED)
    assert (verdict.ok, verdict.network_id, verdict.proxy_id) == (True, NETWORK_ID, PROXY_ID)
    assert topology_verdict(_network(), PINNED).ok


def _with_member(ident: str, address: str) -> dict[str, Any]:
    doc = _network()
    doc["Containers"] = copy.deepcopy(doc["Containers"])
    doc["Containers"][ident] = {"Name": "x", "IPv4Address": address, "IPv6Address": ""}
    return doc


MISMATCHES = [
    ("not a document", [], "not a network document"),
    ("another name", _network(Name="bridge"), "instead of"),
    ("no id", _network(Id=""), "no id"),
    ("replaced", _network(Id="m" * 64), "replaced"),
    ("not bridge", _network(Driver="macvlan"), "driver"),
    ("not internal", _network(Internal=False), "not internal"),
    ("internal missing", {k: v for k, v in _network().items() if k != "Internal"}, "internal"),
    ("ipv6", _network(EnableIPv6=True), "IPv6"),
    ("bridge address", _network(Options={}), "IPv4 address"),
    ("bridge address false", _network(Options={INHIBIT_IPV4_OPTION: "false"}), "IPv4 address"),
    ("no member list", _network(Containers=None), "no members"),
    ("proxy gone", _network(Containers={}), "no container at the API proxy's address"),
    (
        "proxy moved",
        _network(Containers={PROXY_ID: {"IPv4Address": "10.77.1.3/24"}}),
        "unexpected member",
    ),
    (
        "another proxy",
        _network(Containers={"q" * 64: {"IPv4Address": "10.77.1.2/24"}}),
        "another container",
    ),
    ("an extra member", _with_member("e" * 64, "10.77.1.9/24"), "unexpected member eeeeeeeeeeee"),
    (
        "proxy with ipv6",
        _network(Containers={PROXY_ID: {"IPv4Address": "10.77.1.2/24", "IPv6Address": "fd::2"}}),
        "IPv6",
    ),
]


@pytest.mark.parametrize(
    ("doc", "match"), [m[1:] for m in MISMATCHES], ids=[m[0] for m in MISMATCHES]
)
def test_every_difference_refuses_the_launch(doc, match) -> None:
    verdict = topology_verdict(doc, PINNED)
    assert not verdict.ok
    assert verdict.reason is not None
    assert verdict.reason.startswith("enclave network: ")
    assert match in verdict.reason


def test_the_invocations_own_enclave_is_the_one_allowed_extra_member() -> None:
    doc = _with_member("e" * 64, "10.77.1.9/24")
    assert topology_verdict(doc, PINNED, frozenset({"e" * 64})).ok
    doc = _with_member("f" * 64, "10.77.1.10/24")
    assert not topology_verdict(doc, PINNED, frozenset({"e" * 64})).ok


@pytest.mark.parametrize(
    ("state", "category"),
    [
        ({"ExitCode": 0, "OOMKilled": False}, None),
        ({"ExitCode": 1, "OOMKilled": False}, policy.CATEGORY_NONZERO_EXIT),
        ({"ExitCode": 137, "OOMKilled": True}, policy.CATEGORY_OOM),
        ({"ExitCode": 0, "OOMKilled": True}, policy.CATEGORY_OOM),
        ({"ExitCode": False}, policy.CATEGORY_NONZERO_EXIT),
        ({}, policy.CATEGORY_NONZERO_EXIT),
        (None, policy.CATEGORY_NONZERO_EXIT),
    ],
)
def test_exit_states(state, category) -> None:
    assert exit_failure(state) == category


def test_the_new_categories_are_runner_categories() -> None:
    for name in (
        policy.CATEGORY_ENCLAVE_TOPOLOGY,
        policy.CATEGORY_ENCLAVE_PROXY,
        policy.CATEGORY_TIMEOUT,
    ):
        assert name in FAILURE_CATEGORIES


def test_the_probe_runs_the_enclaves_runtime_network_and_hardening() -> None:
    for runtime in ("docker", "gvisor"):
        settings = RunnerSettings(runtime, RUN_ID, SETTINGS.image, 10, 512 * 1024**2)
        body = probe_body(enclave_settings(settings, OPTIONS, None), "{}", "ab" * 8)
        host = body["HostConfig"]
        assert host["Runtime"] == policy.ENCLAVE_OCI_RUNTIMES[runtime]
        assert host["NetworkMode"] == OPTIONS.network
        assert list(body["NetworkingConfig"]["EndpointsConfig"]) == [OPTIONS.network]
        assert host["CapDrop"] == ["ALL"]
        assert host["ReadonlyRootfs"] is True
        assert host["SecurityOpt"] == ["no-new-privileges:true", "seccomp={}"]
        assert "Mounts" not in host
        assert body["User"] == "65534:65534"
        assert body["Labels"][policy.LABEL_AGENT_RUN] == RUN_ID
