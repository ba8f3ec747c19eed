"""The workspace quota tmpfs (harness/lifecycle/quota.py) and the broker's parent-death signal.

* Pure sizing, and the degraded path (a mount that cannot be made is
  reported, never fatal).
* As root, without an engine: the real mount/unmount calls, including the
  lazy unmount of a busy tmpfs, and a full run with the fake broker in
  which the agent sees the tmpfs mounted and nothing is left afterwards.
* A harness process killed with SIGKILL: its broker child goes too.
* With the engine (runc and runsc): the real broker's overlay works with the
  upper layer on the tmpfs; a query writing twice the quota into
  ``/query/repo`` fails with ENOSPC inside and gets the canonical error; the
  broker keeps serving; the tmpfs and the private root are gone afterwards.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import trio

from bounded_query.broker.mounts import mount_tmpfs, unmount
from bounded_query.harness import RunOptions, run
from bounded_query.harness.lifecycle.quota import (
    WORK_QUOTA_MIN_BYTES,
    WorkQuota,
    mount_work_quota,
    work_quota,
    work_quota_bytes,
)
from bounded_query.harness.records.events import EventSink
from bounded_query.harness.records.usage import render_summary, usage_from_state
from tests.harness.bq_harness_helpers import (
    HOST_AGENT,
    cmdlines,
    killable_harness,
    live_pids_with,
    make_repo,
    mounts_under,
    require_root,
    run_with_fake_broker,
)
from tests.harness.bq_harness_helpers import (
    mount_safe_base as quota_base,
)

MiB = 1024**2


# -- pure -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        (6 * MiB, WORK_QUOTA_MIN_BYTES),
        (32 * MiB, WORK_QUOTA_MIN_BYTES),
        (512 * MiB, 256 * MiB),
        (1024 * MiB, 512 * MiB),
    ],
)
def test_quota_is_half_the_memory_limit_with_a_floor(memory, expected):
    assert work_quota_bytes(memory) == expected
    quota = work_quota(memory)
    assert quota.size_bytes == expected
    assert quota.inodes == expected // 1024
    assert quota.options == f"size={expected},nr_inodes={expected // 1024},mode=700"


def test_quota_below_the_floor_is_refused():
    with pytest.raises(ValueError, match="too small"):
        WorkQuota(WORK_QUOTA_MIN_BYTES - 1, 100)


async def test_a_failed_mount_is_reported_degraded_not_fatal(tmp_path):
    stream = io.StringIO()
    sink = EventSink(stream)
    # The parent does not exist: creating the mount point fails (as root or not).
    mounted = await mount_work_quota(tmp_path / "missing" / "work", 128 * MiB, sink)
    assert mounted is False
    [note] = sink.degraded
    assert note.startswith("workspace quota: no 64 MiB tmpfs for query workspaces")
    [event] = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert event["event"] == "degraded"
    assert event["subsystem"] == "workspace quota"
    assert str(tmp_path) not in stream.getvalue()  # no private-root paths in events
    markdown = render_summary(
        usage_from_state([("octo/alpha", "internal")], b"", b""),
        exit_code=0,
        runtime="docker",
        degraded=sink.degraded,
    )
    assert "**Degraded mode**" in markdown
    assert "> - workspace quota: no 64 MiB tmpfs for query workspaces" in markdown


# -- root, no engine --------------------------------------------------------


def fill(fd: int) -> None:
    """Write until the file system refuses (raises its OSError)."""
    chunk = b"x" * MiB
    for _ in range(4 * WORK_QUOTA_MIN_BYTES // MiB):
        os.write(fd, chunk)


def test_mount_has_the_quota_and_a_busy_tmpfs_is_detached(tmp_path):
    require_root()
    with quota_base() as base:
        target = base / "work"
        target.mkdir(mode=0o700)
        mount_tmpfs(target, work_quota(32 * MiB).options)
        assert mounts_under(base) == [str(target)]
        info = os.statvfs(target)
        assert info.f_blocks * info.f_frsize == WORK_QUOTA_MIN_BYTES
        assert info.f_files == WORK_QUOTA_MIN_BYTES // 1024
        assert os.stat(target).st_mode & 0o7777 == 0o700
        fd = os.open(target / "big", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            with pytest.raises(OSError, match="No space left") as caught:
                fill(fd)
        finally:
            os.close(fd)
        assert caught.value.errno == errno.ENOSPC
        assert os.stat(target / "big").st_size == WORK_QUOTA_MIN_BYTES
        fd = os.open(target / "big", os.O_RDONLY)
        try:
            assert unmount(target) == "detached"  # busy: an open file
            assert mounts_under(base) == []
        finally:
            os.close(fd)
        assert unmount(target) == "absent"
        target.rmdir()


async def test_work_quota_is_a_shared_mount_for_the_compose_broker():
    """Issue 9: the compose broker's rshared bind of work/ needs a shared mount there."""
    require_root()
    with quota_base() as base:
        target = base / "work"
        sink = EventSink(io.StringIO())
        assert await mount_work_quota(target, 64 * MiB, sink)
        try:
            lines = (await trio.Path("/proc/self/mountinfo").read_text()).splitlines()
            (line,) = [ln for ln in lines if ln.split()[4] == str(target)]
            optional = line.split(" - ")[0].split()[6:]
            assert any(field.startswith("shared:") for field in optional), line
            # a mount below it (an invocation's tmpfs) works and goes with it
            (target / "inv").mkdir()
            mount_tmpfs(target / "inv", work_quota(32 * MiB).options)
            assert mounts_under(base) == [str(target), str(target / "inv")]
        finally:
            assert unmount(target) == "detached"  # busy with the submount
        assert mounts_under(base) == []
        target.rmdir()


def test_unmount_of_a_plain_directory_is_absent(tmp_path):
    if os.geteuid() != 0:
        with pytest.raises(PermissionError):
            unmount(tmp_path)
        return
    assert unmount(tmp_path) == "absent"


QUOTA_PROBE_AGENT = r"""
import json, sys
base, out = sys.argv[1], sys.argv[2]
points = [line.split()[4] for line in open("/proc/self/mountinfo")]
json.dump([p for p in points if p.startswith(base + "/")], open(out, "w"))
"""


async def test_fake_broker_run_mounts_the_quota_and_removes_it(tmp_path, fake_engine):
    require_root()
    source = tmp_path / "src"
    make_repo(source, {"README.md": "hi\n"})
    config = tmp_path / "c.json"
    section = {
        "enabled": True,
        "memoryLimit": "64m",
        "privateRepos": [{"repo": "octo/alpha", "sensitivity": "internal"}],
    }
    config.write_text(json.dumps({"boundedQueries": section}))
    (tmp_path / "agent.py").write_text(QUOTA_PROBE_AGENT)
    report = tmp_path / "mounts.json"
    with quota_base() as base:
        agent = (sys.executable, str(tmp_path / "agent.py"), str(base), str(report))
        status, events = await run_with_fake_broker(
            config, source, tmp_path, base, agent, docker_host=fake_engine.docker_host
        )
        assert mounts_under(base) == []
        assert list(base.iterdir()) == []
    assert status == 0, events
    [seen] = json.loads(report.read_text())
    assert seen.endswith("/work")
    assert "awf-bounded-query-private-" in seen
    names = [e["event"] for e in events]
    mounted = events[names.index("work_quota_mounted")]
    assert mounted["sizeBytes"] == 32 * MiB
    assert names.index("work_quota_mounted") < names.index("broker_started")
    unmounted = events[names.index("work_quota_unmounted")]
    assert unmounted["how"] == "unmounted"
    assert names.index("broker_stopped") < names.index("work_quota_unmounted")
    assert names.index("work_quota_unmounted") < names.index("roots_removed")
    # Only the (deliberately unconfined) host agent is degraded, never the quota.
    assert [e for e in events if e["event"] == "degraded" and e["subsystem"] != "agent"] == []


# -- SIGKILL of the harness -------------------------------------------------


def threads_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def test_broker_child_dies_with_a_sigkilled_harness(tmp_path, fake_engine):
    source = tmp_path / "src"
    make_repo(source, {"README.md": "hi\n"})
    config = tmp_path / "c.json"
    section = {"enabled": True, "privateRepos": [{"repo": "octo/alpha", "sensitivity": "internal"}]}
    config.write_text(json.dumps({"boundedQueries": section}))
    with quota_base() as base:
        try:
            with killable_harness(tmp_path, config, source, base, fake_engine.docker_host) as (
                harness,
                _agent,
                _reaper,
            ):
                broker = live_pids_with(b"tests.fakes.broker_main")
                broker = [
                    p
                    for p in broker
                    if str(base).encode() in Path(f"/proc/{p}/cmdline").read_bytes()
                ]
                assert len(broker) == 1
                # Wait until trio's worker threads (staging ran in one) have
                # retired: the parent-death signal follows the forking *thread*,
                # so a broker forked by a worker would be stopped right here.
                deadline = time.monotonic() + 30
                while threads_of(harness.pid) > 1 and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert threads_of(harness.pid) == 1
                assert [p for p in live_pids_with(str(base).encode()) if p != harness.pid] == broker
                harness.kill()
                harness.wait(timeout=10)
                deadline = time.monotonic() + 10
                while live_pids_with(str(base).encode()) and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert live_pids_with(str(base).encode()) == []
        finally:
            for pid in live_pids_with(str(base).encode()):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    assert not any(str(base).encode() in line for line in cmdlines())


# -- engine: the real broker, runc and runsc --------------------------------

#: Small memory limit, so the quota (half of it) is small: 64 MiB.
ENGINE_MEMORY = "128m"
ENGINE_QUOTA = 64 * MiB
#: Twice the quota into /query/repo, in files below RLIMIT_FSIZE (= memory).
FLOOD = (
    "chunk = b'x' * (1 << 20)\n"
    f"for i in range({2 * ENGINE_QUOTA // (16 * MiB)}):\n"
    "    with open(f'/query/repo/big{i}', 'wb') as f:\n"
    "        for _ in range(16):\n"
    "            f.write(chunk)\n"
    "open('/query/out', 'w').write('true')\n"
)
#: The same flood, reporting the errno that stopped it (0: nothing did). The
#: answer file shares the quota, so the script frees the space first.
FLOOD_ERRNO = (
    "import glob, json, os\n"
    "code = 0\n"
    "try:\n"
    + "".join(f"    {line}\n" for line in FLOOD.splitlines()[:-1])
    + "except OSError as exc:\n"
    "    code = exc.errno\n"
    "for name in glob.glob('/query/repo/big*'):\n"
    "    os.remove(name)\n"
    "json.dump(code, open('/query/out', 'w'))\n"
)
README = (
    "import json, os\njson.dump(os.path.exists('/query/repo/README.md'), open('/query/out', 'w'))\n"
)
ENGINE_AGENT = r"""
import json, subprocess, sys
base, out, flood, flood_errno, readme = sys.argv[1:6]
def ask(script, schema):
    done = subprocess.run(["bounded-query", "--repo", "octo/alpha", "--schema", json.dumps(schema)],
                          input=open(script, "rb").read(), capture_output=True, check=True)
    return done.stdout.decode()
points = [line.split()[4] for line in open("/proc/self/mountinfo")]
answers = [
    ask(flood, {"type": "boolean"}),
    ask(flood_errno, {"type": "integer", "minimum": 0, "maximum": 63}),
    ask(readme, {"type": "boolean"}),
]
json.dump({"answers": answers, "mounts": [p for p in points if p.startswith(base + "/")]},
          open(out, "w"))
"""


@pytest.mark.engine
@pytest.mark.parametrize("mode", ["docker", "gvisor", "compose"])
async def test_query_past_the_quota_gets_enospc_and_the_broker_keeps_serving(
    docker_client, tmp_path, mode
):
    """``compose``: the broker container sees the host tmpfs through its recursive bind."""
    from bounded_query.harness.compose.service import compose_broker_starter

    runtime = "docker" if mode == "compose" else mode
    starter = compose_broker_starter(None) if mode == "compose" else None
    require_root()
    source = tmp_path / "src"
    make_repo(source, {"README.md": "hi\n"})
    config = tmp_path / "c.json"
    section = {
        "enabled": True,
        "runtime": runtime,
        "memoryLimit": ENGINE_MEMORY,
        "privateRepos": [{"repo": "octo/alpha", "sensitivity": "internal"}],
    }
    config.write_text(json.dumps({"boundedQueries": section}))
    scripts = {"flood": FLOOD, "flood_errno": FLOOD_ERRNO, "readme": README}
    for name, text in scripts.items():
        (tmp_path / f"{name}.py").write_text(text)
    (tmp_path / "agent.py").write_text(ENGINE_AGENT)
    report = tmp_path / "report.json"
    stream = io.StringIO()
    with quota_base() as base:
        options = RunOptions(
            config_source=str(config),
            agent=(
                sys.executable,
                str(tmp_path / "agent.py"),
                str(base),
                str(report),
                *(str(tmp_path / f"{name}.py") for name in scripts),
            ),
            seed_sources={"octo/alpha": source},
            workspace=tmp_path,
            base=base,
            **HOST_AGENT,
        )
        status = await run(options, EventSink(stream), {"PATH": os.environ["PATH"]}, starter)
        assert mounts_under(base) == []
        assert list(base.iterdir()) == []
    events = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert status == 0, events
    result = json.loads(report.read_text())
    assert result["answers"] == [
        '{"status":"error"}\n',
        f'{{"status":"ok","result":{errno.ENOSPC}}}\n',
        '{"status":"ok","result":true}\n',
    ]
    # The run-wide quota on work/, and below it nothing but per-invocation
    # storage: the prepared container's own tmpfs (made at broker start for
    # the next query) is mounted inside work/ while the agent looks.
    [work] = [m for m in result["mounts"] if m.endswith("/work")]
    assert all(m == work or m.startswith(work + "/") for m in result["mounts"])
    mounted = next(e for e in events if e["event"] == "work_quota_mounted")
    assert mounted["sizeBytes"] == ENGINE_QUOTA
    assert next(e for e in events if e["event"] == "work_quota_unmounted")["how"] in (
        "unmounted",
        "detached",
    )
    assert [e for e in events if e["event"] == "degraded" and e["subsystem"] != "agent"] == []
