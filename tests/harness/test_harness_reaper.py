"""The reaper: a run's resources die with its harness (harness/lifecycle/reaper.py; issue 21).

* Messages: every message round-trips; anything else raises our own error
  only (whole and fuzzed); the arm message accepts a pair of run roots only.
* :func:`reap`: kills the watched processes, reconciles only its run id
  (twice when a broker may have had a create in flight), removes only roots
  whose owner record names its run.
* The process: end-of-file without ``done`` reaps, ``done`` does nothing.
* End to end (a real harness process, the fake broker, a host agent): a
  SIGKILL of the harness's whole process group -- the reaper is in its own
  session -- leaves within seconds no agent, no broker, no mount and no root;
  the reaper's environment and command line hold no token, it holds no
  descriptor but its socket and /dev/null/stderr (not the engine lock the
  harness inherited), and as root it keeps five capabilities.
  A run that ends normally leaves its reaper nothing to do.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bounded_query.harness.lifecycle.paths import run_paths
from bounded_query.harness.lifecycle.reaper import (
    KEPT_CAPABILITIES,
    Arm,
    Done,
    ReaperMessageError,
    Watch,
    decode_message,
    reap,
    start_reaper,
)
from bounded_query.harness.lifecycle.sweep import MODE_RUN, current_owner, write_owner_record
from bounded_query.harness.staging.outputs import create_ingress_root
from bounded_query.harness.staging.seeds import create_private_root
from tests.harness.bq_harness_helpers import (
    HARNESS_TESTS_ROOT,
    make_repo,
    mounts_under,
    require_root,
    wait_gone,
)
from tests.harness.bq_harness_helpers import mount_safe_base as reaper_base

UID = os.getuid()
#: The bound every test puts on "within a few seconds" (the reap itself takes
#: well under one; tests/bench/bench_reaper.py measures it).
REAP_LIMIT_S = 15.0
TOKEN = "ghp_reaper" + secrets.token_hex(8)


def run_roots(base: Path, run_id: str, owner_run: str | None = None):
    """Both roots of ``run_id`` with an owner record naming ``owner_run`` (default: itself)."""
    paths = run_paths(UID, Path("/work/reaper"), run_id, base)
    create_private_root(paths)
    record = current_owner(MODE_RUN, owner_run if owner_run is not None else run_id)
    write_owner_record(paths.private_root, record)
    seed = paths.seeds_dir / "0123456789abcdef0123456789abcdef"
    seed.mkdir()
    (seed / "secret.py").write_text("SECRET = 1\n")
    os.chmod(seed / "secret.py", 0o444)
    os.chmod(seed, 0o555)
    create_ingress_root(paths)
    return paths


def arm_for(paths, run_id: str, docker_host: str = "unix:///nonexistent/docker.sock") -> Arm:
    return Arm(run_id, docker_host, str(paths.private_root), str(paths.ingress_root), os.getsid(0))


# -- messages ---------------------------------------------------------------


def test_messages_round_trip():
    with pytest.raises(ReaperMessageError):
        Arm("ab" * 16, "unix:///var/run/docker.sock", "/b/x/y", "/b/x/z", 9)  # not run roots
    paths = run_paths(0, Path("/w"), "ab" * 16, Path("/var/tmp"))
    roots = (str(paths.private_root), str(paths.ingress_root))
    arm = Arm("ab" * 16, "unix:///var/run/docker.sock", *roots, session=4321)
    assert decode_message(arm.encode()) == arm
    assert arm.paths == paths
    for role in ("broker", "agent"):
        assert decode_message(Watch(role).encode()) == Watch(role)
    assert decode_message(Done().encode()) == Done()


@pytest.mark.parametrize(
    "change",
    [
        {"runId": "x"},
        {"runId": "AB" * 16},
        {"privateRoot": "relative/awf-bounded-query-private-0-0123456789abcdef"},
        {"privateRoot": "/elsewhere/awf-bounded-query-private-0-0123456789abcdef"},
        {"privateRoot": "/var/tmp/awf-bounded-query-private-0-0123456789abcdeX"},
        {"ingressRoot": "/var/tmp/awf-bounded-query-ingress-1-0123456789abcdef"},
        {"ingressRoot": "/var/tmp/anything"},
        {"dockerHost": 7},
        {"session": -1},
        {"session": "1"},
        {"session": True},
        {"extra": "x"},
    ],
)
def test_a_bad_arm_message_is_refused(change):
    doc = {
        "runId": "ab" * 16,
        "dockerHost": "unix:///var/run/docker.sock",
        "privateRoot": "/var/tmp/awf-bounded-query-private-0-0123456789abcdef",
        "ingressRoot": "/var/tmp/awf-bounded-query-ingress-0-0123456789abcdef",
        "session": 77,
    }
    assert isinstance(decode_message(json.dumps({"arm": doc}).encode()), Arm)
    with pytest.raises(ReaperMessageError):
        decode_message(json.dumps({"arm": {**doc, **change}}).encode())


@pytest.mark.parametrize(
    "data",
    [b"", b"[]", b"{}", b'{"done": 1}', b'{"watch": "query"}', b'{"done": true, "x": 1}', b"\xff"],
)
def test_other_messages_are_refused(data):
    with pytest.raises(ReaperMessageError):
        decode_message(data)


@given(st.binary(max_size=300) | st.text(max_size=200).map(str.encode))
def test_nothing_but_our_own_error(data):
    with contextlib.suppress(ReaperMessageError):
        decode_message(data)


# -- reap ---------------------------------------------------------------------


@contextlib.contextmanager
def sleeper(
    cwd: Path | None = None, *, session: bool = False
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    child = subprocess.Popen(["sleep", "300"], cwd=cwd, start_new_session=session)
    fd = os.pidfd_open(child.pid)
    try:
        yield child, fd
    finally:
        os.close(fd)
        child.kill()
        child.wait()


def test_reap_kills_reconciles_its_own_run_twice_and_removes_its_roots():
    run_id, other = secrets.token_hex(16), secrets.token_hex(16)
    calls: list[tuple[str, str]] = []

    def engine(host: str, run: str) -> int:
        calls.append((host, run))
        return 3 if len(calls) == 1 else 0

    with reaper_base() as base, sleeper() as (broker, broker_fd), sleeper() as (agent, agent_fd):
        mine, theirs = run_roots(base, run_id), run_roots(base, other)
        # A clone still writing inside the run's seeds; one inside another
        # run's; one inside this run's but in another session (not the run's).
        with contextlib.ExitStack() as stack:
            stray, _ = stack.enter_context(sleeper(mine.seeds_dir))
            bystander, _ = stack.enter_context(sleeper(theirs.seeds_dir))
            foreign, _ = stack.enter_context(sleeper(mine.seeds_dir, session=True))
            reaped = reap(
                arm_for(mine, run_id, "unix:///x.sock"),
                {"broker": broker_fd, "agent": agent_fd},
                engine=engine,
                settle_s=0.0,
                session=os.getsid(0),
            )
            assert stray.wait(timeout=5) == -signal.SIGKILL
            assert bystander.poll() is None
            assert foreign.poll() is None
        assert broker.wait(timeout=5) == -signal.SIGKILL
        assert agent.wait(timeout=5) == -signal.SIGKILL
        assert not mine.private_root.exists()
        assert not mine.ingress_root.exists()
        assert theirs.private_root.exists()
        assert theirs.ingress_root.exists()
    assert calls == [("unix:///x.sock", run_id)] * 2  # the settle pass: a broker was watched
    assert reaped.killed == ("broker", "agent")
    assert reaped.strays == 1
    assert (reaped.containers, reaped.engine, reaped.roots) == (3, "reconciled", "removed")
    assert 0 <= reaped.last_removal_s <= reaped.seconds < 5


def test_the_reap_works_where_the_session_leader_is_outside_the_pid_namespace():
    """A harness started inside a container (or a CI runner's namespace) whose
    session leader lives outside its PID namespace reads ``getsid() == 0``.
    The reaper must still arm, kill the run's strays (and only those inside
    the roots, not a process in a session of its own) and remove the roots:
    run the reap test again in a fresh PID namespace, where that is so."""
    require_root()
    namespace = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable]
    premise = subprocess.run(
        [*namespace, "-c", "import os; print(os.getsid(0))"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert premise.stdout.strip() == "0"
    test = f"{__file__}::test_reap_kills_reconciles_its_own_run_twice_and_removes_its_roots"
    result = subprocess.run(
        [*namespace, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "1 passed" in result.stdout


def test_reap_never_removes_roots_whose_record_names_another_run():
    run_id, other = secrets.token_hex(16), secrets.token_hex(16)
    with reaper_base() as base:
        paths = run_roots(base, run_id, owner_run=other)
        reaped = reap(arm_for(paths, run_id, "tcp://engine:2375"), {}, engine=_no_engine)
        assert paths.private_root.exists()
        assert paths.ingress_root.exists()
    assert (reaped.roots, reaped.engine, reaped.killed) == ("not-this-run", "not-attempted", ())


def test_a_failed_engine_is_reported_and_the_roots_still_go():
    run_id = secrets.token_hex(16)

    def engine(_host: str, _run: str) -> int:
        raise ConnectionRefusedError

    with reaper_base() as base:
        paths = run_roots(base, run_id)
        reaped = reap(arm_for(paths, run_id), {}, engine=engine, settle_s=0.0)
        assert not paths.private_root.exists()
    assert (reaped.engine, reaped.roots) == ("failed: ConnectionRefusedError", "removed")


def _no_engine(_host: str, _run: str) -> int:
    raise AssertionError("a non-local engine is never reconciled")


# -- the process ------------------------------------------------------------


def test_end_of_file_without_done_reaps(capfd):
    run_id = secrets.token_hex(16)
    with reaper_base() as base, sleeper() as (agent, _fd):
        paths = run_roots(base, run_id)
        reaper = start_reaper(arm_for(paths, run_id), {"PATH": os.environ["PATH"]})
        assert reaper.watch("agent", agent.pid)
        reaper._sock.close()  # what the kernel does when the harness dies
        assert agent.wait(timeout=REAP_LIMIT_S) == -signal.SIGKILL
        assert reaper._process.wait(timeout=REAP_LIMIT_S) == 1  # the engine is unreachable
        assert not paths.private_root.exists()
        assert not paths.ingress_root.exists()
    events = [json.loads(line) for line in capfd.readouterr().err.splitlines() if "{" in line]
    reaped = [e for e in events if e["event"] == "reaper_reaped"]
    assert len(reaped) == 1, events
    assert reaped[0]["killed"] == ["agent"]
    assert reaped[0]["roots"] == "removed"
    assert reaped[0]["engine"].startswith("failed: ")
    assert str(base) not in json.dumps(reaped)  # no path in the event


def test_done_leaves_everything_alone(capfd):
    run_id = secrets.token_hex(16)
    with reaper_base() as base, sleeper() as (agent, _fd):
        paths = run_roots(base, run_id)
        reaper = start_reaper(arm_for(paths, run_id), {"PATH": os.environ["PATH"]})
        assert reaper.watch("agent", agent.pid)
        assert reaper.disarm() == 0
        assert agent.poll() is None
        assert paths.private_root.exists()
        assert paths.ingress_root.exists()
    assert "reaper_reaped" not in capfd.readouterr().err


# -- end to end: a real harness process, SIGKILLed ----------------------------

#: A harness (fake broker, a host agent that sleeps) in its own session, with
#: the real process environment (tokens included: ``run`` scrubs them).
#: argv: config, seed source, state base, work dir, agent seconds.
DRIVER = r"""
import sys
from pathlib import Path
import trio
from bounded_query.harness.records.events import EventSink
from bounded_query.harness import RunOptions, run

config, source, base, work, seconds = sys.argv[1:6]
options = RunOptions(
    config_source=config,
    agent=(sys.executable, "-c", f"import time; time.sleep({seconds})"),
    seed_sources={"octo/alpha": Path(source)},
    workspace=Path(work),
    base=Path(base),
    broker_command=(sys.executable, "-m", "tests.fakes.broker_main"),
    probe_runtime=False,
    agent_on_host=True,
    unconfined_agent=True,
)
sys.exit(trio.run(run, options, EventSink(sys.stdout)))
"""


def _live(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@contextlib.contextmanager
def harness_process(tmp_path: Path, base: Path, seconds: int) -> Iterator[dict]:
    """Start :data:`DRIVER` holding a locked "engine lock"; yield its pids once the agent runs.

    Whatever the test did, the harness's group, its reaper and its broker
    are killed on exit (the reaper gets its chance first).
    """
    source = tmp_path / "src"
    make_repo(source, {"README.md": "hi\n"})
    config = tmp_path / "c.json"
    section = {
        "enabled": True,
        "memoryLimit": "64m",
        "privateRepos": [{"repo": "octo/alpha", "sensitivity": "internal"}],
    }
    config.write_text(json.dumps({"boundedQueries": section}))
    (tmp_path / "driver.py").write_text(DRIVER)
    lock = open(tmp_path / "engine.lock", "w")  # noqa: SIM115 - held across the yield
    fcntl.flock(lock, fcntl.LOCK_EX)  # as `flock /tmp/bq-engine.lock CMD` leaves it inherited
    err = open(tmp_path / "stderr", "w+b")  # noqa: SIM115
    env = {**os.environ, "PYTHONPATH": str(HARNESS_TESTS_ROOT), "GH_TOKEN": TOKEN}
    argv = [sys.executable, str(tmp_path / "driver.py"), str(config), str(source), str(base)]
    harness = subprocess.Popen(
        [*argv, str(tmp_path), str(seconds)],
        stdout=subprocess.PIPE,
        stderr=err,
        env=env,
        cwd=HARNESS_TESTS_ROOT,
        pass_fds=(lock.fileno(),),
        start_new_session=True,
    )
    pids: dict = {"harness": harness.pid, "lock": lock.fileno(), "stderr": err, "process": harness}
    try:
        assert harness.stdout is not None
        for line in harness.stdout:
            event = json.loads(line)
            if event["event"] == "reaper_armed":
                pids["reaper"] = event["pid"]
            if event["event"] == "agent_started":
                pids["agent"] = event["pid"]
                break
        pids["events"] = harness.stdout
        assert "reaper" in pids, "the harness never started its agent"
        assert "agent" in pids, "the harness never started its agent"
        pids["broker"] = next(
            p
            for p in _pids_with(b"tests.fakes.broker_main")
            if str(base).encode() in Path(f"/proc/{p}/cmdline").read_bytes()
        )
        yield pids
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(harness.pid, signal.SIGKILL)
        harness.wait()
        if harness.stdout is not None:
            harness.stdout.close()
        if "reaper" in pids:
            wait_gone(pids["reaper"], REAP_LIMIT_S)
        for role in ("reaper", "broker", "agent"):
            if role in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pids[role], signal.SIGKILL)
        lock.close()
        err.close()


def _pids_with(fragment: bytes) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if fragment in (entry / "cmdline").read_bytes() and _live(int(entry.name)):
                    found.append(int(entry.name))
    return found


def _capabilities(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("CapEff", "CapPrm", "CapBnd", "NoNewPrivs"):
            fields[name] = int(value.strip(), 16 if name.startswith("Cap") else 10)
    return fields


def test_the_reaper_holds_no_secret_no_lock_and_its_own_session(tmp_path):
    with reaper_base() as base, harness_process(tmp_path, base, 600) as pids:
        reaper = pids["reaper"]
        environ = Path(f"/proc/{reaper}/environ").read_bytes()
        cmdline = Path(f"/proc/{reaper}/cmdline").read_bytes().split(b"\0")[:-1]
        assert TOKEN.encode() not in environ
        assert {e.split(b"=", 1)[0] for e in environ.split(b"\0") if e} <= {
            b"PATH",
            b"LANG",
            b"LC_ALL",
            b"TZ",
        }
        assert cmdline[1:4] == [b"-I", b"-m", b"bounded_query.harness.lifecycle.reaper"]
        assert len(cmdline) == 5
        assert cmdline[4].isdigit()
        assert TOKEN.encode() not in Path(f"/proc/{pids['harness']}/environ").read_bytes()
        # Its own session and process group: a group kill of the harness misses it.
        assert os.getsid(reaper) == reaper == os.getpgid(reaper)
        assert os.getsid(pids["harness"]) == pids["harness"] != reaper
        # Descriptors: /dev/null, the harness's stderr, its socket, the pidfds of
        # the broker and the host agent; not the lock. (Polled: while the
        # interpreter starts it briefly holds module files, and the watch
        # messages are read once it serves.)
        fd_dir = Path(f"/proc/{reaper}/fd")
        deadline = time.monotonic() + 20
        while True:
            links = {}
            for fd in fd_dir.iterdir():
                with contextlib.suppress(FileNotFoundError):
                    links[int(fd.name)] = os.readlink(fd)
            sockets = [fd for fd, target in links.items() if target.startswith("socket:")]
            pidfds = [fd for fd, target in links.items() if target == "anon_inode:[pidfd]"]
            expected = {0, 1, 2, *sockets, *pidfds}
            if (set(links) == expected and len(pidfds) == 2) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert links[0] == links[1] == "/dev/null"
        assert links[2] == str(tmp_path / "stderr")
        assert sockets == [int(cmdline[4])]
        assert len(pidfds) == 2  # broker and agent
        assert set(links) == expected, links
        lock_target = os.readlink(f"/proc/{pids['harness']}/fd/{pids['lock']}")
        assert lock_target == str(tmp_path / "engine.lock")  # the harness does hold it
        assert lock_target not in links.values()
        if os.geteuid() == 0:
            # Dropped as soon as the interpreter has imported the reaper (well
            # under a second; the harness does not wait for it).
            kept = sum(1 << bit for bit in KEPT_CAPABILITIES.values())
            deadline = time.monotonic() + 20
            while _capabilities(reaper)["CapEff"] != kept and time.monotonic() < deadline:
                time.sleep(0.05)
            caps = _capabilities(reaper)
            assert caps["CapEff"] == caps["CapPrm"] == caps["CapBnd"] == kept
            assert caps["NoNewPrivs"] == 1


def test_a_process_group_sigkill_leaves_nothing_running_and_no_root(tmp_path):
    with reaper_base() as base, harness_process(tmp_path, base, 600) as pids:
        assert len(list(base.iterdir())) == 2
        if os.geteuid() == 0:
            assert len(mounts_under(base)) == 1  # the workspace tmpfs
        killed = time.monotonic()
        os.killpg(pids["harness"], signal.SIGKILL)  # the harness and its host agent's group
        assert wait_gone(pids["reaper"], REAP_LIMIT_S), "the reaper never finished"
        elapsed = time.monotonic() - killed
        for role in ("harness", "broker", "agent"):
            assert not _live(pids[role]), f"the {role} survived"
        assert list(base.iterdir()) == []
        assert mounts_under(base) == []
        pids["stderr"].seek(0)
        err = pids["stderr"].read().decode()
    assert elapsed < REAP_LIMIT_S
    reaped = [json.loads(line) for line in err.splitlines() if '"reaper_reaped"' in line]
    assert len(reaped) == 1, err
    assert reaped[0]["roots"] == "removed"


def test_a_sigkill_of_the_harness_alone_kills_its_host_agent(tmp_path):
    """Also: no child holds the harness's end of the socket (the agent lives on
    here until the reaper kills it, so end-of-file must come from the harness alone)."""
    with reaper_base() as base, harness_process(tmp_path, base, 600) as pids:
        os.kill(pids["harness"], signal.SIGKILL)
        assert wait_gone(pids["reaper"], REAP_LIMIT_S)
        assert not _live(pids["agent"])
        assert not _live(pids["broker"])
        assert list(base.iterdir()) == []
        pids["stderr"].seek(0)
        err = pids["stderr"].read().decode()
    reaped = [json.loads(line) for line in err.splitlines() if '"reaper_reaped"' in line]
    assert "agent" in reaped[0]["killed"], reaped


def test_a_normal_end_leaves_the_reaper_nothing_to_do(tmp_path):
    with reaper_base() as base, harness_process(tmp_path, base, 1) as pids:
        assert pids["process"].wait(timeout=60) == 0
        assert wait_gone(pids["reaper"], 1.0), "a disarmed reaper lingered"
        assert list(base.iterdir()) == []
        pids["stderr"].seek(0)
        err = pids["stderr"].read().decode()
        events = [json.loads(line) for line in pids["events"]]
    assert "reaper_reaped" not in err
    assert events[-1]["event"] == "run_end"
    assert events[-1]["status"] == 0
