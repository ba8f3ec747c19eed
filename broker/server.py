"""The broker daemon: start-up recovery, the Unix socket, lifecycle (spec 14.7).

Theory of operation:

* **Start-up** (:meth:`BrokerServer.serve`): open and replay the journal
  (a torn tail is truncated and reported; corruption refuses to start), close
  every invocation found in flight with an ``interrupted`` outcome (never
  re-run, never refunded), prove the runner works, remove straggler
  containers (``runner.reconcile``) and stale ``work/*`` directories, bind
  let the runner prepare the non-sealed seeds (``warm``), bind the
  socket (directory 0770, socket 0660, optional owner), and only then write
  the readiness file ``control/ready``.
* **Serving**: an accept loop hands each connection to its own task, up to
  a connection cap; an excess connection gets the canonical error (through
  the refusal gate below) and is closed. Each connection carries one request (``http.py``), then
  goes through the serialized lane (``service.py``). Transport-level
  refusals (the cap, malformed HTTP) are answered when the lane holder of
  the moment has answered -- at once when the lane is idle -- and then
  counted against maxInvocations like every other response. The refusal
  gate (``service.py``) covers all client I/O: while a request holds the
  lane unanswered, the broker accepts nothing (new connections wait in the
  kernel's listen backlog, and a pending accept is cancelled), reads nothing
  (deadlines count only the time spent reading) and sends nothing, neither
  refusals nor ``100 Continue``; so the client cannot time the broker while
  a query runs.
* **Stopping** (:meth:`BrokerServer.stop`, wired to SIGTERM/SIGINT by
  ``__main__``): stop accepting, let the in-flight invocation finish within
  the grace period (queued requests get the canonical error), then cancel
  what is left (an invocation cut short is journaled ``interrupted``),
  reconcile, remove the workspace root's leftovers, the readiness file and
  the socket.

There is deliberately no health route: readiness is a file in the
broker-private control directory, which the agent cannot see.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from pathlib import Path

import trio
from bounded_query.broker.audit import AuditLog, AuditRecord
from bounded_query.broker.config import BrokerConfig, SeedMap
from bounded_query.broker.http import HttpReject, read_request, send_response
from bounded_query.broker.journal import JournalFile, Outcome
from bounded_query.broker.ledger import Ledger
from bounded_query.broker.protocol import CANONICAL_ERROR_BODY, MAX_SCRIPT_BYTES
from bounded_query.broker.runner import Runner
from bounded_query.broker.service import Service, remove_tree, report_bug

__all__ = [
    "DEFAULT_CONNECTION_CAP",
    "DEFAULT_GRACE_S",
    "BrokerServer",
    "Recovery",
    "recover",
]

#: Concurrent connections served; more get the canonical error (gated). Only
#: one invocation runs at a time, so this bounds queued requests and memory
#: (each connection buffers at most a 64 KiB body plus one 16 KiB read).
DEFAULT_CONNECTION_CAP = 64
#: How long SIGTERM waits for the in-flight invocation before interrupting it.
DEFAULT_GRACE_S = 10.0
#: Listen backlog; bursts beyond the cap are accepted and refused quickly.
LISTEN_BACKLOG = 1024
#: Time allowed for refusing an excess connection.
REFUSE_TIMEOUT_S = 1.0


class Recovery:
    """What start-up replay found (for the operator and the tests)."""

    def __init__(self, torn_bytes: int, interrupted: list[str], invocations: int) -> None:
        self.torn_bytes = torn_bytes
        self.interrupted = interrupted
        self.invocations = invocations


def recover(config: BrokerConfig) -> tuple[JournalFile, Ledger, Recovery]:
    """Open and replay the journal; close in-flight invocations (blocking).

    Raises:
        JournalCorrupt: the journal cannot be trusted; refuse to start.
        OSError: the private root is not usable (local fault).
    """
    journal = JournalFile.open(config.journal_path, config.run_id)
    try:
        ledger = Ledger.from_records(journal.replayed)
        stragglers = ledger.in_flight()
        if stragglers:
            records = [Outcome(i, "interrupted", "broker-restart") for i in stragglers]
            journal.append(records)
            for record in records:
                ledger.apply(record)
    except BaseException:
        journal.close()
        raise
    return journal, ledger, Recovery(journal.torn_bytes, stragglers, ledger.invocations)


def clear_work_root(work_root: Path) -> int:
    """Remove every stale workspace below ``work_root``; return how many (blocking).

    Raises:
        OSError: a workspace could not be removed (fail closed: do not serve).
    """
    work_root.mkdir(mode=0o700, parents=True, exist_ok=True)
    removed = 0
    for child in work_root.iterdir():
        if not remove_tree(child):
            raise OSError(errno.ENOTEMPTY, "cannot remove stale workspace", str(child))
        removed += 1
    return removed


def _chown(path: Path, config: BrokerConfig) -> None:
    if config.socket_uid is None and config.socket_gid is None:
        return
    uid = -1 if config.socket_uid is None else config.socket_uid
    gid = -1 if config.socket_gid is None else config.socket_gid
    os.chown(path, uid, gid, follow_symlinks=False)


def _bind_socket(config: BrokerConfig) -> socket.socket:
    path = config.socket_path
    parent = path.parent
    if not parent.exists():
        parent.mkdir(mode=0o770, parents=True)
        os.chmod(parent, 0o770)
        _chown(parent, config)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old_umask = os.umask(0o177)
        try:
            sock.bind(os.fspath(path))
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o660)
        _chown(path, config)
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def _write_ready(path: Path) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{os.getpid()}\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


class BrokerServer:
    """One broker: trusted config, seed map and runner in; a served socket out.

    The runner is injected by the caller (``__main__`` builds the sandbox
    runner from configuration; tests pass a fake). Nothing a client sends
    can choose it.
    """

    def __init__(
        self,
        config: BrokerConfig,
        seed_map: SeedMap,
        runner: Runner,
        *,
        connection_cap: int = DEFAULT_CONNECTION_CAP,
        grace_s: float = DEFAULT_GRACE_S,
        header_timeout_s: float | None = None,
        body_timeout_s: float | None = None,
    ) -> None:
        self.config = config
        self.seed_map = seed_map
        self.runner = runner
        self.connection_cap = connection_cap
        self.grace_s = grace_s
        self._timeouts: dict[str, float] = {}
        if header_timeout_s is not None:
            self._timeouts["header_timeout_s"] = header_timeout_s
        if body_timeout_s is not None:
            self._timeouts["body_timeout_s"] = body_timeout_s
        self.service: Service | None = None
        self.recovery: Recovery | None = None
        self.active = 0
        self.refused = 0
        self._idle = trio.Event()
        self._idle.set()
        self._stop = trio.Event()

    def stop(self) -> None:
        """Begin a graceful stop (idempotent; safe from a signal-watching task)."""
        self._stop.set()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Recover, listen, report ready, serve until :meth:`stop`, then shut down.

        Raises:
            JournalCorrupt: the journal cannot be trusted.
            RunnerUnavailable: the runtime cannot run queries.
            OSError: the private root or socket path is unusable.
        """
        config = self.config
        # A readiness file left by a killed predecessor must not announce us.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(config.ready_path)
        journal, ledger, recovery = await trio.to_thread.run_sync(recover, config)
        self.recovery = recovery
        audit = AuditLog(config.audit_path)
        try:
            for invocation_id in recovery.interrupted:
                # An audit write failure never stops the broker (audit.py).
                with contextlib.suppress(OSError):
                    audit.write(AuditRecord(invocation_id, "interrupted-by-restart"))
            await self.runner.preflight()
            await self.runner.reconcile()
            await trio.to_thread.run_sync(clear_work_root, config.work_root)
            await self._warm()
            self.service = Service(config, self.seed_map, self.runner, journal, ledger, audit)
            sock = _bind_socket(config)
            listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
            try:
                await trio.to_thread.run_sync(_write_ready, config.ready_path)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._accept_loop, listener, nursery)
                    task_status.started()
                    await self._stop.wait()
                    await self._shutdown(listener, nursery)
            finally:
                with trio.CancelScope(shield=True):
                    await listener.aclose()
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(config.ready_path)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(config.socket_path)
        finally:
            with trio.CancelScope(shield=True):
                with contextlib.suppress(Exception):
                    await self.runner.reconcile()
                with contextlib.suppress(OSError):
                    await trio.to_thread.run_sync(clear_work_root, config.work_root)
                if self.service is not None:
                    await self.service.flush_refusals()
                    await self.service.flush_audit()
                journal.close()
                audit.close()

    async def _warm(self) -> None:
        """Let the runner prepare seeds before we listen.

        Preparing a seed's copy-on-write view takes seconds for a large seed
        and would otherwise land that seed's first query in a later timing
        bucket. Sealed seeds are never touched (spec 14.1: a sealed
        repository never has its seed copied).
        """
        seeds = [
            self.config.seeds_root / entry.seed_id
            for entry in self.seed_map.entries.values()
            if entry.sensitivity != "sealed"
        ]
        await self.runner.warm(seeds)

    async def _shutdown(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        assert self.service is not None
        self.service.accepting = False
        await listener.aclose()  # the accept loop ends on ClosedResourceError
        with trio.move_on_after(self.grace_s):
            await self._idle.wait()
        nursery.cancel_scope.cancel()

    async def _accept_loop(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        service = self.service
        assert service is not None
        while True:
            # No accept while a query runs (the refusal gate, service.py): new
            # connections wait in the kernel's listen backlog, so excess
            # connections are only accepted, and answered, while it is open.
            await service.hold_refusal()
            try:
                with service.cancelled_when_gate_closes() as pending:
                    stream = await listener.accept()
            except trio.ClosedResourceError:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors: back off briefly instead of spinning.
                    await trio.sleep(0.01)
                    continue
                raise  # pragma: no cover - unexpected listener failure
            if pending.cancelled_caught:
                continue  # a request entered the lane first; nothing was accepted
            if self.active >= self.connection_cap:
                self.refused += 1
                nursery.start_soon(self._refuse, stream)
                continue
            self.active += 1
            if self.active == 1:
                self._idle = trio.Event()
            nursery.start_soon(self._connection, stream)

    async def _refuse(self, stream: trio.SocketStream) -> None:
        assert self.service is not None
        try:
            await self.service.hold_refusal()
            with trio.move_on_after(REFUSE_TIMEOUT_S):
                await send_response(stream, CANONICAL_ERROR_BODY)
        finally:
            await trio.aclose_forcefully(stream)
        await self.service.count_refusal("connection-cap")

    async def _connection(self, stream: trio.SocketStream) -> None:
        service = self.service
        assert service is not None
        try:
            try:
                request = await read_request(
                    stream,
                    max_body=MAX_SCRIPT_BYTES,
                    hold=service.hold_refusal,
                    **self._timeouts,
                )
            except HttpReject as exc:
                # Answered as soon as the running invocation (if any) has
                # answered -- at once when the lane is idle -- so its timing
                # depends only on the client's bytes and on answers the agent
                # already sees; then counted against maxInvocations (service.py).
                await service.hold_refusal()
                await send_response(stream, CANONICAL_ERROR_BODY)
                await service.count_refusal(exc.reason)
                return

            async def send(body: bytes) -> None:
                await send_response(stream, body)

            await service.handle(request, send)
        except Exception as exc:
            # A bug must cost one connection, never the server.
            report_bug(exc)
        finally:
            await trio.aclose_forcefully(stream)
            self.active -= 1
            if self.active == 0:
                self._idle.set()
