"""The reaper: a run's resources die with its harness (spec 14.7, 14.8).

Theory of operation. A harness killed with SIGKILL runs no teardown: its
agent container (network access, perhaps a model credential), a host agent,
the query containers and volumes, the workspace tmpfs and both roots (the
seeds: private source code) would stay until the next run's sweep
(``sweep.py``), which on a self-hosted runner may never come. So right
after the private root and its owner record exist, ``run`` starts a small
detached *reaper* process that outlives the harness and undoes the run the
moment the harness is gone.

* **How it learns of the death.** The harness and the reaper share a
  ``socketpair(AF_UNIX, SOCK_SEQPACKET)``. The harness's end is
  close-on-exec and held by nothing else (every child is spawned with
  ``close_fds``), so end-of-file on the reaper's end means every holder is
  gone: the harness exited. No pid is ever polled, so pid reuse cannot fool
  it; the kernel closes the descriptor however the process dies.
* **What it knows.** Nothing on its command line or in its environment
  (``python3 -I -m bounded_query.harness.lifecycle.reaper <fd>``, ``PATH`` and the
  locale only): the harness sends an :class:`Arm` message (run id, Docker
  host, both roots -- and the bounded-agent roots when that subsystem is on --,
  its session id) and, as it starts them, a pidfd for each process that
  must die with it (the broker child, the agent broker child, a host agent) through
  ``SCM_RIGHTS``: a pidfd names one process for good, never a reused pid.
  Messages are buffered by the kernel, so what was sent before a SIGKILL
  is still read afterwards.
* **Detached.** Its own session (``setsid``: a process-group or terminal
  kill of the harness does not reach it), ``/`` as its directory, stdin and
  stdout ``/dev/null``, only the harness's stderr (for its one JSONL event)
  and its socket end inherited (``close_fds``: no engine lock, no journal,
  no terminal). As root it keeps only the capabilities the removal needs
  (:data:`KEPT_CAPABILITIES`) and sets ``no_new_privs``; it lives as long
  as the harness plus the reap, never longer.
* **A normal end.** Teardown sends :class:`Done` once it has cleaned up;
  the reaper then exits without touching anything. A harness that exits
  without it (a crash, an exception escaping teardown) is reaped: whatever
  is left is a leak.
* **The reap** (:func:`reap`): SIGKILL every watched process through its
  pidfd and wait for it to die (the broker first: a broker that still runs
  could start a query after the listing); then the run's containers -- the
  compose broker service (``run --compose``), the agent container, the
  queries, the enclaves and the API proxy -- its volumes and its bounded-agent
  networks, by this run's labels only
  (``reconcile.reconcile_containers``, the one reconcile);
  then every other process still working inside the roots (a ``git clone``
  of an interrupted staging: git re-creates missing parent directories, so
  it must not outlive the roots); then, only if the owner record still
  names this run, the unmounts and both roots (``sweep.remove_run_roots``,
  the sweep's removal), and the same for the bounded-agent pair. A last
  pass a moment later catches a container whose creation the killed broker
  had already sent, and a root something re-created. One ``reaper_reaped`` event reports it.

The broker child also has a parent-death signal (SIGTERM, ``child.py``):
it starts its graceful stop at once, and the reaper's SIGKILL ends it
without waiting for the in-flight query (the run is over; its journal is
deleted with the root).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from bounded_query.broker.protocol.policy import DOCKER_UNIX_SCHEME, RUN_ID_PATTERN
from bounded_query.harness.lifecycle.paths import ROOT_PREFIXES, RunPaths
from bounded_query.harness.lifecycle.reconcile import reconcile_containers
from bounded_query.harness.lifecycle.sweep import MODE_RUN, read_owner_record, remove_run_roots
from bounded_query.harness.records.events import EventSink

__all__ = [
    "KEPT_CAPABILITIES",
    "ROLES",
    "Arm",
    "Done",
    "Reaped",
    "Reaper",
    "ReaperMessageError",
    "Watch",
    "decode_message",
    "reap",
    "reaper_environment",
    "serve",
    "start_reaper",
]

#: The largest message either side sends (an :class:`Arm` is a few hundred bytes).
MAX_MESSAGE = 4096
#: Processes that die with the harness: the broker child, the bounded-agent
#: broker child and a host agent (killed in this order).
ROLES = ("broker", "agent-broker", "agent")
#: How long the reaper waits for a SIGKILLed process to be gone.
KILL_WAIT_S = 5.0
#: The last engine pass comes this long after the broker died: a create the
#: killed broker had sent may still complete in the engine.
SETTLE_S = 1.0
#: How long teardown waits for a disarmed reaper to exit. It exits as soon
#: as it reads ``done``, but it may still be starting its interpreter (about
#: a second here; many more on a loaded machine): a long bound, seldom used.
EXIT_WAIT_S = 30.0
#: Variables the reaper inherits: no token, no Docker credential, no PYTHON*.
REAPER_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TZ")
#: Capabilities a root reaper keeps: read, traverse and delete the roots
#: (whoever owns their files), kill a host agent of another uid, unmount.
KEPT_CAPABILITIES = {
    "CAP_DAC_OVERRIDE": 1,
    "CAP_DAC_READ_SEARCH": 2,
    "CAP_FOWNER": 3,
    "CAP_KILL": 5,
    "CAP_SYS_ADMIN": 21,
}
_RUN_ID_RE = re.compile(RUN_ID_PATTERN)
_SUFFIX_RE = re.compile(r"[0-9]+-[0-9a-f]{16}")


class ReaperMessageError(ValueError):
    """A message on the reaper's socket is not one the harness sends (a local bug)."""


# -- messages (pure) ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Arm:
    """What the reaper removes if the harness dies: one run, by id and roots."""

    run_id: str
    docker_host: str
    private_root: str
    ingress_root: str
    #: The harness's session id: its other children (staging's clones) share it.
    #: 0 when the session's leader is outside this PID namespace (a container's
    #: init, a CI runner): ``getsid`` then reports 0 for the harness and its
    #: children alike, and the roots alone single out the run's processes.
    session: int
    #: The bounded-agent roots (spec 15.1), "" when that subsystem is off;
    #: the same ``<uid>-<digest>`` suffix as the query roots.
    agent_private_root: str = ""
    agent_ingress_root: str = ""

    def __post_init__(self) -> None:
        if not _RUN_ID_RE.fullmatch(self.run_id):
            raise ReaperMessageError("the run id is not a run id")
        if type(self.session) is not int or self.session < 0:
            raise ReaperMessageError("the session is not a session id")
        suffix = _pair_suffix(self.private_root, self.ingress_root, ROOT_PREFIXES[0])
        if self.agent_private_root or self.agent_ingress_root:
            agent = _pair_suffix(self.agent_private_root, self.agent_ingress_root, ROOT_PREFIXES[1])
            same_base = Path(self.agent_private_root).parent == Path(self.private_root).parent
            if agent != suffix or not same_base:
                raise ReaperMessageError("the bounded-agent roots are not this run's")

    @property
    def paths(self) -> RunPaths:
        """The run's two roots."""
        return RunPaths(Path(self.private_root), Path(self.ingress_root))

    @property
    def all_paths(self) -> tuple[RunPaths, ...]:
        """Every pair of the run's roots: the query pair, then the bounded-agent pair."""
        if not self.agent_private_root:
            return (self.paths,)
        return (self.paths, RunPaths(Path(self.agent_private_root), Path(self.agent_ingress_root)))

    def encode(self) -> bytes:
        """The message bytes."""
        arm: dict[str, object] = {
            "runId": self.run_id,
            "dockerHost": self.docker_host,
            "privateRoot": self.private_root,
            "ingressRoot": self.ingress_root,
            "session": self.session,
        }
        if self.agent_private_root:
            arm["agentPrivateRoot"] = self.agent_private_root
            arm["agentIngressRoot"] = self.agent_ingress_root
        return json.dumps({"arm": arm}, sort_keys=True).encode()


def _pair_suffix(private_root: str, ingress_root: str, prefixes: tuple[str, str]) -> str:
    """The ``<uid>-<digest>`` of a (private, ingress) pair named with ``prefixes``.

    Raises:
        ReaperMessageError: not such a pair of absolute sibling paths.
    """
    private, ingress = Path(private_root), Path(ingress_root)
    if not (private.is_absolute() and ingress.is_absolute()):
        raise ReaperMessageError("the roots must be absolute paths")
    if private.parent != ingress.parent or ".." in private.parts:
        raise ReaperMessageError("the roots must be siblings")
    private_prefix, ingress_prefix = prefixes
    suffix = private.name.removeprefix(private_prefix)
    if (
        suffix == private.name
        or not _SUFFIX_RE.fullmatch(suffix)
        or ingress.name != ingress_prefix + suffix
    ):
        raise ReaperMessageError("the roots are not a pair of run roots")
    return suffix


@dataclass(frozen=True, slots=True)
class Watch:
    """The process whose pidfd travels with this message must die with the harness."""

    role: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ReaperMessageError(f"unknown role {self.role!r}")

    def encode(self) -> bytes:
        """The message bytes."""
        return json.dumps({"watch": self.role}).encode()


@dataclass(frozen=True, slots=True)
class Done:
    """Teardown finished: nothing is left to remove; the reaper exits."""

    def encode(self) -> bytes:
        """The message bytes."""
        return b'{"done": true}'


def decode_message(data: bytes) -> Arm | Watch | Done:
    """Parse one message.

    Raises:
        ReaperMessageError: not a message of this protocol.
    """
    if len(data) > MAX_MESSAGE:
        raise ReaperMessageError("message too large")
    try:
        doc = json.loads(data)
    except ValueError:
        raise ReaperMessageError("message is not JSON") from None
    if not isinstance(doc, dict) or len(doc) != 1:
        raise ReaperMessageError("message is not a one-key object")
    if doc.get("done") is True:
        return Done()
    if isinstance(doc.get("watch"), str):
        return Watch(doc["watch"])
    arm = doc.get("arm")
    if isinstance(arm, dict):
        keys: tuple[str, ...] = ("runId", "dockerHost", "privateRoot", "ingressRoot")
        if "agentPrivateRoot" in arm or "agentIngressRoot" in arm:
            keys = (*keys, "agentPrivateRoot", "agentIngressRoot")
        if set(arm) != {*keys, "session"} or not all(isinstance(arm[k], str) for k in keys):
            raise ReaperMessageError("malformed arm message")
        run_id, docker_host, private_root, ingress_root, *agent = (arm[k] for k in keys)
        agent_private, agent_ingress = agent if agent else ("", "")
        if agent and not agent_private:
            raise ReaperMessageError("malformed arm message")
        return Arm(
            run_id,
            docker_host,
            private_root,
            ingress_root,
            session=arm["session"],
            agent_private_root=agent_private,
            agent_ingress_root=agent_ingress,
        )
    raise ReaperMessageError("unknown message")


# -- the reap ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reaped:
    """What one :func:`reap` did (the ``reaper_reaped`` event)."""

    killed: tuple[str, ...] = ()
    #: Other processes found working inside the roots (a clone of an
    #: interrupted staging, say), killed before the roots went.
    strays: int = 0
    containers: int = 0
    #: "reconciled", "not-attempted" (no local engine) or "failed: <kind>".
    engine: str = "not-attempted"
    #: "removed", "gone", "not-this-run" or the removal's error message.
    roots: str = "gone"
    seconds: float = 0.0
    #: Seconds from the harness's death to the last resource removed.
    last_removal_s: float = 0.0


#: Removes a run's containers and volumes: (docker host, run id) -> containers removed.
EngineReconcile = Callable[[str, str], int]


def _kill(pidfd: int) -> bool:
    """SIGKILL the process behind ``pidfd``; False when it was already gone."""
    try:
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(pidfds: list[int], limit_s: float) -> None:
    """Wait until every pidfd is readable (its process exited), at most ``limit_s``."""
    poller = select.poll()
    for fd in pidfds:
        poller.register(fd, select.POLLIN)
    pending = set(pidfds)
    deadline = time.monotonic() + limit_s
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        for fd, _mask in poller.poll(left * 1000):
            pending.discard(fd)
            poller.unregister(fd)


def reap(
    arm: Arm,
    watched: Mapping[str, int],
    *,
    engine: EngineReconcile = reconcile_containers,
    uid: int | None = None,
    settle_s: float = SETTLE_S,
    session: int | None = None,
) -> Reaped:
    """Undo the run ``arm`` names, its harness being gone (blocking; never raises).

    ``watched`` maps a role to a pidfd (:data:`ROLES`); ``session`` is the
    harness's session (its other children die too). The roots are removed
    only while their owner record names this run (a run's roots are never
    another's: the record is written before the reaper is armed).
    """
    started = time.monotonic()
    killed = tuple(role for role in ROLES if role in watched and _kill(watched[role]))
    _wait_gone([watched[role] for role in ROLES if role in watched], KILL_WAIT_S)
    last = time.monotonic()
    containers = 0
    outcome = "not-attempted"
    local = arm.docker_host.startswith(DOCKER_UNIX_SCHEME)

    def engine_pass() -> None:
        nonlocal containers, outcome, last
        if not local:
            return
        try:
            removed = engine(arm.docker_host, arm.run_id)
        except Exception as exc:  # the engine's reason; the roots still go
            outcome = f"failed: {exc.__class__.__name__}"
            return
        if removed or outcome == "not-attempted":
            # The first pass also removes the volumes (not counted); a later
            # one that found nothing removed nothing.
            last = time.monotonic()
        outcome = "reconciled"
        containers += removed

    engine_pass()
    pairs = arm.all_paths
    strays = sum(_kill_inside(paths, session) for paths in pairs)
    owner = os.getuid() if uid is None else uid
    outcomes = [_remove_roots(arm.run_id, paths, owner) for paths in pairs]
    # The query pair's outcome, unless the bounded-agent pair's went worse.
    roots = next((o for o in outcomes if o not in ("removed", "gone")), outcomes[0])
    if "removed" in outcomes:
        last = time.monotonic()
    brokers = "broker" in watched or "agent-broker" in watched
    if local and (brokers or outcome != "reconciled" or containers):
        time.sleep(max(0.0, settle_s - (time.monotonic() - started)))
        engine_pass()
    for paths, removed in zip(pairs, outcomes, strict=True):
        if removed == "removed" and _kill_inside(paths, session) + _exists(paths):
            # Something re-created a root after all: its record is gone with it,
            # and the name is this run's alone.
            remove_run_roots(paths)
            if _exists(paths):
                roots = "a root came back and could not be deleted"
    now = time.monotonic()
    return Reaped(
        killed=killed,
        strays=strays,
        containers=containers,
        engine=outcome,
        roots=roots,
        seconds=round(now - started, 3),
        last_removal_s=round(last - started, 3),
    )


#: Rounds of :func:`_kill_inside` (a killed process's children may still be starting).
STRAY_ROUNDS = 3


def _session_of(pid: str) -> int | None:
    try:
        return os.getsid(int(pid))
    except OSError:
        return None


def _inside(pid: str, roots: tuple[str, ...]) -> bool:
    """Whether process ``pid``'s directory or an open file is inside one of ``roots``."""
    base = f"/proc/{pid}"
    links = [f"{base}/cwd", f"{base}/root"]
    with contextlib.suppress(OSError):
        links += [f"{base}/fd/{fd}" for fd in os.listdir(f"{base}/fd")]
    for link in links:
        try:
            target = os.readlink(link)
        except OSError:
            continue
        if any(target == root or target.startswith(root + "/") for root in roots):
            return True
    return False


def _kill_inside(paths: RunPaths, session: int | None) -> int:
    """SIGKILL every process of the harness's ``session`` working inside the
    run's roots; how many (blocking). None: no session known, nothing killed.

    A git clone the harness started keeps writing after the harness died, and
    git re-creates missing leading directories: deleting the roots under it
    could leave a partial copy without an owner record, which no sweep would
    ever remove. Each candidate is pinned with a pidfd *before* its links are
    read, so a reused pid is never signalled: if the process exited meanwhile,
    the signal goes to the dead process and fails. Only the harness's session
    counts (its staging children share it; an operator's shell in another
    terminal that happens to sit in the root is not the run's).
    """
    if session is None:
        return 0
    roots = (str(paths.private_root), str(paths.ingress_root))
    me = str(os.getpid())
    total = 0
    for _round in range(STRAY_ROUNDS):
        pinned: list[int] = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit() or pid == me:
                continue
            try:
                pidfd = os.pidfd_open(int(pid))
            except OSError:
                continue
            if _session_of(pid) == session and _inside(pid, roots) and _kill(pidfd):
                pinned.append(pidfd)
            else:
                os.close(pidfd)
        if not pinned:
            break
        total += len(pinned)
        _wait_gone(pinned, KILL_WAIT_S)
        for pidfd in pinned:
            os.close(pidfd)
    return total


def _exists(paths: RunPaths) -> int:
    return int(os.path.lexists(paths.private_root) or os.path.lexists(paths.ingress_root))


def _remove_roots(run_id: str, paths: RunPaths, uid: int) -> str:
    if not os.path.lexists(paths.private_root):
        if os.path.lexists(paths.ingress_root):
            return "not-this-run"  # no record to prove it: the sweep's rule
        return "gone"
    record = read_owner_record(paths.private_root, uid)
    if record is None or record.mode != MODE_RUN or record.run_id != run_id:
        return "not-this-run"
    problem = remove_run_roots(paths)
    if problem is None and _exists(paths):
        problem = "a root could not be deleted completely"
    return problem or "removed"


# -- the reaper process -----------------------------------------------------


@dataclass
class _State:
    arm: Arm | None = None
    watched: dict[str, int] = field(default_factory=dict)


def serve(sock: socket.socket, sink: EventSink) -> int:
    """Read messages until :class:`Done` (exit 0, nothing done) or end-of-file (reap).

    A message that is not the protocol's is reported and ignored (its
    descriptors closed): the harness is the only writer, so it is a bug.
    """
    state = _State()
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE + 1, 4)
        except OSError:  # ECONNRESET and kin: the peer is gone all the same
            data, fds = b"", []
        if not data:
            break
        try:
            message = decode_message(data)
            if isinstance(message, Watch) and len(fds) != 1:
                raise ReaperMessageError("a watch message carries exactly one pidfd")
        except ReaperMessageError as exc:
            for fd in fds:
                os.close(fd)
            sink.emit("reaper_message_refused", message=str(exc))
            continue
        if isinstance(message, Done):
            return 0
        if isinstance(message, Arm):
            state.arm = message
        else:
            old = state.watched.pop(message.role, None)
            if old is not None:
                os.close(old)
            state.watched[message.role] = fds[0]
    if state.arm is None:
        return 0
    reaped = reap(state.arm, state.watched, session=state.arm.session)
    sink.emit(
        "reaper_reaped",
        killed=list(reaped.killed),
        strays=reaped.strays,
        containers=reaped.containers,
        engine=reaped.engine,
        roots=reaped.roots,
        seconds=reaped.seconds,
        lastRemovalSeconds=reaped.last_removal_s,
    )
    return 0 if reaped.roots in ("removed", "gone") and not reaped.engine.startswith("f") else 1


def _drop_capabilities() -> None:
    """As root: keep only :data:`KEPT_CAPABILITIES` (bounding, permitted, effective)
    and set ``no_new_privs``. Best effort: the reap matters more than the drop."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    pr_capbset_drop, pr_set_no_new_privs = 24, 38
    keep = set(KEPT_CAPABILITIES.values())
    libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0)  # first: the capset below is the last step
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last + 1):
        if cap not in keep:
            libc.prctl(pr_capbset_drop, cap, 0, 0, 0)
    mask = sum(1 << cap for cap in keep)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        ]

    header = Header(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words
    data = (Data * 2)(
        Data(mask & 0xFFFFFFFF, mask & 0xFFFFFFFF, 0), Data(mask >> 32, mask >> 32, 0)
    )
    libc.capset(ctypes.byref(header), data)


def main(argv: list[str]) -> int:
    """``python3 -I -m bounded_query.harness.lifecycle.reaper FD``: serve the socket ``FD``."""
    if len(argv) != 1 or not argv[0].isdigit():
        sys.stderr.write("usage: python3 -m bounded_query.harness.lifecycle.reaper FD\n")
        return 2
    # The engine client is imported while the harness lives: the reap itself
    # should not wait for an import.
    with contextlib.suppress(ImportError):
        import docker  # noqa: F401
    with contextlib.suppress(OSError, ValueError, AttributeError):
        _drop_capabilities()
    sink = EventSink(sys.stderr)  # never raises on a stream whose reader is gone
    with socket.socket(fileno=int(argv[0])) as sock:
        return serve(sock, sink)


# -- the harness's side -------------------------------------------------------


def reaper_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The reaper's environment: :data:`REAPER_ENV_KEEP` only (no token)."""
    return {k: env[k] for k in REAPER_ENV_KEEP if k in env}


class Reaper:
    """The harness's handle on its reaper (started by :func:`start_reaper`)."""

    def __init__(self, process: subprocess.Popen[bytes], sock: socket.socket) -> None:
        self._process = process
        self._sock = sock

    @property
    def pid(self) -> int:
        """The reaper's pid."""
        return self._process.pid

    def _send(self, data: bytes, fds: list[int] | None = None) -> bool:
        if self._sock.fileno() < 0:
            return False
        try:
            socket.send_fds(self._sock, [data], fds or [])
        except OSError:
            return False
        return True

    def watch(self, role: str, pid: int) -> bool:
        """Make process ``pid`` (a child of the harness) die with the harness.

        A child's pid is not reused before the harness reaps it, so the pidfd
        opened here names that process. False when it could not be sent.
        """
        message = Watch(role).encode()
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return False
        try:
            return self._send(message, [pidfd])
        finally:
            os.close(pidfd)

    def disarm(self) -> int | None:
        """Tell the reaper teardown is done, close the socket, reap it (blocking).

        Returns its exit status (None if it did not exit in :data:`EXIT_WAIT_S`;
        then it is killed).
        """
        self._send(Done().encode())
        self._sock.close()
        try:
            return self._process.wait(EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
            return None


def start_reaper(arm: Arm, env: Mapping[str, str]) -> Reaper:
    """Start the reaper for ``arm`` (blocking: a fork and exec).

    Raises:
        OSError: it could not be started (the run goes on; the next sweep
            is the fallback).
    """
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        ours.setblocking(False)  # a reaper that stopped reading must not stall the run
        process = subprocess.Popen(
            [sys.executable, "-I", "-m", __name__, str(theirs.fileno())],
            env=reaper_environment(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            close_fds=True,
            pass_fds=(theirs.fileno(),),
            start_new_session=True,
            cwd="/",
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    reaper = Reaper(process, ours)
    if not reaper._send(arm.encode()):
        reaper.disarm()
        raise OSError("the reaper did not accept its arm message")
    return reaper


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
