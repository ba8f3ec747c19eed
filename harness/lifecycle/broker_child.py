"""The broker as a child process of the harness (spec 14.7).

Theory of operation: the child runs in its own session with a minimal,
credential-free environment and ``/`` as its directory. It carries a
parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGTERM)``), so a harness
killed with SIGKILL -- which runs no teardown -- does not leave a broker
serving behind it: the broker gets SIGTERM and shuts down as usual -- and
the run's reaper, which holds a pidfd of the broker (``reaper.py``), SIGKILLs
it at once, before it removes the run's containers and roots.

The kernel sends that signal when the *thread* that forked the child exits,
not the process. ``trio.lowlevel.open_process`` forks in a worker thread,
which trio retires after a few idle seconds and which would stop the broker
mid-run, so the fork happens synchronously in the thread running trio (the
main thread under ``bounded-query-harness``; a fork plus exec takes
milliseconds). Exit is awaited on a pidfd, so no thread is involved at all.

The bounded-agent broker has no network (spec 15.6: ``network_mode: none``):
run as root, the harness starts it in a network namespace of its own, with
nothing in it but a loopback interface that is down. It needs none: its
socket, the Docker socket and the API proxy's control socket are Unix
sockets named by path, which do not belong to a network namespace. If the
namespace cannot be made, the child exits before the broker runs (fail
closed: the run stops at the broker's readiness). Without root there is no
namespace (a user namespace would change the broker's uid); the query
broker, which may be told a ``tcp://`` Docker host, keeps the harness's.

The child's stderr is a pipe (unless ``--broker-log`` names a file): the
harness relays each line as a versioned record (``broker_log.py``,
:meth:`ChildBroker.relay_log`) for the broker's whole life; :meth:`stop`
lets the relay drain what the broker wrote last before it returns.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from bounded_query.broker.protocol.policy import SUBSYSTEM_AGENT
from bounded_query.harness.lifecycle.broker_log import relay_broker_log
from bounded_query.harness.lifecycle.paths import RunPaths
from bounded_query.harness.records.events import EventSink
from bounded_query.sandbox.cpus import agent_cpu_set

__all__ = [
    "BROKER_LOG_DRAIN_S",
    "BROKER_STOP_GRACE_S",
    "ChildBroker",
    "broker_environment",
    "start_child_broker",
]

#: How long the broker may take to drain after SIGTERM before SIGKILL.
BROKER_STOP_GRACE_S = 20.0
#: How long :meth:`ChildBroker.stop` waits, after the broker exited, for its
#: last lines to be relayed (the pipe closes with it unless a child of the
#: broker still holds it).
BROKER_LOG_DRAIN_S = 5.0
#: Poll interval when the kernel offers no pidfd.
EXIT_POLL_S = 0.05
#: Variables the broker child inherits (everything else, tokens included, is dropped).
BROKER_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH")


def broker_environment(env: Mapping[str, str]) -> dict[str, str]:
    """A minimal, credential-free environment for the broker child."""
    return {k: env[k] for k in BROKER_ENV_KEEP if k in env}


class ChildBroker:
    """The broker as a child process (spawned by :func:`_spawn_broker`).

    ``log_fd`` is the read end of the pipe that is the broker's stderr
    (owned from now on; None when the stderr goes to a file).
    """

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        log_fd: int | None = None,
        subsystem: str | None = None,
    ) -> None:
        self._process = process
        self._log_fd = log_fd
        self._relayed: trio.Event | None = None
        #: Named in every relayed record (the bounded-agent broker's; None: the query broker).
        self.subsystem = subsystem

    async def relay_log(self, sink: EventSink) -> None:
        """Relay the broker's stderr through ``sink`` until it closes (run this
        in a nursery that outlives :meth:`stop`); at once without a pipe."""
        fd, self._log_fd = self._log_fd, None
        if fd is None:
            return
        done = self._relayed = trio.Event()
        try:
            await relay_broker_log(trio.lowlevel.FdStream(fd), sink, self.subsystem)
        finally:
            done.set()

    @property
    def pid(self) -> int:
        """The broker's pid (the host-agent check proves the agent cannot read it)."""
        return self._process.pid

    def exited(self) -> int | None:
        """The exit status, or None while the broker runs."""
        return self._process.poll()

    async def _wait(self) -> int:
        """Wait for exit without a thread: a pidfd is readable once the child exits."""
        process = self._process
        while process.poll() is None:
            try:
                fd = os.pidfd_open(process.pid)
            except OSError:  # no pidfd (old kernel): poll
                await trio.sleep(EXIT_POLL_S)
                continue
            try:
                await trio.lowlevel.wait_readable(fd)
            finally:
                os.close(fd)
        return process.returncode

    async def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after :data:`BROKER_STOP_GRACE_S`; the exit status."""
        if self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.send_signal(signal.SIGTERM)
            with trio.move_on_after(BROKER_STOP_GRACE_S):
                await self._wait()
            if self._process.poll() is None:
                self._process.kill()
        status = await self._wait()
        if self._relayed is not None:
            with trio.move_on_after(BROKER_LOG_DRAIN_S):
                await self._relayed.wait()
        return status


_PR_SET_PDEATHSIG = 1
_CLONE_NEWNET = 0x40000000
#: The child's exit status when its network namespace could not be made.
NO_NETWORK_NAMESPACE = 126


def _parent_death_signal(
    libc: ctypes.CDLL, parent: int, *, own_network: bool = False
) -> Callable[[], None]:
    """A ``preexec_fn``: SIGTERM this child when the thread that forked it dies,
    pin it to the agent/broker CPUs and, with ``own_network``, give it a network
    namespace of its own (or exit with :data:`NO_NETWORK_NAMESPACE`).

    If the parent died between fork and prctl, the signal would never come:
    then the child terminates itself at once.
    """

    cpus = agent_cpu_set(os.cpu_count() or 1)

    def preexec() -> None:
        if own_network and libc.unshare(_CLONE_NEWNET) != 0:
            os._exit(NO_NETWORK_NAMESPACE)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
        # The broker stays off the query CPUs (sandbox/cpus.py).
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)

    return preexec


def _spawn_broker(
    argv: Sequence[str], env: Mapping[str, str], stderr: int | None, *, own_network: bool = False
) -> subprocess.Popen[bytes]:
    """Fork and exec the broker *in the calling thread*, in a network namespace
    of its own with ``own_network``.

    See the module docstring for why it must not be a worker thread.
    """
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return subprocess.Popen(
        list(argv),
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stderr=stderr,
        start_new_session=True,
        cwd="/",
        preexec_fn=_parent_death_signal(libc, os.getpid(), own_network=own_network),
    )


async def start_child_broker(
    options: Any, paths: RunPaths, env: Mapping[str, str], subsystem: str | None = None
) -> ChildBroker:
    """Start ``options.broker_command --config PATH`` (a ``BrokerStarter`` for ``run``).

    The broker's stderr is ``options.broker_log`` (appended) when set, else
    a pipe for :meth:`ChildBroker.relay_log`. ``paths`` are the bounded-agent
    roots for the agent broker (``subsystem`` then names it in its records).
    """
    log_fd: int | None = None
    if options.broker_log is not None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
        stderr = os.open(options.broker_log, flags, 0o600)
    else:
        log_fd, stderr = os.pipe2(os.O_CLOEXEC)
    try:
        process = _spawn_broker(
            [*options.broker_command, "--config", str(paths.broker_config)],
            broker_environment(env),
            stderr,
            own_network=subsystem == SUBSYSTEM_AGENT and os.geteuid() == 0,
        )
    except BaseException:
        if log_fd is not None:
            os.close(log_fd)
        raise
    finally:
        os.close(stderr)
    return ChildBroker(process, log_fd, subsystem)
