"""Running the agent: in its container (default) or on the host.

Theory of operation. ``run`` supervises the agent through one small
interface, :class:`AgentHandle` (poll, signal, wait, stop, close), with two
implementations:

* :class:`ContainerAgent` -- the default. The container (body from
  ``agent_spec.py``) is created, *attached before it starts* (so no output
  is lost), started and waited for over the Engine API; every blocking SDK
  call runs in a worker thread. Its stdout and stderr are demultiplexed onto
  the harness's own stdout and stderr by a pump thread; with a terminal on
  stdin the container gets a TTY (``-it``-like: raw mode on the host
  terminal, keystrokes forwarded, the window size copied) and restored on
  exit. A signal is forwarded with ``kill`` to the container's init, which
  passes it on to the command. The exit status is the container's
  (``docker-init`` reports 128+N for a command killed by signal N, like the
  host mode). :meth:`close` force-removes it; teardown's reconciliation by
  run label, the run's reaper after a SIGKILL (``reaper.py``) and, should the
  reaper die too, the next run's :func:`sweep_agent_containers` catch what
  a killed harness left.
* :class:`HostAgent` -- ``--agent-on-host``: a plain child process,
  optionally with another uid/gid (dropped in the child before exec, with
  no supplementary groups).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import trio

from bounded_query.broker.fdio import write_all
from bounded_query.broker.protocol.policy import LABEL_OWNER, LABEL_ROLE
from bounded_query.harness.agent.spec import ROLE_AGENT, AgentContainer, AgentUser
from bounded_query.harness.agent.spec import container_body as _container_body
from bounded_query.harness.lifecycle.sweep import OwnerRecord, owner_is_gone
from bounded_query.harness.records.events import EventSink
from bounded_query.sandbox import engine
from bounded_query.sandbox.reconcile import remove_container, remove_labelled

__all__ = [
    "AgentHandle",
    "AgentStartError",
    "ContainerAgent",
    "HostAgent",
    "start_container_agent",
    "start_host_agent",
    "sweep_agent_containers",
]

#: HTTP timeout of the ordinary Engine API calls.
API_TIMEOUT_S = 60
#: How long the output pump may take to drain after the container exited.
PUMP_DRAIN_S = 10.0
#: Read size of the stdin and output pumps.
CHUNK = 65536


class AgentStartError(Exception):
    """The agent could not be started (infrastructure; exit 2)."""


class AgentHandle(Protocol):
    """A started agent, container or host process."""

    @property
    def ident(self) -> str:
        """The process id or container id, for the ``agent_started`` event."""
        ...

    def poll(self) -> int | None:
        """The exit status once known, else None."""
        ...

    async def signal(self, signum: int) -> None:
        """Forward ``signum`` to the agent's command."""
        ...

    async def wait(self) -> int:
        """Wait for exit; the exit status (128+N for signal N)."""
        ...

    async def stop(self, grace: float) -> int:
        """SIGTERM, ``grace`` seconds, then SIGKILL; the exit status."""
        ...

    async def close(self) -> None:
        """Release what the agent held (the container is removed)."""
        ...


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


class HostAgent:
    """The agent as a child process of the harness (``--agent-on-host``)."""

    def __init__(self, process: trio.Process) -> None:
        self._process = process

    @property
    def ident(self) -> str:
        """The child's pid."""
        return str(self._process.pid)

    @property
    def pid(self) -> int:
        """The child's pid."""
        return self._process.pid

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""
        code = self._process.poll()
        return None if code is None else _exit_status(code)

    async def signal(self, signum: int) -> None:
        """Send ``signum`` to the child."""
        with contextlib.suppress(ProcessLookupError):
            self._process.send_signal(signum)

    async def wait(self) -> int:
        """Wait for the child; its exit status."""
        return _exit_status(await self._process.wait())

    async def stop(self, grace: float) -> int:
        """Terminate, then kill after ``grace`` seconds."""
        if self._process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.terminate()
            with trio.move_on_after(grace):
                await self._process.wait()
            if self._process.poll() is None:
                self._process.kill()
        return _exit_status(await self._process.wait())

    async def close(self) -> None:
        """Nothing to release."""


async def start_host_agent(
    argv: Sequence[str], env: Mapping[str, str], cwd: str, user: AgentUser | None
) -> HostAgent:
    """Start ``argv`` on the host, as ``user`` when given (no supplementary groups).

    Raises:
        AgentStartError: the command cannot be executed.
    """
    extra: dict[str, Any] = {}
    if user is not None:
        extra = {"user": user.uid, "group": user.gid, "extra_groups": []}
    try:
        process = await trio.lowlevel.open_process(list(argv), env=dict(env), cwd=cwd, **extra)
    except (OSError, PermissionError) as exc:
        raise AgentStartError(exc.strerror or str(exc)) from None
    return HostAgent(process)


def _api(docker_host: str) -> Any:
    return engine.api_client(docker_host, API_TIMEOUT_S)


def _close_attached(attached: Any) -> None:
    """Release the attach stream's descriptor now, not at garbage collection.

    The SDK keeps the HTTP response on the ``SocketIO`` (``_response``); a
    plain ``socket.close()`` while those still hold io references only marks
    the socket closed and leaves the descriptor open (ResourceWarning later).
    So: the response, then the wrapper, then the socket.
    """
    raw = _raw_socket(attached)
    response = getattr(attached, "_response", None)
    for close in (getattr(response, "close", None), getattr(attached, "close", None), raw.close):
        if close is not None:
            with contextlib.suppress(Exception):
                close()


def _raw_socket(attached: Any) -> Any:
    """The plain socket under the SDK's attach object (a ``SocketIO`` on unix://)."""
    return getattr(attached, "_sock", attached)


class _Terminal:
    """The host terminal in raw mode while a TTY agent runs; restored on exit."""

    def __init__(self, fd: int) -> None:
        import termios
        import tty

        self._fd = fd
        self._saved = termios.tcgetattr(fd)
        tty.setraw(fd, termios.TCSANOW)  # not TCSAFLUSH: keep what was typed ahead

    def restore(self) -> None:
        import termios

        with contextlib.suppress(OSError, termios.error):
            termios.tcsetattr(self._fd, termios.TCSADRAIN, self._saved)


def _window_size(fd: int) -> tuple[int, int] | None:
    import fcntl
    import struct
    import termios

    try:
        packed = fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8)
    except OSError:
        return None
    rows, cols = struct.unpack("HHHH", packed)[:2]
    return (rows, cols) if rows and cols else None


def _write_all(fd: int, data: bytes) -> None:
    # The harness's own stdout/stderr is gone: drop the output.
    with contextlib.suppress(OSError):
        write_all(fd, data, retry_blocking=True)


class ContainerAgent:
    """The agent in its own container (see the module docstring)."""

    def __init__(
        self, api: Any, container_id: str, attached: Any, tty: bool, fds: tuple[int, int, int]
    ) -> None:
        self._api = api
        self._id = container_id
        self._attached = attached
        self._tty = tty
        self._stdin_fd, self._stdout_fd, self._stderr_fd = fds
        self._status: int | None = None
        self._terminal: _Terminal | None = None
        self._pump = threading.Thread(target=self._pump_output, daemon=True)
        self._feeder: threading.Thread | None = None

    @property
    def ident(self) -> str:
        """The container id."""
        return self._id

    def _pump_output(self) -> None:
        from docker.utils.socket import STDERR, frames_iter

        try:
            for stream, data in frames_iter(_raw_socket(self._attached), self._tty):
                _write_all(self._stderr_fd if stream == STDERR else self._stdout_fd, data)
        except Exception:  # the attach stream broke: the container is going anyway
            return

    def _feed_stdin(self) -> None:
        sock = _raw_socket(self._attached)
        while True:
            try:
                data = os.read(self._stdin_fd, CHUNK)
            except OSError:
                return
            if not data:
                with contextlib.suppress(OSError):
                    sock.shutdown(1)
                return
            try:
                sock.sendall(data)
            except OSError:
                return

    def _begin(self) -> None:
        """Start the pumps (after the container started)."""
        self._pump.start()
        if self._tty:
            with contextlib.suppress(OSError, ImportError):
                self._terminal = _Terminal(self._stdin_fd)
            size = _window_size(self._stdin_fd)
            if size is not None:
                with contextlib.suppress(Exception):
                    self._api.resize(self._id, height=size[0], width=size[1])
            self._feeder = threading.Thread(target=self._feed_stdin, daemon=True)
            self._feeder.start()

    def poll(self) -> int | None:
        """The exit status once :meth:`wait` saw it."""
        return self._status

    async def signal(self, signum: int) -> None:
        """``kill -s signum`` on the container (its init forwards it)."""
        if self._status is None:
            with contextlib.suppress(Exception):
                await trio.to_thread.run_sync(lambda: self._api.kill(self._id, signal=signum))

    async def wait(self) -> int:
        """Wait for the container to exit and its output to drain."""
        if self._status is None:
            result = await trio.to_thread.run_sync(
                lambda: self._api.wait(self._id, timeout=None), abandon_on_cancel=True
            )
            code = result.get("StatusCode", 1) if isinstance(result, dict) else 1
            self._status = code if isinstance(code, int) and code >= 0 else 1
            await trio.to_thread.run_sync(self._pump.join, PUMP_DRAIN_S)
        return self._status

    async def stop(self, grace: float) -> int:
        """SIGTERM, ``grace`` seconds, then SIGKILL; the exit status."""
        if self._status is None:
            await self.signal(signal.SIGTERM)
            with trio.move_on_after(grace):
                return await self.wait()
            await self.signal(signal.SIGKILL)
            with trio.move_on_after(API_TIMEOUT_S):
                return await self.wait()
            self._status = 128 + signal.SIGKILL
        return self._status

    async def close(self) -> None:
        """Restore the terminal, force-remove the container, close the client."""
        if self._terminal is not None:
            self._terminal.restore()
            self._terminal = None
        _close_attached(self._attached)

        def remove() -> None:
            remove_container(self._api, self._id)
            with contextlib.suppress(Exception):
                self._api.close()

        await trio.to_thread.run_sync(remove)


async def start_container_agent(
    docker_host: str,
    spec: AgentContainer,
    *,
    fds: tuple[int, int, int] = (0, 1, 2),
) -> ContainerAgent:
    """Create, attach and start the agent container.

    Raises:
        AgentStartError: the engine refused (missing image, bad network, ...);
            whatever was created is removed.
    """
    body = _container_body(spec)
    name = f"bq-agent-{spec.run_id[:16]}"

    def create() -> tuple[Any, str, Any]:
        api = _api(docker_host)
        container_id = ""
        attached: Any = None
        try:
            created = api.create_container_from_config(body, name)
            container_id = created["Id"]
            params = {"stdout": 1, "stderr": 1, "stream": 1, "stdin": 1 if spec.tty else 0}
            attached = api.attach_socket(container_id, params=params)
            api.start(container_id)
            return api, container_id, attached
        except Exception as exc:
            if attached is not None:
                _close_attached(attached)
            if container_id:
                remove_container(api, container_id)
            api.close()
            explanation = getattr(exc, "explanation", None) or str(exc)
            raise AgentStartError(f"agent container: {explanation}"[:500]) from None

    api, container_id, attached = await trio.to_thread.run_sync(create)
    agent = ContainerAgent(api, container_id, attached, spec.tty, fds)
    agent._begin()
    return agent


def stdin_is_terminal() -> bool:
    """True when the harness's stdin is a terminal (then the agent gets a TTY)."""
    try:
        return os.isatty(sys.stdin.fileno())
    except (OSError, ValueError):
        return False


def sweep_agent_containers(docker_host: str, sink: EventSink) -> int:
    """Remove agent containers whose harness is certainly gone; return the count.

    The owner label is the harness's owner record (``sweep.py``); a container
    without a parseable one, or whose owner may be alive, is left alone.
    """
    api = _api(docker_host)
    try:
        swept = remove_labelled(api, f"{LABEL_ROLE}={ROLE_AGENT}", select=_owner_is_gone)
    finally:
        api.close()
    for ident in swept.removed:
        sink.emit("stale_agent_removed", container=ident[:12])
    return len(swept.removed)


def _owner_is_gone(labels: Mapping[str, str]) -> bool:
    """Whether an agent container's owner label names a harness that is certainly gone."""
    try:
        record = OwnerRecord.from_doc(json.loads(labels.get(LABEL_OWNER, "")))
    except ValueError:
        return False
    return record is not None and owner_is_gone(record) is not None
