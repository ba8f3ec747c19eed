"""The enclave's Engine API create body, field by field (spec 15.5, 15.6)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bounded_query.broker.protocol import policy
from bounded_query.sandbox import enclave_spec as es
from bounded_query.sandbox.spec import MASKED_PATHS

SETTINGS = es.EnclaveSettings(
    runtime="docker",
    run_id="0123456789abcdef0123456789abcdef",
    image=policy.ENCLAVE_IMAGES["claude"],
    engine="claude",
    model="claude-model-x",
    network=policy.ENCLAVE_NETWORK,
    proxy_address="10.99.0.2",
    proxy_port=8080,
    memory_bytes=512 * 1024**2,
    nano_cpus=1_000_000_000,
    pids_limit=policy.ENCLAVE_PIDS_LIMIT,
    tmpfs_bytes=policy.ENCLAVE_TMPFS_BYTES,
    host_cpus=2,
)
INVOCATION = es.EnclaveInvocation(
    invocation_id="00112233aabbccdd",
    seed_dir="/priv/seeds/abc",
    workspace="/priv/work/00112233aabbccdd",
    placeholder="ab" * 32,
)


def _body(settings: es.EnclaveSettings = SETTINGS) -> dict:
    name, body = es.enclave_spec(settings, INVOCATION, '{"p":1}')
    assert name == "bq-enclave-0123456789abcdef-00112233aabbccdd"
    return body


def test_identity_entrypoint_and_environment() -> None:
    body = _body()
    assert body["User"] == "65534:65534"
    assert body["Entrypoint"] == ["/usr/bin/python3", "-I", "-S", "/awf/adapter.py"]
    assert body["Cmd"] == ["claude", "claude-model-x"]
    assert body["WorkingDir"] == "/awf/seed"
    assert body["Hostname"] == "enclave"
    assert body["Env"] == [
        "PATH=/opt/engine/bin:/usr/bin:/bin",
        "LANG=C.UTF-8",
        "HOME=/agent/home",
        "TMPDIR=/tmp",
        "ANTHROPIC_BASE_URL=http://awf-api-proxy:8080",
        "ANTHROPIC_API_KEY=" + "ab" * 32,
    ]
    assert body["Labels"] == {
        policy.LABEL_AGENT_RUN: SETTINGS.run_id,
        policy.LABEL_AGENT_INVOCATION: INVOCATION.invocation_id,
        policy.LABEL_ROLE: "enclave",
    }
    assert body["StopSignal"] == "SIGKILL"
    for flag in ("AttachStdin", "OpenStdin", "Tty"):
        assert body[flag] is False


def test_one_internal_network_and_constant_name_resolution() -> None:
    body = _body()
    host = body["HostConfig"]
    assert host["NetworkMode"] == policy.ENCLAVE_NETWORK
    assert body["NetworkingConfig"] == {"EndpointsConfig": {policy.ENCLAVE_NETWORK: {}}}
    assert host["Dns"] == ["10.99.0.2"]
    assert host["PortBindings"] == {}
    assert not host["PublishAllPorts"]
    assert es.hosts_file(SETTINGS).splitlines() == [
        "127.0.0.1\tlocalhost",
        "127.0.1.1\tenclave",
        "10.99.0.2\tawf-api-proxy",
    ]
    assert "nameserver" not in es.RESOLV_CONF


def test_mounts_seed_and_inputs_read_only_result_read_write() -> None:
    mounts = {m["Target"]: m for m in _body()["HostConfig"]["Mounts"]}
    assert set(mounts) == {
        "/awf/seed",
        "/awf/task.txt",
        "/awf/schema.json",
        "/agent/result.json",
        "/etc/hosts",
        "/etc/resolv.conf",
    }
    assert mounts["/awf/seed"]["Source"] == "/priv/seeds/abc"
    for target, mount in mounts.items():
        assert mount["Type"] == "bind"
        assert mount["ReadOnly"] is (target != "/agent/result.json"), target
        assert mount["BindOptions"] == {"Propagation": "rprivate"}
        if target != "/awf/seed":
            assert mount["Source"].startswith("/priv/work/00112233aabbccdd/")


def test_host_path_map_translates_every_source() -> None:
    settings = dataclasses.replace(SETTINGS, host_path_map=(("/priv", "/host/priv"),))
    for mount in _body(settings)["HostConfig"]["Mounts"]:
        assert mount["Source"].startswith("/host/priv/")


def test_hardening_and_limits() -> None:
    host = _body()["HostConfig"]
    assert host["Runtime"] == "runc"
    assert host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"]
    assert host["CapAdd"] is None
    assert host["Privileged"] is False
    assert host["SecurityOpt"] == ["no-new-privileges:true", 'seccomp={"p":1}']
    assert host["Memory"] == host["MemorySwap"] == 512 * 1024**2
    assert host["NanoCpus"] == 1_000_000_000
    assert host["PidsLimit"] == 128
    assert host["CpusetCpus"] == "1"
    ulimits = {u["Name"]: (u["Soft"], u["Hard"]) for u in host["Ulimits"]}
    assert ulimits == {
        "nofile": (es.NOFILE_LIMIT, es.NOFILE_LIMIT),
        "fsize": (policy.ENCLAVE_TMPFS_BYTES,) * 2,
        "core": (0, 0),
    }
    for target in ("/agent", "/tmp"):
        options = host["Tmpfs"][target].split(",")
        assert {"nosuid", "nodev", "noexec", f"size={policy.ENCLAVE_TMPFS_BYTES}"} <= set(options)
        assert {"uid=65534", "gid=65534"} <= set(options)
    assert host["IpcMode"] == "private"
    assert host["LogConfig"] == {"Type": "none", "Config": {}}
    assert host["MaskedPaths"] == list(MASKED_PATHS)
    assert host["RestartPolicy"] == {"Name": "no"}
    assert "Binds" not in host
    assert "VolumesFrom" not in host


def test_gvisor_uses_the_networked_registration_and_never_runc() -> None:
    host = _body(dataclasses.replace(SETTINGS, runtime="gvisor"))["HostConfig"]
    assert host["Runtime"] == policy.ENCLAVE_OCI_RUNTIMES["gvisor"] == "runsc-net"
    assert host["Runtime"] not in ("runc", policy.OCI_RUNTIMES["gvisor"])


def test_nothing_request_derived_or_secret_appears_but_the_placeholder() -> None:
    text = json.dumps(_body())
    assert text.count("ab" * 32) == 1
    assert "task" not in json.dumps(_body()["Env"])


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("runtime", "sbx", "cannot launch"),
        ("runtime", "runc", "cannot launch"),
        ("run_id", "XYZ", "run id"),
        ("engine", "gemini", "no enclave adapter"),
        ("model", "--dangerous", "plain name"),
        ("model", "a b", "plain name"),
        ("model", "", "non-empty"),
        ("proxy_address", "awf-api-proxy", "IPv4"),
        ("proxy_address", "10.0.0.256", "IPv4"),
        ("proxy_address", "10.0.0.02", "IPv4"),
        ("proxy_port", 0, "port"),
        ("memory_bytes", 0, "memory_bytes"),
        ("pids_limit", True, "pids_limit"),
        ("tmpfs_bytes", 1024**3, "exceed"),  # larger than the memory limit
        ("network", "", "non-empty"),
    ],
)
def test_settings_refuse_values_outside_their_domain(field: str, value: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(SETTINGS, **{field: value})


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("invocation_id", "../x", "invocation id"),
        ("seed_dir", "relative", "absolute"),
        ("workspace", "relative", "absolute"),
        ("placeholder", "short", "placeholder"),
        ("placeholder", "AB" * 32, "placeholder"),
    ],
)
def test_invocation_refuses_malformed_values(field: str, value: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(INVOCATION, **{field: value})


@given(st.from_regex(r"[a-z0-9][a-z0-9.:_/-]{0,40}", fullmatch=True))
def test_any_plain_model_name_is_passed_as_one_argument(model: str) -> None:
    body = _body(dataclasses.replace(SETTINGS, model=model))
    assert body["Cmd"] == ["claude", model]


def test_network_spec_is_internal_without_a_host_address() -> None:
    body = es.network_spec("n", "10.99.0.0/24", {"k": "v"})
    assert body["internal"] is True
    assert body["enable_ipv6"] is False
    assert body["options"]["com.docker.network.bridge.inhibit_ipv4"] == "true"
    assert body["ipam"] == {"Driver": "default", "Config": [{"Subnet": "10.99.0.0/24"}]}
    assert body["labels"] == {"k": "v"}
