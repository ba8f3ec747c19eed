"""The sweep of roots left by a killed harness (harness/lifecycle/sweep.py).

* Owner records: written at root creation (0600, mode ``run`` or
  ``compose``), read without following symlinks.
* The sweep decision: a dead owner, another boot or a reused PID (right
  PID, wrong start time) means removal; a live owner, a compose project, a
  PID from another namespace, a missing record, a symlinked or foreign
  root mean the root is kept.
* Removal handles a read-only seed tree, the ingress root with the same
  suffix and (as root; failing instead of skipping under CI=true) a mounted
  workspace tmpfs.
* End to end: a harness killed with SIGKILL mid-run together with its
  reaper (``reaper.py`` removes them otherwise) leaves its roots and its
  tmpfs; the next ``run`` on the same base removes them.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest

from bounded_query.broker.mounts import mount_tmpfs
from bounded_query.harness.lifecycle.options import RunOptions
from bounded_query.harness.lifecycle.paths import RunPaths, run_paths
from bounded_query.harness.lifecycle.quota import WorkQuota
from bounded_query.harness.lifecycle.sweep import (
    MODE_COMPOSE,
    MODE_RUN,
    OWNER_RECORD,
    OwnerRecord,
    current_owner,
    owner_is_gone,
    process_start_time,
    read_owner_record,
    sweep_stale_roots,
    write_owner_record,
)
from bounded_query.harness.records.events import EventSink
from bounded_query.harness.staging.outputs import create_ingress_root
from bounded_query.harness.staging.seeds import create_private_root
from tests.harness.bq_harness_helpers import (
    killable_harness,
    live_pids_with,
    make_repo,
    mounts_under,
    require_root,
    run_with_fake_broker,
)
from tests.harness.bq_harness_helpers import (
    mount_safe_base as sweep_base,
)

UID = os.getuid()


def _stamp(record: dict[str, object]) -> dict[str, object]:
    """The fixed leading keys of an event (their values are not under test here)."""
    return {"_schema": "bounded-query-event/v1", "timestamp": record["timestamp"]}


def dead_pid() -> int:
    """The PID of a process that has exited and been reaped."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def make_roots(base: Path, name: str, record: OwnerRecord | None) -> RunPaths:
    """Both roots as a run leaves them: a read-only seed, a sealed skill dir."""
    paths = run_paths(UID, Path(f"/work/{name}"), name, base)
    create_private_root(paths)
    if record is not None:
        write_owner_record(paths.private_root, record)
    seed = paths.seeds_dir / "0123456789abcdef0123456789abcdef"
    (seed / "src").mkdir(parents=True)
    (seed / "src" / "secret.py").write_text("TOKEN = 'private source'\n")
    for path in (seed / "src" / "secret.py", seed / "src", seed):
        os.chmod(path, 0o444 if path.is_file() else 0o555)
    paths.seed_map.write_text("{}")
    create_ingress_root(paths)
    (paths.wrapper_dir / "bounded-query").write_text("#!/bin/sh\n")
    for path in (paths.wrapper_dir / "bounded-query", paths.wrapper_dir, paths.skill_dir):
        os.chmod(path, 0o555)
    return paths


def record(mode: str = MODE_RUN, **changes: object) -> OwnerRecord:
    doc = {**current_owner(mode).to_doc(), **changes}
    parsed = OwnerRecord.from_doc(doc)
    assert parsed is not None
    return parsed


def sweep(base: Path) -> list[dict[str, object]]:
    stream = io.StringIO()
    sweep_stale_roots(base, UID, EventSink(stream))
    text = stream.getvalue()
    assert str(base) not in text  # events carry the suffix only, never a path
    return [json.loads(line) for line in text.splitlines()]


def exists(paths: RunPaths) -> tuple[bool, bool]:
    return paths.private_root.exists(), paths.ingress_root.exists()


# -- owner records ---------------------------------------------------------


def test_owner_record_is_private_and_round_trips(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    mine = current_owner(MODE_COMPOSE)
    write_owner_record(root, mine)
    assert os.stat(root / OWNER_RECORD).st_mode & 0o777 == 0o600
    assert os.stat(root / OWNER_RECORD.parent).st_mode & 0o777 == 0o700
    assert read_owner_record(root, UID) == mine
    assert mine.pid == os.getpid()
    assert mine.start_time == process_start_time(os.getpid())
    assert read_owner_record(root, UID + 1) is None  # not this user's file


def test_owner_record_behind_a_symlink_is_not_read(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write_owner_record(elsewhere, current_owner(MODE_RUN))
    root = tmp_path / "root"
    root.mkdir()
    (root / "control").symlink_to(elsewhere / "control")
    assert read_owner_record(root, UID) is None
    assert read_owner_record(tmp_path / "missing", UID) is None


@pytest.mark.parametrize(
    "doc",
    [
        {"version": 2, "mode": "run", "pid": 1, "startTime": 1, "bootId": "", "pidNamespace": ""},
        {"version": 1, "mode": "other", "pid": 1, "startTime": 1, "bootId": "", "pidNamespace": ""},
        {"version": 1, "mode": "run", "pid": "1", "startTime": 1, "bootId": "", "pidNamespace": ""},
        {"version": 1, "mode": "run", "pid": 0, "startTime": 1, "bootId": "", "pidNamespace": ""},
        {
            "version": 1,
            "mode": "run",
            "pid": 1,
            "startTime": True,
            "bootId": "",
            "pidNamespace": "",
        },
        [],
    ],
)
def test_invalid_owner_records_are_rejected(doc):
    assert OwnerRecord.from_doc(doc) is None


def test_owner_is_gone_decisions():
    mine = current_owner(MODE_RUN)
    assert owner_is_gone(mine) is None
    reused = record(startTime=mine.start_time + 1)
    assert owner_is_gone(reused) == "owner exited; its pid was reused"
    assert owner_is_gone(record(pid=dead_pid())) == "owner exited"
    assert owner_is_gone(record(bootId="another-boot", pid=dead_pid())) == (
        "owner ran before a reboot"
    )
    # A PID from another namespace proves nothing here.
    assert owner_is_gone(record(pidNamespace="pid:[1]", pid=dead_pid())) is None
    assert owner_is_gone(record(MODE_COMPOSE, pid=dead_pid())) is None
    zombie = subprocess.Popen(["true"])
    try:
        deadline = time.monotonic() + 10
        while process_start_time(zombie.pid) is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process_start_time(zombie.pid) is None  # a zombie counts as gone
    finally:
        zombie.wait()


# -- the sweep ---------------------------------------------------------------


def test_roots_of_a_dead_owner_are_removed_read_only_seed_and_all():
    with sweep_base() as base:
        paths = make_roots(base, "dead", record(pid=dead_pid()))
        assert exists(paths) == (True, True)
        events = sweep(base)
        assert exists(paths) == (False, False)
        assert list(base.iterdir()) == []
    suffix = paths.private_root.name.rsplit("-", 2)[-2:]
    assert events == [
        {
            **_stamp(events[0]),
            "event": "stale_root_removed",
            "root": "-".join(suffix),
            "reason": "owner exited",
            "engine": "not-attempted",
        },
        {
            **_stamp(events[1]),
            "event": "stale_roots_swept",
            "removed": 1,
            "live": 0,
            "compose": 0,
            "skipped": 0,
            "failed": 0,
        },
    ]


def test_pid_reuse_is_detected_and_the_roots_removed():
    with sweep_base() as base:
        mine = current_owner(MODE_RUN)
        paths = make_roots(base, "reused", record(startTime=mine.start_time + 1))
        events = sweep(base)
        assert exists(paths) == (False, False)
    assert events[0]["reason"] == "owner exited; its pid was reused"


def test_roots_of_a_live_owner_are_kept():
    with sweep_base() as base:
        paths = make_roots(base, "live", current_owner(MODE_RUN))
        events = sweep(base)
        assert exists(paths) == (True, True)
    assert [e["event"] for e in events] == ["stale_roots_swept"]
    assert events[0]["live"] == 1
    assert events[0]["removed"] == 0


def test_compose_roots_are_never_swept():
    with sweep_base() as base:
        paths = make_roots(base, "compose", record(MODE_COMPOSE, pid=dead_pid()))
        events = sweep(base)
        assert exists(paths) == (True, True)
    assert [e["event"] for e in events] == ["stale_roots_swept"]
    assert events[0]["compose"] == 1


def test_a_root_without_owner_record_is_kept_and_reported():
    with sweep_base() as base:
        paths = make_roots(base, "legacy", None)
        events = sweep(base)
        assert exists(paths) == (True, True)
    assert events[0]["event"] == "stale_root_skipped"
    assert events[0]["reason"] == "no readable owner record"
    assert events[1]["skipped"] == 1


def test_symlinks_and_foreign_names_are_never_followed(tmp_path):
    with sweep_base() as base:
        # A real dead-owner root somewhere else, reachable through a symlink
        # that carries a private-root name.
        target = make_roots(tmp_path, "target", record(pid=dead_pid()))
        link = base / target.private_root.name
        link.symlink_to(target.private_root)
        # A dead-owner root of another uid's name, and a misnamed one.
        other = make_roots(base, "other", record(pid=dead_pid()))
        foreign = base / other.private_root.name.replace(f"-{UID}-", f"-{UID + 1}-")
        other.private_root.rename(foreign)
        misnamed = base / (target.private_root.name + "x")
        misnamed.mkdir()
        events = sweep(base)
        assert link.is_symlink()
        assert exists(target) == (True, True)
        assert foreign.is_dir()
        assert misnamed.is_dir()
    assert events == []


def test_an_ingress_symlink_keeps_the_pair():
    with sweep_base() as base:
        paths = make_roots(base, "ingress", record(pid=dead_pid()))
        outside = base / "outside"
        paths.ingress_root.rename(outside)
        paths.ingress_root.symlink_to(outside)
        events = sweep(base)
        assert paths.private_root.is_dir()
        assert (outside / "skill" / "bin" / "bounded-query").exists()
    assert events[0]["event"] == "stale_root_skipped"


def test_a_mounted_workspace_tmpfs_is_unmounted_and_removed():
    require_root()
    with sweep_base() as base:
        paths = make_roots(base, "mounted", record(pid=dead_pid()))
        paths.workspaces_dir.mkdir(mode=0o700)
        mount_tmpfs(paths.workspaces_dir, WorkQuota(16 * 1024**2, 1024).options)
        (paths.workspaces_dir / "leftover").write_text("query output\n")
        assert mounts_under(base) == [str(paths.workspaces_dir)]
        events = sweep(base)
        assert mounts_under(base) == []
        assert exists(paths) == (False, False)
    assert events[0]["event"] == "stale_root_removed"


def test_a_busy_tmpfs_is_detached_and_the_roots_removed():
    require_root()
    with sweep_base() as base:
        paths = make_roots(base, "busy", record(pid=dead_pid()))
        paths.workspaces_dir.mkdir(mode=0o700)
        mount_tmpfs(paths.workspaces_dir, WorkQuota(16 * 1024**2, 1024).options)
        fd = os.open(paths.workspaces_dir / "held", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            events = sweep(base)
            assert mounts_under(base) == []
            assert exists(paths) == (False, False)
        finally:
            os.close(fd)
    assert events[0]["event"] == "stale_root_removed"


def test_the_dead_runs_engine_objects_are_reconciled_first():
    calls: list[tuple[str, bool]] = []
    with sweep_base() as base:
        named = make_roots(base, "named", record(pid=dead_pid(), runId="ab" * 16))
        older = make_roots(base, "older", record(pid=dead_pid()))

        def reconcile(run_id: str) -> None:
            calls.append((run_id, named.private_root.exists()))

        stream = io.StringIO()
        sweep_stale_roots(base, UID, EventSink(stream), reconcile)
        events = [json.loads(line) for line in stream.getvalue().splitlines()]
        assert exists(named) == (False, False)
        assert exists(older) == (False, False)
    # Only the record that names its run is reconciled, before its root goes.
    assert calls == [("ab" * 16, True)]
    engines = sorted(e["engine"] for e in events if e["event"] == "stale_root_removed")
    assert engines == ["not-attempted", "reconciled"]


def test_a_failed_reconcile_is_reported_and_the_root_still_goes():
    def reconcile(run_id: str) -> None:
        raise ConnectionError("engine down")

    with sweep_base() as base:
        paths = make_roots(base, "named", record(pid=dead_pid(), runId="cd" * 16))
        stream = io.StringIO()
        sweep_stale_roots(base, UID, EventSink(stream), reconcile)
        assert exists(paths) == (False, False)
    first = json.loads(stream.getvalue().splitlines()[0])
    assert first["event"] == "stale_root_removed"
    assert first["engine"] == "failed: ConnectionError"


def test_a_live_owners_run_is_never_reconciled():
    calls: list[str] = []
    with sweep_base() as base:
        paths = make_roots(base, "live", current_owner(MODE_RUN, "ef" * 16))
        sweep_stale_roots(base, UID, EventSink(io.StringIO()), calls.append)
        assert exists(paths) == (True, True)
    assert calls == []


@pytest.mark.parametrize("run_id", ["", "ab" * 16])
def test_the_run_id_round_trips_and_a_hostile_one_is_refused(run_id):
    mine = current_owner(MODE_RUN, run_id)
    assert OwnerRecord.from_doc(mine.to_doc()) == mine
    assert ("runId" in mine.to_doc()) == bool(run_id)
    for hostile in ("x", "AB" * 16, "ab" * 40, 7, "ab=cd", "a" * 7):
        assert OwnerRecord.from_doc({**mine.to_doc(), "runId": hostile}) is None


@pytest.mark.engine
def test_sweep_removes_the_dead_runs_query_containers_and_volumes(docker_client):
    from bounded_query.broker.protocol.policy import LABEL_RUN
    from bounded_query.harness.lifecycle.reconcile import reconcile_containers

    dead_run, other_run = secrets.token_hex(16), secrets.token_hex(16)
    made_containers, made_volumes = [], []
    try:
        for run in (dead_run, other_run):
            made_volumes.append(
                docker_client.volumes.create(f"bq-sweep-test-{run}", labels={LABEL_RUN: run})
            )
            container = docker_client.containers.create(
                "bounded-query-python:latest",
                ["sleep", "300"],
                labels={LABEL_RUN: run},
                network_mode="none",
            )
            container.start()  # a query whose broker died: nothing else would stop it
            made_containers.append(container)
        with sweep_base() as base:
            paths = make_roots(base, "dead", record(pid=dead_pid(), runId=dead_run))
            reconcile = functools.partial(reconcile_containers, "unix:///var/run/docker.sock")
            sweep_stale_roots(base, UID, EventSink(io.StringIO()), reconcile)
            assert exists(paths) == (False, False)
        left = {c.id for c in docker_client.containers.list(all=True, filters={"label": LABEL_RUN})}
        assert made_containers[0].id not in left
        assert made_containers[1].id in left
        volumes = {v.name for v in docker_client.volumes.list(filters={"label": LABEL_RUN})}
        assert f"bq-sweep-test-{dead_run}" not in volumes
        assert f"bq-sweep-test-{other_run}" in volumes
    finally:
        for container in made_containers:
            with contextlib.suppress(Exception):
                container.remove(force=True)
        for volume in made_volumes:
            with contextlib.suppress(Exception):
                volume.remove(force=True)


# -- end to end: SIGKILL, then the next run ----------------------------------


def kill_harness_mid_run(
    tmp_path: Path, base: Path, config: Path, source: Path, docker_host: str
) -> None:
    """SIGKILL the harness *and its reaper* (the reaper first, so it never reaps):
    what an OOM kill of the whole job or a power cut leaves for the sweep."""
    with killable_harness(tmp_path, config, source, base, docker_host) as (
        harness,
        _agent,
        reaper,
    ):
        os.kill(reaper, signal.SIGKILL)
        harness.kill()
        harness.wait(timeout=10)
    deadline = time.monotonic() + 10
    while live_pids_with(str(base).encode()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in live_pids_with(str(base).encode()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def test_next_run_sweeps_the_roots_of_a_sigkilled_harness(tmp_path, fake_engine):
    source = tmp_path / "src"
    make_repo(source, {"README.md": "hi\n"})
    config = tmp_path / "c.json"
    section = {
        "enabled": True,
        "memoryLimit": "64m",
        "privateRepos": [{"repo": "octo/alpha", "sensitivity": "internal"}],
    }
    config.write_text(json.dumps({"boundedQueries": section}))
    with sweep_base() as base:
        kill_harness_mid_run(tmp_path, base, config, source, fake_engine.docker_host)
        left = sorted(p.name for p in base.iterdir())
        assert len(left) == 2  # the private and the ingress root
        private = next(base / n for n in left if "-private-" in n)
        seeds = list((private / "seeds").iterdir())
        assert len(seeds) == 1
        assert (private / OWNER_RECORD).is_file()
        if os.geteuid() == 0:
            assert mounts_under(base) == [str(private / "work")]
        status, events = await run_with_fake_broker(
            config, source, tmp_path, base, ("true",), docker_host=fake_engine.docker_host
        )
        assert mounts_under(base) == []
        assert list(base.iterdir()) == []
    assert status == 0, events
    removed = [e for e in events if e["event"] == "stale_root_removed"]
    # The record named the run, so its engine objects were reconciled (or the
    # attempt was reported, where no engine answers).
    engine = str(removed[0].get("engine", ""))
    assert engine == "reconciled" or engine.startswith("failed: "), removed
    assert removed == [
        {
            **_stamp(removed[0]),
            "event": "stale_root_removed",
            "root": private.name.removeprefix("awf-bounded-query-private-"),
            "reason": "owner exited",
            "engine": engine,
        }
    ]
    names = [e["event"] for e in events]
    assert names.index("stale_roots_swept") < names.index("preflight_passed")


async def test_compose_prepare_sweeps_and_marks_its_roots_compose(tmp_path, fake_engine):
    from bounded_query.harness.lifecycle.prepare import prepare
    from bounded_query.harness.records.notices import load_reported
    from bounded_query.harness.staging.outputs import remove_roots

    source = tmp_path / "src"
    make_repo(source, {"README.md": "hi\n"})
    config = tmp_path / "c.json"
    section = {"enabled": True, "privateRepos": [{"repo": "octo/alpha", "sensitivity": "internal"}]}
    config.write_text(json.dumps({"boundedQueries": section}))
    stream = io.StringIO()
    sink = EventSink(stream)
    with sweep_base() as base:
        stale = make_roots(base, "stale", record(pid=dead_pid()))
        loaded = load_reported(str(config), sink)
        assert loaded is not None
        options = RunOptions(
            config_source=str(config),
            agent=(),
            seed_sources={"octo/alpha": source},
            workspace=tmp_path,
            base=base,
            probe_runtime=False,
        )
        env = {"PATH": os.environ["PATH"], "DOCKER_HOST": fake_engine.docker_host}
        prepared = await prepare(options, loaded, env, sink)
        assert prepared is not None
        try:
            assert exists(stale) == (False, False)
            owner = read_owner_record(prepared.paths.private_root, UID)
            assert owner is not None
            assert owner.mode == MODE_COMPOSE
            assert owner.pid == os.getpid()
            # Even once its creator is gone, a compose project's roots stay.
            write_owner_record(prepared.paths.private_root, record(MODE_COMPOSE, pid=dead_pid()))
            sweep(base)
            assert exists(prepared.paths) == (True, True)
        finally:
            remove_roots(prepared.paths)
    names = [json.loads(line)["event"] for line in stream.getvalue().splitlines()]
    assert names.index("stale_root_removed") < names.index("preflight_passed")
