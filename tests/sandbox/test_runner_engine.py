"""DockerRunner against a real engine, on runc and on runsc (spec 14.7)."""

from __future__ import annotations

import json

import pytest

from bounded_query.broker.protocol import policy
from bounded_query.broker.runner import RunnerSettings, RunnerUnavailable
from bounded_query.sandbox import DockerRunner, RunnerOptions, create_runner, sbx_capability_report
from tests.sandbox.helpers import (
    RUNTIMES,
    leftover_containers,
    leftover_volumes,
    new_invocation,
    settings,
)

pytestmark = pytest.mark.engine

GIT_AND_WRITE = r"""
import os, subprocess, json
os.chdir("/query/repo")
def sh(*argv):
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout
log = sh("git", "log", "--format=%s")
grep = sh("git", "grep", "-l", "needle")
status = sh("git", "status", "--porcelain")
with open("README.md", "a") as fh:   # the private copy is writable
    fh.write("changed\n")
os.mkdir("newdir")
open("src/mod00.py", "w").write("x = 1\n")
os.remove("src/mod01.py")
sh("git", "-c", "user.name=q", "-c", "user.email=q@q", "commit", "-qam", "q")
facts = {
    "log": log.strip(), "grep": grep.strip(), "clean": status == "",
    "cwd": os.path.basename(os.getcwd()), "uid": os.getuid(), "gid": os.getgid(),
    "exec_bit": os.stat("run.sh").st_mode & 0o111 == 0o111,
    "writable": os.access("src/mod02.py", os.W_OK),
    "env": sorted(os.environ),
    "repo_fs": [l.split(" - ")[1].split()[0] for l in open("/proc/self/mountinfo")
                if l.split()[4] == "/query/repo"],
}
open("/query/out", "w").write(json.dumps(facts, sort_keys=True))
"""


@pytest.fixture(params=RUNTIMES)
def runtime(request):
    return request.param


async def run_one(engine, work_root, seed, script, *, options=None, **kw):
    cfg = settings(kw.pop("runtime"), **kw)
    runner = DockerRunner(cfg, options=options)
    inv = new_invocation(cfg, work_root, seed, script)
    try:
        report = await runner.run(inv)
        answer = report.result
        assert leftover_containers(engine, cfg.run_id) == []
        # only the per-seed view layer outlives an invocation
        assert leftover_volumes(engine, cfg.run_id, role="query-repo") == []
        await runner.reconcile()
    finally:
        runner.close()
    assert leftover_volumes(engine, cfg.run_id) == []
    return report, answer


@pytest.mark.parametrize("materialize", ["overlay", "tmpfs"])
async def test_git_works_and_repo_is_private_and_writable(
    engine, work_root, seed, runtime, materialize
):
    options = RunnerOptions(materialize=materialize)
    report, answer = await run_one(
        engine, work_root, seed, GIT_AND_WRITE, runtime=runtime, options=options
    )
    assert report.failure is None, report
    facts = json.loads(answer)
    assert facts["log"] == "fixture"
    assert facts["grep"] == "README.md"
    assert facts["clean"] is True
    assert facts["uid"] == 65534
    assert facts["gid"] == 65534
    assert facts["exec_bit"] is True
    assert facts["writable"] is True
    # our fixed environment plus the HOSTNAME the engine always adds
    assert facts["env"] == sorted(
        ["GIT_CONFIG_NOSYSTEM", "HOME", "HOSTNAME", "LANG", "PATH", "PYTHONDONTWRITEBYTECODE"]
    )
    if materialize == "overlay":  # run in a container prepared on demand (no idle hook here)
        assert set(report.phases) >= {"cold", "create", "start", "deliver", "wait", "remove"}
    else:
        assert set(report.phases) >= {"prepare", "create", "start", "wait", "remove"}
    # overlay mode really mounts the copy-on-write view (gVisor shows it as its
    # 9p gofer mount); tmpfs mode copies into the /query tmpfs
    mounted = {"docker": ["overlay"], "gvisor": ["9p"]}[runtime]
    assert facts["repo_fs"] == (mounted if materialize == "overlay" else [])
    # the seed itself was not touched
    assert (seed / "README.md").read_text() == "# fixture\nneedle in a haystack\n"


async def test_script_runs_as_main_in_query(engine, work_root, seed, runtime):
    script = (
        "import os, sys\nopen('/query/out','w').write(repr((__name__, os.getcwd(), sys.argv[0])))"
    )
    report, answer = await run_one(engine, work_root, seed, script, runtime=runtime)
    assert report.failure is None
    assert answer == b"('__main__', '/query', '/awf/query-script.py')"


async def test_nonzero_exit_is_reported(engine, work_root, seed, runtime):
    report, _ = await run_one(engine, work_root, seed, "raise SystemExit(3)", runtime=runtime)
    assert report.failure == "query-nonzero-exit"


async def test_timeout_kills_and_removes(engine, work_root, seed, runtime):
    report, answer = await run_one(
        engine, work_root, seed, "import time\ntime.sleep(60)", runtime=runtime, timeout_s=2
    )
    assert report.failure == "query-timeout"
    assert answer is None  # after a failure the runner returns no answer
    assert report.phases["wait"] < 10


async def test_missing_image_is_a_launch_failure(engine, work_root, seed):
    cfg = RunnerSettings("docker", "cd" * 16, "bounded-query-missing:none", 30, 256 * 1024**2)
    runner = DockerRunner(cfg)
    report = await runner.run(new_invocation(cfg, work_root, seed, "pass"))
    runner.close()
    assert report.failure == "query-launch-failed"
    assert leftover_containers(engine, cfg.run_id) == []


async def test_preflight_probe_passes(engine, runtime):
    cfg = settings(runtime)
    runner = DockerRunner(cfg)
    try:
        await runner.preflight()
    finally:
        runner.close()
    assert leftover_containers(engine, cfg.run_id) == []


async def test_preflight_refuses_missing_image(engine):
    cfg = RunnerSettings("gvisor", "cd" * 16, "bounded-query-missing:none", 30, 256 * 1024**2)
    runner = DockerRunner(cfg)
    with pytest.raises(RunnerUnavailable, match="never pulled"):
        await runner.preflight()
    runner.close()


async def test_preflight_refuses_unregistered_runtime(engine, monkeypatch):

    cfg = settings("gvisor")
    runner = DockerRunner(cfg)
    monkeypatch.setattr(runner, "oci_runtime", "runsc-not-registered")
    with pytest.raises(RunnerUnavailable, match="not registered"):
        await runner.preflight()
    runner.close()
    assert policy.OCI_RUNTIMES["gvisor"] == "runsc"  # no fallback table was touched


async def test_preflight_unreachable_engine():
    cfg = RunnerSettings(
        "gvisor", "cd" * 16, "img", 30, 256 * 1024**2, docker_host="unix:///nonexistent.sock"
    )
    runner = DockerRunner(cfg)
    try:
        with pytest.raises(RunnerUnavailable, match="unreachable"):
            await runner.preflight()
    finally:
        runner.close()


async def test_reconcile_removes_labelled_stragglers(engine, runtime):
    cfg = settings(runtime)
    for i in range(2):
        engine.containers.create(
            "bounded-query-python:latest",
            labels={"bounded-query.run": cfg.run_id, "bounded-query.invocation": f"s{i}"},
            network_disabled=True,
        )
    other = engine.containers.create(
        "bounded-query-python:latest", labels={"bounded-query.run": "other"}, network_disabled=True
    )
    runner = DockerRunner(cfg)
    try:
        assert await runner.reconcile() == 2
        assert await runner.reconcile() == 0
    finally:
        runner.close()
        other.remove(force=True)
    assert leftover_containers(engine, cfg.run_id) == []


def test_create_runner_maps_runtimes():
    for runtime, oci in (("docker", "runc"), ("gvisor", "runsc")):
        runner = create_runner(settings(runtime))
        assert isinstance(runner, DockerRunner)
        assert runner.oci_runtime == oci


def test_create_runner_blocks_sbx_with_report():
    with pytest.raises(RunnerUnavailable) as info:
        create_runner(settings("sbx"))
    text = str(info.value)
    report = json.loads(text[text.index("{") :])
    assert report == sbx_capability_report()
    assert report["status"] == "blocked"
    assert report["launchable"] is False
    assert report["fallback"] == "never"
    controls = {c["control"] for c in report["missingControls"]}
    must = {"network-none", "pids-limit", "disk-limit", "file-size-limit", "mount-target"}
    assert must <= controls


def test_create_runner_rejects_unknown_runtime():
    with pytest.raises(ValueError, match="unknown"):
        create_runner(settings("kata"))


async def test_warm_prepares_the_view_once(engine, work_root, seed):
    import os

    cfg = settings("docker")
    runner = DockerRunner(cfg)
    try:
        assert await runner.warm([seed]) == {str(seed): True}
        views = leftover_volumes(engine, cfg.run_id, role="seed-view")
        assert len(views) == 1
        # the view's host directory is root-only (no host user reaches it)
        mountpoint = engine.volumes.get(views[0]).attrs["Mountpoint"]
        info = os.stat(mountpoint)
        assert (info.st_uid, info.st_mode & 0o777) == (0, 0o700)
        inv = new_invocation(cfg, work_root, seed, "open('/query/out','w').write('true')")
        report = await runner.run(inv)
        assert report.failure is None
        assert report.phases["view"] < 0.1  # already prepared
        assert report.result == b"true"
        assert await runner.reconcile() == 1  # only the page-cache pin (sandbox/pagecache.py)
    finally:
        runner.close()
    assert leftover_volumes(engine, cfg.run_id) == []


async def test_vanished_view_is_prepared_again(engine, work_root, seed):
    cfg = settings("docker")
    runner = DockerRunner(cfg)
    try:
        await runner.warm([seed])
        for name in leftover_volumes(engine, cfg.run_id, role="seed-view"):
            engine.volumes.get(name).remove(force=True)  # removed behind our back
        first = await runner.run(new_invocation(cfg, work_root, seed, "pass"))
        assert first.failure == "query-launch-failed"
        second = await runner.run(
            new_invocation(cfg, work_root, seed, "open('/query/out','w').write('true')")
        )
        assert second.failure is None
        await runner.reconcile()
    finally:
        runner.close()
    assert leftover_volumes(engine, cfg.run_id) == []
