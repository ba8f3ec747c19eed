"""Test helpers: git repositories and a real git smart-HTTP server with basic auth.

The server runs ``git http-backend`` as a CGI program behind a small
``http.server`` on 127.0.0.1, so staging's GIT_ASKPASS path runs for real.
On every request it also scans ``/proc/*/cmdline`` for the token, so a test
can assert that no process ever carried it as an argument.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    "HOME": "/nonexistent",
}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True, text=True
    ).stdout


def make_repo(path: Path, files: dict[str, str], *, commits: int = 1) -> str:
    """Create a repository with ``files`` over ``commits`` commits; return HEAD."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for index in range(commits):
        for name, text in files.items():
            target = path / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text if index == commits - 1 else f"{text}\n# draft {index}\n")
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", f"commit {index}")
    return git(path, "rev-parse", "HEAD").strip()


def cmdlines() -> list[bytes]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes())
    return out


class GitHttpServer:
    """``git http-backend`` over HTTP with basic auth (user ignored, password = token)."""

    def __init__(self, project_root: Path, token: str) -> None:
        self.project_root = project_root
        self.token = token
        self.requests: list[tuple[str, str, bool]] = []
        self.token_seen_in_cmdline = False
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_args: object) -> None:
                pass

            def _authorized(self) -> bool:
                header = self.headers.get("Authorization", "")
                if not header.startswith("Basic "):
                    return False
                try:
                    decoded = base64.b64decode(header[6:]).decode()
                except ValueError:
                    return False
                return decoded.split(":", 1)[-1] == outer.token

            def _handle(self) -> None:
                if any(outer.token.encode() in line for line in cmdlines()):
                    outer.token_seen_in_cmdline = True
                authorized = self._authorized()
                outer.requests.append((self.command, self.path, authorized))
                if not authorized:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="test"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                path, _, query = self.path.partition("?")
                env = {
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "GIT_PROJECT_ROOT": str(outer.project_root),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "GIT_CONFIG_NOSYSTEM": "1",
                    "GIT_CONFIG_GLOBAL": "/dev/null",
                    "REQUEST_METHOD": self.command,
                    "PATH_INFO": path,
                    "QUERY_STRING": query,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)),
                    "REMOTE_USER": "x",
                    "REMOTE_ADDR": "127.0.0.1",
                    "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                    "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
                }
                done = subprocess.run(
                    ["git", "http-backend"], input=body, env=env, capture_output=True, check=False
                )
                head, _, payload = done.stdout.partition(b"\r\n\r\n")
                if not _:
                    head, _, payload = done.stdout.partition(b"\n\n")
                status = 200
                headers = []
                for line in head.decode("latin-1").splitlines():
                    name, _, value = line.partition(":")
                    if name.lower() == "status":
                        status = int(value.strip().split()[0])
                    elif name:
                        headers.append((name, value.strip()))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = _handle
            do_POST = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> GitHttpServer:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def publish(source: Path, project_root: Path, slug: str) -> Path:
    """Make a bare copy of ``source`` servable at ``<url>/<slug>.git``."""
    bare = project_root / f"{slug}.git"
    bare.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["git", "clone", "-q", "--bare", str(source), str(bare)],
        env=GIT_ENV,
        check=True,
        capture_output=True,
    )
    return bare


@contextlib.contextmanager
def var_tmp_base() -> Iterator[Path]:
    """A base directory under /var/tmp (outside /tmp, traversable by uid 65534)."""
    base = Path(tempfile.mkdtemp(prefix="bq-harness-test-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    try:
        yield base
    finally:
        for root, dirs, _files in os.walk(base):
            for name in dirs:
                with contextlib.suppress(OSError):
                    os.chmod(os.path.join(root, name), 0o700)
        shutil.rmtree(base, ignore_errors=True)


def all_bytes_under(root: Path) -> Iterator[tuple[Path, bytes]]:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            if not path.is_symlink():
                yield path, path.read_bytes()


# -- a harness process to SIGKILL mid-run ---------------------------------

HARNESS_TESTS_ROOT = Path(__file__).resolve().parents[2]

#: RunOptions for tests about the run's lifecycle (exit status, signals,
#: teardown, quota), not about confinement: the agent runs on the host with
#: the harness's uid, which the harness allows only as a degraded run
#: (confinement is tested in test_harness_confinement.py).
HOST_AGENT: dict[str, Any] = {"agent_on_host": True, "unconfined_agent": True}

#: A real harness process (fake broker, an agent that sleeps) that tests kill
#: mid-run; argv: config, seed source, state base, work dir. Events on stdout.
KILLABLE_HARNESS = r"""
import os, sys
from pathlib import Path
import trio
from bounded_query.harness.records.events import EventSink
from bounded_query.harness import RunOptions, run

config, source, base, work = sys.argv[1:5]
options = RunOptions(
    config_source=config,
    agent=(sys.executable, "-c", "import time; time.sleep(600)"),
    seed_sources={"octo/alpha": Path(source)},
    workspace=Path(work),
    base=Path(base),
    broker_command=(sys.executable, "-m", "tests.fakes.broker_main"),
    probe_runtime=False,
    agent_on_host=True,
    unconfined_agent=True,
)
trio.run(run, options, EventSink(sys.stdout),
         {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ["PYTHONPATH"],
          "DOCKER_HOST": os.environ["DOCKER_HOST"]})
"""


def live_pids_with(fragment: bytes) -> list[int]:
    """Live (non-zombie) processes whose command line contains ``fragment``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if fragment not in (entry / "cmdline").read_bytes():
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z":
                found.append(int(entry.name))
    return found


@contextlib.contextmanager
def killable_harness(
    work: Path, config: Path, source: Path, base: Path, docker_host: str
) -> Iterator[tuple[subprocess.Popen[bytes], int, int]]:
    """Start :data:`KILLABLE_HARNESS`, wait for its agent; yield (harness, agent pid, reaper pid).

    ``docker_host`` is the run's ``DOCKER_HOST`` (a fake engine's, in the
    tests that need no engine).

    On exit the harness is killed if still alive, its reaper gets
    :data:`REAPER_WAIT_S` to finish (then it is killed too) and the agent is
    killed, so a failing test leaves no process behind (what else runs under
    ``base`` is the caller's to check).
    """
    import json
    import signal
    import sys

    (work / "driver.py").write_text(KILLABLE_HARNESS)
    env = {**os.environ, "PYTHONPATH": str(HARNESS_TESTS_ROOT), "DOCKER_HOST": docker_host}
    harness = subprocess.Popen(
        [sys.executable, str(work / "driver.py"), str(config), str(source), str(base), str(work)],
        stdout=subprocess.PIPE,
        env=env,
        cwd=HARNESS_TESTS_ROOT,
    )
    agent_pid = reaper_pid = None
    try:
        assert harness.stdout is not None
        for line in harness.stdout:
            event = json.loads(line)
            if event["event"] == "reaper_armed":
                reaper_pid = event["pid"]
            if event["event"] == "agent_started":
                agent_pid = event["pid"]
                break
        assert agent_pid is not None, "the harness never started the agent"
        assert reaper_pid is not None, "the harness never armed its reaper"
        yield harness, agent_pid, reaper_pid
    finally:
        if harness.poll() is None:
            harness.kill()
            harness.wait()
        if harness.stdout is not None:
            harness.stdout.close()
        if reaper_pid is not None:
            wait_gone(reaper_pid, REAPER_WAIT_S)
        for pid in (reaper_pid, agent_pid):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


#: How long a test lets a reaper finish before killing it.
REAPER_WAIT_S = 30.0


def wait_gone(pid: int, limit_s: float) -> bool:
    """Wait (polling its pidfd) until process ``pid`` has exited; True when it has."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], limit_s)[0])
    finally:
        os.close(fd)


# -- tmpfs mounts in tests -----------------------------------------------


def require_root() -> None:
    """Mounting needs root: skip without it, but fail under CI=true (CI runs as root)."""
    import pytest

    if os.geteuid() == 0:
        return
    if os.environ.get("CI") == "true":
        pytest.fail("the tmpfs mount tests must run as root under CI=true")
    pytest.skip("mounting a tmpfs needs root")


def mounts_under(base: Path) -> list[str]:
    """Mount points at or below ``base`` (from /proc/self/mountinfo)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4]
        if point == str(base) or point.startswith(f"{base}/"):
            found.append(point)
    return found


@contextlib.contextmanager
def mount_safe_base() -> Iterator[Path]:
    """``var_tmp_base`` that also detaches any mount a failed test left below it."""
    from bounded_query.broker.mounts import unmount

    with var_tmp_base() as base:
        try:
            yield base
        finally:
            for point in sorted(mounts_under(base), reverse=True):
                with contextlib.suppress(OSError):
                    unmount(Path(point))


# -- in-process runs against the fake broker --------------------------------

#: The tests-only broker entry point (tests/fakes/broker_main.py).
FAKE_BROKER = (sys.executable, "-m", "tests.fakes.broker_main")


async def run_with_fake_broker(
    config: Path,
    source: Path,
    workspace: Path,
    base: Path,
    agent: tuple[str, ...],
    *,
    docker_host: str,
) -> tuple[int, list[dict[str, object]]]:
    """One in-process ``run`` of ``octo/alpha`` (staged from ``source``); (status, events).

    ``docker_host`` is the run's ``DOCKER_HOST`` (a fake engine's: these runs
    need none)."""
    import io
    import json

    from bounded_query.harness import RunOptions, run
    from bounded_query.harness.records.events import EventSink

    options = RunOptions(
        config_source=str(config),
        agent=agent,
        seed_sources={"octo/alpha": source},
        workspace=workspace,
        base=base,
        broker_command=FAKE_BROKER,
        probe_runtime=False,
        **HOST_AGENT,
    )
    stream = io.StringIO()
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(HARNESS_TESTS_ROOT),
        "DOCKER_HOST": docker_host,
    }
    status = await run(options, EventSink(stream), env)
    return status, [json.loads(line) for line in stream.getvalue().splitlines()]
