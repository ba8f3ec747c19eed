"""The enclave seccomp profile: the query profile plus only the explained engine calls."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from bounded_query import seccomp
from bounded_query.broker.protocol import policy

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "seccomp" / "recipe"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"seccomp_{name}", RECIPE / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _profile() -> dict:
    return json.loads((ROOT / "seccomp" / "enclave.json").read_text())


def test_profile_is_regenerated_byte_for_byte(tmp_path) -> None:
    gen = _load("generate_enclave")
    out = tmp_path / "enclave.json"
    traced = ",".join(str(RECIPE / n) for n in ("traced_enclave.txt", "traced_enclave_copilot.txt"))
    assert gen.main([traced, str(ROOT / "seccomp" / "query.json"), str(out)]) == 0
    assert out.read_bytes() == (ROOT / "seccomp" / "enclave.json").read_bytes()


def test_only_the_explained_calls_are_added() -> None:
    gen = _load("generate_enclave")
    query = json.loads((ROOT / "seccomp" / "query.json").read_text())
    added = set(_profile()["syscalls"][0]["names"]) - set(query["syscalls"][0]["names"])
    assert added == set(gen.ENCLAVE_EXTRA)
    for name, (why, channel) in gen.ENCLAVE_EXTRA.items():
        assert why, name
        assert channel, name


def test_never_and_channel_lists_still_win() -> None:
    query_gen = _load("generate")
    allowed = set(_profile()["syscalls"][0]["names"])
    assert not allowed & query_gen.NEVER
    assert not allowed & query_gen.CHANNEL_DENY
    allowing = [r for r in _profile()["syscalls"] if r["action"] == "SCMP_ACT_ALLOW"]
    named = {n for rule in allowing for n in rule["names"]}
    assert not named & (query_gen.CHANNEL_DENY | {"io_uring_setup", "ptrace", "mount", "bpf"})
    assert not named & {"io_uring_enter", "io_uring_register", "capget"}


def test_io_uring_fails_with_enosys_so_libuv_falls_back() -> None:
    """Copilot's libuv probes io_uring (traced); "no such call" makes it use epoll."""
    rules = [r for r in _profile()["syscalls"] if "io_uring_setup" in r["names"]]
    assert rules == [
        {
            "names": ["io_uring_enter", "io_uring_register", "io_uring_setup"],
            "action": "SCMP_ACT_ERRNO",
            "errnoRet": 38,
        }
    ]
    traced = (RECIPE / "traced_enclave_copilot.txt").read_text().split()
    assert "io_uring_setup" in traced


def test_a_traced_call_nobody_explained_is_an_error() -> None:
    gen = _load("generate_enclave")
    query = json.loads((ROOT / "seccomp" / "query.json").read_text())
    with pytest.raises(ValueError, match="kcmp"):
        gen.build(query, {"read", "kcmp"})
    # The traced names the engine survives without stay denied.
    built = gen.build(query, {"read", "sysinfo", "fadvise64"})
    assert not {"sysinfo", "fadvise64"} & set(built["syscalls"][0]["names"])


def test_inet_sockets_are_tcp_only_and_unix_stays() -> None:
    rules = [r for r in _profile()["syscalls"] if "socket" in r["names"]]
    families = sorted(r["args"][0]["value"] for r in rules)
    assert families == [1, 2]  # AF_UNIX, AF_INET; never AF_INET6 (10), netlink, packet
    inet = next(r for r in rules if r["args"][0]["value"] == 2)
    assert inet["names"] == ["socket"]
    assert inet["args"][1] == {
        "index": 1,
        "value": 0xF,
        "valueTwo": 1,
        "op": "SCMP_CMP_MASKED_EQ",
    }


def test_runtime_variants() -> None:
    assert set(policy.ENCLAVE_OCI_RUNTIMES.values()) == seccomp.ENCLAVE_PROFILE_RUNTIMES
    runc = seccomp.load_enclave_profile("runc")
    gvisor = seccomp.load_enclave_profile(policy.ENCLAVE_OCI_RUNTIMES["gvisor"])
    clone3 = [r for r in runc["syscalls"] if r["names"] == ["clone3"]]
    assert clone3 == [{"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]
    assert [r["action"] for r in gvisor["syscalls"] if r["names"] == ["clone3"]] == [
        "SCMP_ACT_TRACE"
    ]
    assert json.loads(seccomp.enclave_profile_json("runc")) == runc
    with pytest.raises(ValueError, match="runtime"):
        seccomp.load_enclave_profile("runsc")  # the queries' network-less registration
    with pytest.raises(ValueError, match="runtime"):
        seccomp.load_profile("runsc-net")
