"""DockerRunner's control flow against a fake Engine API client (no engine).

The fake records every call, so each test checks both the reported category
and that whatever was created was removed (spec 14.7: every container and
volume gone before ``run`` returns; cleanup failure is ``cleanup-failed``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import docker.errors
import pytest
import trio

from bounded_query.broker.runner import Invocation, RunnerSettings, RunnerUnavailable
from bounded_query.sandbox import DockerRunner, RunnerOptions

MEMORY = 256 * 1024**2


class FakeAPI:
    """Just enough of docker.APIClient; behaviour set per test."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []
        self.containers_alive: set[str] = set()
        self.volumes_alive: dict[str, dict[str, object]] = {}
        self.exit_code = 0
        self.oom = False
        self.fail_create = False
        self.fail_remove = 0  # how many remove_container calls raise
        self.block_wait = False
        self.released = threading.Event()
        self.runtimes: dict[str, dict[str, object]] = {"runc": {}, "runsc": {}}
        self.images = {"bounded-query-python:latest"}
        self.listed: list[dict[str, str]] = []
        self.prep_exit = 0
        self.running = False
        #: the workspace to look at while the container "runs", and what the
        #: "script" writes to its result file
        self.watch: Path | None = None
        self.answer: bytes | None = None
        self.seen: dict[str, object] = {}
        self.pin_logs = b"awf-pinned 4539 181403648\n"
        #: container name -> id (the pin is looked up by name)
        self.names: dict[str, str] = {}

    # containers
    def create_container_from_config(self, body, name):
        self.calls.append(("create", name))
        if self.fail_create:
            raise docker.errors.APIError("no such image")
        cid = f"c{len(self.calls)}"
        self.containers_alive.add(cid)
        self.last_body = body
        if name is not None:
            self.names[name] = cid
        return {"Id": cid}

    def start(self, cid):
        self.calls.append(("start", cid))
        ws = self.watch
        if ws is not None and "seed-prep" not in str(self.last_body.get("Labels", {}).values()):
            self.seen = {
                "mounted": os.path.ismount(ws),
                "script": (ws / "script.py").read_bytes(),
                "script_mode": (ws / "script.py").stat().st_mode & 0o777,
                "out": (ws / "out").read_bytes(),
                "names": sorted(os.listdir(ws)),
            }
            if self.answer is not None:
                (ws / "out").write_bytes(self.answer)

    def wait(self, cid, timeout=None):
        self.calls.append(("wait", cid))
        if self.block_wait:
            self.released.wait(10)
            return {"StatusCode": 137}
        is_prep = "seed-prep" in str(self.last_body.get("Labels", {}).values())
        return {"StatusCode": self.prep_exit if is_prep else self.exit_code}

    def inspect_container(self, cid):
        if cid in self.names:  # by name: the pin, running while it exists
            if self.names[cid] not in self.containers_alive:
                raise docker.errors.NotFound("gone")
            return {"State": {"OOMKilled": False, "Running": True}}
        return {"State": {"OOMKilled": self.oom, "Running": self.running}}

    def remove_container(self, cid, v=False, force=False):
        self.calls.append(("remove", cid))
        assert v
        assert force
        if self.fail_remove:
            self.fail_remove -= 1
            raise docker.errors.APIError("removal in progress")
        self.released.set()
        if cid not in self.containers_alive:
            raise docker.errors.NotFound("gone")
        self.containers_alive.discard(cid)

    def containers(self, all=False, filters=None):
        return self.listed

    def logs(self, cid, stdout=True, stderr=True):
        if stdout and not stderr:  # the pin container's readiness line
            return self.pin_logs
        return b"awf-timing materialize=0.5 run=0.25\n"

    # volumes
    def create_volume(self, name, driver=None, driver_opts=None, labels=None):
        self.calls.append(("volume", name))
        self.volumes_alive[name] = {"Name": name, "Labels": labels or {}}
        return {"Name": name, "Mountpoint": f"/var/lib/docker/volumes/{name}/_data"}

    def remove_volume(self, name, force=False):
        self.calls.append(("rmvolume", name))
        if name not in self.volumes_alive:
            raise docker.errors.NotFound("gone")
        del self.volumes_alive[name]

    def volumes(self, filters=None):
        return {"Volumes": list(self.volumes_alive.values())}

    # engine
    def info(self):
        return {"Runtimes": self.runtimes}

    def inspect_image(self, image):
        if image not in self.images:
            raise docker.errors.ImageNotFound("missing")
        return {}

    def close(self):
        pass


def make(runtime="docker", *, timeout_s=30, materialize="tmpfs", options=None):
    api = FakeAPI()
    cfg = RunnerSettings(runtime, "ab" * 16, "bounded-query-python:latest", timeout_s, MEMORY)
    runner = DockerRunner(
        cfg,
        options=options or RunnerOptions(materialize=materialize, pin_page_cache=False),
        client_factory=lambda: api,
    )
    return runner, api


def invocation(tmp_path: Path, name="0123abcd") -> Invocation:
    ws = tmp_path / name
    ws.mkdir(mode=0o700)
    return Invocation("ab" * 16, name, tmp_path / "seed", ws, b"print(1)")


async def test_success_prepares_workspace_and_removes_container(tmp_path):
    runner, api = make()
    inv = invocation(tmp_path)
    api.watch = inv.workspace
    api.answer = b'{"x": 1}'
    report = await runner.run(inv)
    assert report.failure is None
    assert api.seen["script"] == b"print(1)"
    assert api.seen["script_mode"] == 0o444
    assert api.seen["out"] == b""
    # issue 9: the workspace was its own tmpfs while the query ran (as root),
    # is unmounted afterwards, and the answer is in the report
    assert api.seen["mounted"] is (os.geteuid() == 0)
    assert runner.isolated_storage is (os.geteuid() == 0)
    assert not inv.workspace.is_mount()
    assert report.result == b'{"x": 1}'
    if os.geteuid() == 0:
        assert os.listdir(inv.workspace) == []
    assert [c[0] for c in api.calls] == ["create", "start", "wait", "remove"]
    assert api.containers_alive == set()
    assert set(report.phases) == {"storage", "prepare", "create", "start", "wait", "remove"}


@pytest.mark.parametrize(
    ("code", "oom", "failure"),
    [
        (1, False, "query-nonzero-exit"),
        (137, True, "query-oom"),
        (137, False, "query-nonzero-exit"),
    ],
)
async def test_exit_classification(tmp_path, code, oom, failure):
    runner, api = make()
    api.exit_code, api.oom = code, oom
    report = await runner.run(invocation(tmp_path))
    assert report.failure == failure
    assert api.containers_alive == set()


async def test_launch_failure_still_cleans_up_by_name(tmp_path):
    runner, api = make()
    api.fail_create = True
    report = await runner.run(invocation(tmp_path))
    assert report.failure == "query-launch-failed"
    assert api.calls[-1] == ("remove", "bq-abababababababab-0123abcd")


async def test_timeout_removes_the_running_container(tmp_path, autojump_clock):
    runner, api = make(timeout_s=5)
    api.block_wait = True
    report = await runner.run(invocation(tmp_path))
    assert report.failure == "query-timeout"
    # The removal is what ends the blocked wait. Under the autojump clock the
    # timeout may fire before the worker thread has even entered ``wait``, so
    # only the order relative to ``start`` is fixed, not relative to ``wait``.
    names = [c[0] for c in api.calls]
    assert "remove" in names[names.index("start") :]
    assert api.containers_alive == set()


async def test_removal_retried_once(tmp_path):
    runner, api = make()
    api.fail_remove = 1
    report = await runner.run(invocation(tmp_path))
    assert report.failure is None
    assert api.containers_alive == set()


async def test_removal_failure_is_cleanup_failed(tmp_path):
    runner, api = make()
    api.fail_remove = 2
    report = await runner.run(invocation(tmp_path))
    assert report.failure == "cleanup-failed"


async def test_cleanup_failed_wins_over_exit_status(tmp_path):
    runner, api = make()
    api.exit_code, api.fail_remove = 3, 2
    assert (await runner.run(invocation(tmp_path))).failure == "cleanup-failed"


async def test_existing_workspace_files_are_a_runner_fault(tmp_path):
    runner, api = make()
    inv = invocation(tmp_path)
    (inv.workspace / "out").symlink_to("/etc/passwd")
    report = await runner.run(inv)
    assert report.failure == "runner-internal"
    assert api.calls == []  # nothing launched


async def test_a_bad_answer_is_not_kept(tmp_path):
    runner, api = make()
    inv = invocation(tmp_path)
    api.watch = inv.workspace
    api.answer = b"x" * 9000  # over the 8 KiB cap: the broker must find nothing
    report = await runner.run(inv)
    assert report.failure is None
    assert report.result is None
    assert not inv.workspace.is_mount()


async def test_overlay_mode_prepares_view_once_and_removes_invocation_volume(tmp_path):
    # the cold path without prepared containers (prepared ones: test_prepared_fake.py)
    runner, api = make(
        options=RunnerOptions(materialize="overlay", pin_page_cache=False, prepared=False)
    )
    api.watch = tmp_path / "01"
    first = await runner.run(invocation(tmp_path, "01"))
    assert {"upper", "work", "script.py", "out"} <= set(api.seen["names"])
    api.watch = None
    second = await runner.run(invocation(tmp_path, "02"))
    assert first.failure is None
    assert second.failure is None
    preps = [c for c in api.calls if c[0] == "create" and c[1] is None]
    assert len(preps) == 1  # the prep container ran once
    # only the seed's view volume remains; prep, work and invocation volumes are gone
    assert [n for n in api.volumes_alive] == [n for n in api.volumes_alive if n.endswith("-view")]
    assert len(api.volumes_alive) == 1
    if os.geteuid() != 0:  # as root they lived on the invocation's own tmpfs
        assert (tmp_path / "01" / "upper").is_dir()
        assert (tmp_path / "01" / "work").is_dir()
    assert not (tmp_path / "01").is_mount()
    mounts = api.last_body["HostConfig"]["Mounts"]
    assert mounts[0]["Type"] == "volume"
    assert mounts[0]["Target"] == "/query/repo"
    assert await runner.reconcile() == 0
    assert api.volumes_alive == {}


async def test_failed_prep_falls_back_to_tmpfs_copy(tmp_path):
    runner, api = make(materialize="overlay")
    api.prep_exit = 1
    report = await runner.run(invocation(tmp_path))
    assert report.failure is None
    assert api.last_body["HostConfig"]["Mounts"][0]["Target"] == "/awf/seed"
    assert api.volumes_alive == {}
    assert not (tmp_path / "0123abcd" / "upper").exists()


async def test_warm_reports_readiness(tmp_path):
    runner, _api = make(materialize="overlay")
    assert await runner.warm([tmp_path / "seed"]) == {str(tmp_path / "seed"): True}
    runner_tmpfs, _ = make(materialize="tmpfs")
    assert await runner_tmpfs.warm([tmp_path / "seed"]) == {}


async def test_timings_are_collected_from_logs(tmp_path):
    options = RunnerOptions(("--timings",), collect_timings=True, materialize="tmpfs")
    runner, api = make(options=options)
    report = await runner.run(invocation(tmp_path))
    assert report.phases["materialize"] == 0.5
    assert report.phases["run"] == 0.25
    assert api.last_body["Cmd"] == ["--timings"]


async def test_preflight_runs_a_probe(tmp_path):
    runner, api = make("gvisor")
    await runner.preflight()
    assert api.last_body["HostConfig"]["Runtime"] == "runsc"
    assert api.last_body["Entrypoint"][-2:] == ["-c", "pass"]
    assert api.containers_alive == set()


async def test_preflight_probe_failure(tmp_path):
    runner, api = make("gvisor")
    api.exit_code = 1
    with pytest.raises(RunnerUnavailable, match="exited with 1"):
        await runner.preflight()
    assert api.containers_alive == set()


async def test_preflight_never_falls_back(tmp_path):
    runner, api = make("gvisor")
    del api.runtimes["runsc"]
    with pytest.raises(RunnerUnavailable, match="not registered"):
        await runner.preflight()
    assert api.calls == []


async def test_reconcile_removes_listed_containers_and_raises_on_failure(tmp_path):
    runner, api = make()
    api.containers_alive = {"x", "y"}
    api.listed = [{"Id": "x"}, {"Id": "y"}]
    assert await runner.reconcile() == 2
    api.listed = [{"Id": "z"}]
    api.fail_remove = 2
    with pytest.raises(RunnerUnavailable, match="cannot remove"):
        await runner.reconcile()


def test_unknown_materialize_mode():
    with pytest.raises(ValueError, match="materialize"):
        RunnerOptions(materialize="copy-everything")


def test_runner_refuses_sbx():
    cfg = RunnerSettings("sbx", "ab" * 16, "img", 30, MEMORY)
    with pytest.raises(ValueError, match="cannot launch"):
        DockerRunner(cfg)


async def test_cancellation_still_removes(tmp_path, autojump_clock):
    runner, api = make()
    api.block_wait = True
    with trio.move_on_after(0.5):
        await runner.run(invocation(tmp_path))
    assert api.containers_alive == set()


async def test_page_cache_pin_starts_once_and_reconcile_resets_it(tmp_path):
    runner, api = make(options=RunnerOptions(materialize="tmpfs"))
    assert await runner.warm([]) == {}
    assert runner.page_cache_pinned is True
    assert runner.degradations() == ()  # pinned: nothing to report
    pin = api.calls[0]
    assert pin == ("create", "bq-abababababababab-pin")
    body = api.last_body
    assert body["Labels"]["bounded-query.role"] == "page-cache-pin"
    assert body["HostConfig"]["CapDrop"] == ["ALL"]
    assert body["HostConfig"]["NetworkMode"] == "none"
    assert body["HostConfig"]["CapAdd"] == ["CAP_IPC_LOCK"]  # and nothing else
    assert body["HostConfig"]["ReadonlyRootfs"] is True
    report = await runner.run(invocation(tmp_path))
    assert report.failure is None
    assert [c for c in api.calls if c[0] == "create"].count(pin) == 1  # not started again
    api.listed = [{"Id": cid} for cid in sorted(api.containers_alive)]
    await runner.reconcile()
    assert runner.page_cache_pinned is None


async def test_a_pin_that_never_gets_ready_is_removed(tmp_path, monkeypatch):
    from bounded_query.sandbox import docker_runner

    monkeypatch.setattr(docker_runner, "PIN_TIMEOUT_S", 0.3)
    runner, api = make(options=RunnerOptions(materialize="tmpfs"))
    api.pin_logs = b""
    api.running = True
    assert await runner.warm([]) == {}
    assert api.containers_alive == set()
    api.running = False
    report = await runner.run(invocation(tmp_path))
    assert report.failure is None  # queries still run, unpinned
    assert runner.page_cache_pinned is False
    assert api.containers_alive == set()
    # ... and the operator is told (the broker's readiness file, then a degraded event).
    (missing,) = runner.degradations()
    assert missing.subsystem == "page-cache pin"
    assert "cross-invocation channel" in missing.reason


async def test_a_pin_that_dies_is_noticed_before_the_next_query_and_by_watch(tmp_path):
    """Removed from outside mid-run: no query container starts any more, and watch returns."""
    runner, api = make(options=RunnerOptions(materialize="tmpfs"))
    await runner.warm([])
    assert runner.page_cache_pinned is True
    assert (await runner.run(invocation(tmp_path))).failure is None
    api.containers_alive.discard(api.names[runner.pin_name])  # `docker rm -f` by someone else
    creates = [c for c in api.calls if c[0] == "create"]
    report = await runner.run(invocation(tmp_path, "4567cdef"))
    assert report.failure == "runner-internal"
    assert [c for c in api.calls if c[0] == "create"] == creates, "no query container started"
    with trio.fail_after(1):
        lost = await runner.watch()
    assert lost.subsystem == "page-cache pin"
    assert "stopped during the run" in lost.reason
    assert runner.degradations() == (lost,)


async def test_watch_polls_the_pin_between_queries(tmp_path, autojump_clock):
    from bounded_query.sandbox.docker_runner import PIN_WATCH_S

    runner, api = make(options=RunnerOptions(materialize="tmpfs"))

    async def inline(fn, *args, **kwargs):  # no worker thread: the mock clock stays exact
        return fn(*args, **kwargs)

    runner._call = inline
    await runner.warm([])
    async with trio.open_nursery() as nursery:
        found: list[object] = []

        async def watch() -> None:
            found.append(await runner.watch())

        nursery.start_soon(watch)
        await trio.sleep(10 * PIN_WATCH_S)
        assert found == [], "a running pin is no loss"
        api.containers_alive.discard(api.names[runner.pin_name])
        await trio.sleep(PIN_WATCH_S * 1.5)
        assert len(found) == 1
    assert runner.page_cache_pinned is False


async def test_a_pin_that_never_started_is_no_loss_for_watch(tmp_path, autojump_clock):
    runner, api = make(options=RunnerOptions(materialize="tmpfs"))
    api.fail_create = True
    await runner.warm([])
    assert runner.page_cache_pinned is False
    with trio.move_on_after(60) as scope:
        await runner.watch()
    assert scope.cancelled_caught
