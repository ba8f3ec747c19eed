"""Container spec derivation (sandbox/spec.py), field by field (spec 14.7)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bounded_query.broker.protocol import MAX_SCRIPT_BYTES
from bounded_query.broker.protocol.policy import LABEL_INVOCATION, LABEL_RUN
from bounded_query.broker.runner import Invocation, RunnerSettings
from bounded_query.sandbox import spec as S
from bounded_query.sandbox.spec import container_spec, probe_spec, translate_host_path
from bounded_query.seccomp import load_profile, profile_json

SECCOMP = '{"defaultAction":"SCMP_ACT_ERRNO"}'
MEMORY = 512 * 1024**2


def settings(runtime="docker", host_path_map=()):
    return RunnerSettings(
        runtime=runtime,
        run_id="ab" * 16,
        image="bounded-query-python:latest",
        timeout_s=30,
        memory_bytes=MEMORY,
        host_path_map=host_path_map,
    )


def invocation(script=b"print('hi')"):
    return Invocation(
        run_id="ab" * 16,
        invocation_id="0123456789abcdef",
        seed_dir=Path("/priv/seeds/5eed"),
        workspace=Path("/priv/work/0123456789abcdef"),
        script=script,
    )


def body(runtime="docker", **kw):
    return container_spec(settings(runtime, **kw), invocation(), SECCOMP).body


def test_name_is_derived_from_ids_only():
    spec = container_spec(settings(), invocation(), SECCOMP)
    assert spec.name == "bq-abababababababab-0123456789abcdef"


@pytest.mark.parametrize(("runtime", "oci"), [("docker", "runc"), ("gvisor", "runsc")])
def test_runtime_mapping(runtime, oci):
    assert body(runtime)["HostConfig"]["Runtime"] == oci


def test_sbx_is_never_launched():
    with pytest.raises(KeyError):
        container_spec(settings("sbx"), invocation(), SECCOMP)


def test_identity_and_process():
    b = body()
    assert b["Image"] == "bounded-query-python:latest"
    assert b["User"] == "65534:65534"
    assert b["Entrypoint"] == ["/usr/bin/python3", "-I", "-S", "/awf/entrypoint.py"]
    assert b["Cmd"] == []
    assert b["WorkingDir"] == "/query"
    assert b["Tty"] is False
    assert b["OpenStdin"] is False
    assert b["StopSignal"] == "SIGKILL"


def test_environment_is_fixed_and_minimal():
    env = body()["Env"]
    assert env == list(S.CONTAINER_ENV)
    names = {item.partition("=")[0] for item in env}
    assert names == {"PATH", "LANG", "HOME", "PYTHONDONTWRITEBYTECODE", "GIT_CONFIG_NOSYSTEM"}
    assert not any("TOKEN" in item or "DOCKER" in item for item in env)


def test_no_network():
    b = body()
    assert b["NetworkDisabled"] is True
    assert b["HostConfig"]["NetworkMode"] == "none"


def test_privileges_dropped():
    hc = body()["HostConfig"]
    assert hc["ReadonlyRootfs"] is True
    assert hc["CapDrop"] == ["ALL"]
    assert hc["CapAdd"] is None
    assert hc["Privileged"] is False
    assert hc["SecurityOpt"] == ["no-new-privileges:true", f"seccomp={SECCOMP}"]
    assert hc["IpcMode"] == "private"
    assert "PidMode" not in hc
    assert "Devices" not in hc


def test_resource_limits():
    hc = body()["HostConfig"]
    assert hc["Memory"] == MEMORY
    assert hc["MemorySwap"] == MEMORY  # memory = memory + swap: no swap at all
    assert hc["NanoCpus"] == S.CPU_NANOS
    assert hc["PidsLimit"] == S.PIDS_LIMIT
    assert body("gvisor")["HostConfig"]["PidsLimit"] == S.PIDS_LIMIT_GVISOR  # sentry tasks
    ulimits = {u["Name"]: (u["Soft"], u["Hard"]) for u in hc["Ulimits"]}
    assert ulimits == {
        "nofile": (S.NOFILE_LIMIT, S.NOFILE_LIMIT),
        "fsize": (MEMORY, MEMORY),
        "core": (0, 0),
    }
    assert hc["ShmSize"] == S.SHM_BYTES


def test_tmpfs_are_size_limited_and_owned_by_query_user():
    tmpfs = body()["HostConfig"]["Tmpfs"]
    assert set(tmpfs) == {"/query", "/tmp"}
    query = tmpfs["/query"].split(",")
    assert f"size={MEMORY}" in query
    assert "uid=65534" in query
    assert "gid=65534" in query
    assert "nosuid" in query
    assert "nodev" in query
    assert "noexec" in query
    assert f"size={S.TMP_TMPFS_BYTES}" in tmpfs["/tmp"].split(",")


def test_tmp_tmpfs_never_exceeds_memory():
    small = RunnerSettings("docker", "ab" * 16, "img", 30, 8 * 1024**2)
    tmpfs = container_spec(small, invocation(), SECCOMP).body["HostConfig"]["Tmpfs"]
    assert f"size={8 * 1024**2}" in tmpfs["/tmp"].split(",")


def test_exactly_the_allowed_mounts():
    mounts = body()["HostConfig"]["Mounts"]
    view = [(m["Type"], m["Source"], m["Target"], m["ReadOnly"]) for m in mounts]
    assert view == [
        ("bind", "/priv/seeds/5eed", "/awf/seed", True),
        ("bind", "/priv/work/0123456789abcdef/script.py", "/awf/query-script.py", True),
        ("bind", "/priv/work/0123456789abcdef/out", "/query/out", False),
    ]
    assert all(m["BindOptions"] == {"Propagation": "rprivate"} for m in mounts)
    assert "Binds" not in body()["HostConfig"]
    assert "Volumes" not in body()


def test_no_docker_socket_anywhere():
    text = json.dumps(body())
    assert "docker.sock" not in text


def test_script_bytes_never_reach_the_spec():
    marker = b"SECRET-MARKER-7f3a"
    b = container_spec(settings(), invocation(script=marker), SECCOMP).body
    assert marker.decode() not in json.dumps(b)


def test_labels():
    assert body()["Labels"] == {LABEL_RUN: "ab" * 16, LABEL_INVOCATION: "0123456789abcdef"}


def test_lifecycle_and_output_handling():
    hc = body()["HostConfig"]
    assert hc["AutoRemove"] is False
    assert hc["LogConfig"] == {"Type": "none", "Config": {}}
    assert hc["RestartPolicy"] == {"Name": "no"}


def test_bench_options_only_change_args_and_logs():
    plain = body()
    bench = container_spec(
        settings(), invocation(), SECCOMP, entrypoint_args=("--timings",), keep_logs=True
    ).body
    assert bench["Cmd"] == ["--timings"]
    assert bench["HostConfig"]["LogConfig"]["Type"] == "local"
    for key in plain:
        if key not in ("Cmd", "HostConfig"):
            assert bench[key] == plain[key]
    for key in plain["HostConfig"]:
        if key != "LogConfig":
            assert bench["HostConfig"][key] == plain["HostConfig"][key]


def test_host_path_map_translates_bind_sources():
    mapping = (("/priv", "/host/var/tmp/priv"), ("/priv/seeds", "/seedhost"))
    sources = [m["Source"] for m in body(host_path_map=mapping)["HostConfig"]["Mounts"]]
    assert sources == [
        "/seedhost/5eed",
        "/host/var/tmp/priv/work/0123456789abcdef/script.py",
        "/host/var/tmp/priv/work/0123456789abcdef/out",
    ]


@pytest.mark.parametrize(
    ("path", "mapping", "expected"),
    [
        ("/a/b", (), "/a/b"),
        ("/a/b", (("/a", "/x"),), "/x/b"),
        ("/a", (("/a", "/x"),), "/x"),
        ("/ab/c", (("/a", "/x"),), "/ab/c"),  # component boundary
        ("/a/b/c", (("/a", "/x"), ("/a/b", "/y")), "/y/c"),  # longest prefix
        ("/a/b", (("/a/", "/x/"),), "/x/b"),
        ("/a/b", (("/a", "/"),), "/b"),
        ("/a", (("/a", "/"),), "/"),
    ],
)
def test_translate_host_path(path, mapping, expected):
    assert translate_host_path(path, mapping) == expected


def test_translate_rejects_relative_paths():
    with pytest.raises(ValueError, match="absolute"):
        translate_host_path("rel/path", ())


def test_probe_has_same_hardening_and_no_mounts():
    probe = probe_spec(settings("gvisor"), "probe01", SECCOMP).body
    full = body("gvisor")
    assert probe["HostConfig"]["Mounts"] == []
    for key in ("Runtime", "NetworkMode", "ReadonlyRootfs", "CapDrop", "SecurityOpt", "Memory"):
        assert probe["HostConfig"][key] == full["HostConfig"][key]
    assert probe["NetworkDisabled"] is True
    assert probe["Labels"][LABEL_RUN] == "ab" * 16


def test_seccomp_profile_shape():
    runc = load_profile("runc")
    runsc = load_profile("runsc")
    assert runc["defaultAction"] == "SCMP_ACT_ERRNO"
    assert runc["defaultErrnoRet"] == 1
    allowed = set(runc["syscalls"][0]["names"])
    assert len(allowed) < 200  # far fewer than Docker's 300+
    for name in (
        "ptrace",
        "mount",
        "umount2",
        "unshare",
        "setns",
        "keyctl",
        "add_key",
        "bpf",
        "perf_event_open",
        "io_uring_setup",
        "kexec_load",
        "init_module",
        "pivot_root",
        "chroot",
        "setuid",
        "clone",
        "clone3",
        "socket",
    ):
        assert name not in allowed
    clone3 = {tuple(r["names"]): r for r in runc["syscalls"]}[("clone3",)]
    assert clone3 == {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}
    clone3_gvisor = {tuple(r["names"]): r for r in runsc["syscalls"]}[("clone3",)]
    assert clone3_gvisor["action"] == "SCMP_ACT_TRACE"
    assert json.loads(profile_json("runsc")) == runsc


def test_seccomp_unknown_runtime():
    with pytest.raises(ValueError, match="variant"):
        load_profile("kata")


def test_repo_volume_replaces_the_seed_bind():
    b = container_spec(settings(), invocation(), SECCOMP, repo_volume="bq-x-repo").body
    mounts = b["HostConfig"]["Mounts"]
    assert mounts[0] == {
        "Type": "volume",
        "Source": "bq-x-repo",
        "Target": "/query/repo",
        "ReadOnly": False,
        "VolumeOptions": {"NoCopy": True},
    }
    targets = [m["Target"] for m in mounts]
    assert targets == ["/query/repo", "/awf/query-script.py", "/query/out"]
    assert "/priv/seeds/5eed" not in json.dumps(b)  # the seed is reached only through the view


def test_host_wide_state_is_masked():
    """Issue 9: host-wide counters a query could modulate or read are masked."""
    hc = body()["HostConfig"]
    masked = set(hc["MaskedPaths"])
    for path in (
        "/proc/loadavg", "/proc/stat", "/proc/meminfo", "/proc/vmstat", "/proc/sys",
        "/proc/diskstats", "/proc/pressure", "/proc/uptime", "/sys", "/proc/kcore",
        "/proc/keys", "/proc/timer_list", "/proc/sched_debug",
    ):  # fmt: skip
        assert path in masked, path
    assert len(masked) == len(hc["MaskedPaths"])
    assert all(p.startswith(("/proc/", "/sys")) for p in masked)
    assert "/proc/sysrq-trigger" in hc["ReadonlyPaths"]
    probe = probe_spec(settings(), "probe01", SECCOMP).body["HostConfig"]
    assert probe["MaskedPaths"] == hc["MaskedPaths"]


@pytest.mark.parametrize(("cpus", "expected"), [(2, "1"), (4, "2-3"), (1, "0")])
def test_query_cpuset_comes_from_the_partition(cpus, expected):
    spec = container_spec(settings(), invocation(), SECCOMP, host_cpus=cpus)
    assert spec.body["HostConfig"]["CpusetCpus"] == expected
    probe = probe_spec(settings(), "probe01", SECCOMP, host_cpus=cpus).body
    assert probe["HostConfig"]["CpusetCpus"] == expected
    assert "CpusetCpus" not in body()["HostConfig"]


# -- prepared containers (issue 20) -------------------------------------------


def prepared(runtime="docker", slot_id="prep" + "cd" * 16, **kw):
    return S.prepared_spec(
        settings(runtime, **kw),
        slot_id,
        SECCOMP,
        "LAUNCHER SOURCE",
        workspace="/priv/work/" + slot_id,
        repo_volume="bq-vol-" + slot_id,
        host_cpus=2,
    )


def test_prepared_has_the_cold_hardening():
    cold = container_spec(
        settings(), invocation(), SECCOMP, repo_volume="bq-vol", host_cpus=2
    ).body["HostConfig"]
    warm = prepared().body["HostConfig"]
    different = {key for key in cold.keys() | warm.keys() if cold.get(key) != warm.get(key)}
    assert different == {"Mounts", "Tmpfs"}
    extra = {k: v for k, v in warm["Tmpfs"].items() if k not in cold["Tmpfs"]}
    assert list(extra) == [S.PREPARED_SCRIPT_DIR]
    assert "noexec" in extra[S.PREPARED_SCRIPT_DIR]
    assert f"size={S.PREPARED_SCRIPT_DIR_BYTES}" in extra[S.PREPARED_SCRIPT_DIR]
    assert S.PREPARED_SCRIPT_DIR_BYTES >= MAX_SCRIPT_BYTES


def test_prepared_runs_the_launcher_on_stdin_once():
    spec = prepared()
    b = spec.body
    assert b["Entrypoint"] == [
        "/usr/bin/python3", "-I", "-S", "-c", "LAUNCHER SOURCE", str(MAX_SCRIPT_BYTES)
    ]  # fmt: skip
    assert b["Cmd"] == []
    assert (b["OpenStdin"], b["StdinOnce"], b["AttachStdin"], b["Tty"]) == (
        True,
        True,
        False,
        False,
    )
    assert b["User"] == "65534:65534"
    assert b["Labels"] == {LABEL_RUN: "ab" * 16, LABEL_INVOCATION: "prep" + "cd" * 16}
    assert spec.name == S.container_name("ab" * 16, "prep" + "cd" * 16)


def test_prepared_mounts_overlay_and_result_only():
    mounts = prepared().body["HostConfig"]["Mounts"]
    assert [(m["Type"], m["Source"], m["Target"], m["ReadOnly"]) for m in mounts] == [
        ("volume", "bq-vol-prep" + "cd" * 16, "/query/repo", False),
        ("bind", "/priv/work/prep" + "cd" * 16 + "/out", "/query/out", False),
    ]
    assert not any(m["Target"] == S.SCRIPT_TARGET for m in mounts)


def test_prepared_depends_on_slot_and_settings_only():
    """Two slots' bodies differ only where the slot id appears (nothing of a query)."""
    one = json.dumps(prepared(slot_id="prep" + "11" * 16).body, sort_keys=True)
    two = json.dumps(prepared(slot_id="prep" + "22" * 16).body, sort_keys=True)
    assert one.replace("11" * 16, "22" * 16) == two


def test_prepared_translates_and_refuses_like_cold():
    mapped = prepared(host_path_map=(("/priv", "/host/priv"),))
    sources = [m["Source"] for m in mapped.body["HostConfig"]["Mounts"]]
    assert sources[1].startswith("/host/priv/work/")
    with pytest.raises(KeyError):
        prepared("sbx")
