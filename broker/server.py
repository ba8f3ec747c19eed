"""The broker daemon: start-up recovery, the Unix socket, lifecycle (spec 14.7).

Theory of operation:

* **Start-up** (:meth:`BrokerServer.serve`): open the accounts
  (``accounts.py``: replay the journal -- a torn tail is truncated and
  reported, corruption refuses to start -- and close every invocation found
  in flight with an ``interrupted`` outcome, never re-run, never refunded),
  prove the runner works, remove straggler containers (``runner.reconcile``)
  and stale ``work/*`` directories, let the runner prepare the non-sealed
  seeds (``warm``), bind the socket (directory 0770, socket 0660, optional
  owner), and only then write the readiness file ``control/ready`` with the
  protections the runner could not set up (``readiness.py``).
* **Serving**: ``trio.serve_listeners`` accepts (it also backs off on the
  capacity errnos EMFILE, ENFILE, ENOBUFS and ENOMEM, every 100 ms; its log
  becomes a decimated JSON line, :func:`json_accept_log`) from a
  :class:`GatedListener` and starts one handler task per connection in the
  handler nursery. A ``trio.CapacityLimiter`` is the connection cap: a
  handler that finds no free slot answers the canonical error (through the
  refusal gate below) and closes; excess connections beyond what was
  accepted wait in the kernel's listen backlog. Each connection carries one
  request (``http.py``), then goes through the serialized lane
  (``service.py``). Transport-level
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
  ``__main__``): stop accepting (the accept task is cancelled, which closes
  the listener), give the handler nursery a cancel deadline of now plus the
  grace period, so the in-flight invocation may finish (queued requests get
  the canonical error) and whatever is left at the deadline is cancelled (an
  invocation cut short is journaled ``interrupted``); then reconcile, remove
  the workspace root's leftovers, the readiness file and the socket, and
  close the runner (``Runner.aclose``: the server owns it from ``serve`` on).

There is deliberately no health route: readiness is a file in the
broker-private control directory, which the agent cannot see.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import socket
import stat
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import trio

from bounded_query.broker.accounts import Accounts, Recovery, ThreadRunner, open_accounts
from bounded_query.broker.admission import RawRequest
from bounded_query.broker.audit import AuditLog, AuditRecord
from bounded_query.broker.config import BrokerConfig, SeedMap
from bounded_query.broker.http import HttpReject, read_request, send_response
from bounded_query.broker.protocol import CANONICAL_ERROR_BODY, policy
from bounded_query.broker.readiness import encode_ready
from bounded_query.broker.runner import Degradation, Runner
from bounded_query.broker.service import Service, report_bug
from bounded_query.broker.subsystem import subsystem_for
from bounded_query.broker.workspace import WorkspaceOps, remove_tree

__all__ = [
    "DEFAULT_CONNECTION_CAP",
    "DEFAULT_GRACE_S",
    "BrokerServer",
    "GatedListener",
    "Recovery",
    "clear_work_root",
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


def _write_ready(path: Path, degraded: Sequence[Degradation]) -> None:
    """Atomically write the readiness file (``readiness.py``: pid and degradations)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(encode_ready(os.getpid(), degraded))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


class _AcceptBackoffLog(logging.Handler):
    """``trio.serve_listeners``' capacity-errno complaint as one JSON line, decimated.

    trio logs every retry (every 100 ms while descriptors are exhausted) with
    a traceback; the broker's stderr carries single JSON lines only, so the
    operator gets the 1st, 10th, 100th, ... occurrence with its count.
    """

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        if str(self.count).strip("0") != "1":
            return
        exc = record.exc_info[1] if record.exc_info else None
        code = exc.errno if isinstance(exc, OSError) and exc.errno is not None else None
        line = {
            "event": "broker-accept-backoff",
            "errno": errno.errorcode.get(code, "?") if code is not None else "?",
            "count": self.count,
        }
        print(json.dumps(line, sort_keys=True), file=sys.stderr, flush=True)


@contextlib.contextmanager
def json_accept_log() -> Iterator[_AcceptBackoffLog]:
    """Route ``trio.serve_listeners``' log to :class:`_AcceptBackoffLog` while serving."""
    logger = logging.getLogger("trio.serve_listeners")
    handler = _AcceptBackoffLog()
    propagate = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


class GatedListener(trio.abc.Listener[trio.SocketStream]):
    """A listener that accepts only while the refusal gate is open (``service.py``).

    No accept while a query runs: new connections wait in the kernel's listen
    backlog, and an accept already pending when a request enters the lane is
    cancelled (nothing is accepted then), so excess connections are only
    accepted, and answered, while the gate is open. Errors of the inner
    listener (the capacity errnos included) propagate to
    ``trio.serve_listeners``.
    """

    def __init__(self, inner: trio.abc.Listener[trio.SocketStream], service: Service) -> None:
        self._inner = inner
        self._service = service

    async def accept(self) -> trio.SocketStream:
        """The next connection accepted while the gate is open."""
        while True:
            await self._service.gate.hold()
            with self._service.gate.cancelled_when_closed():
                return await self._inner.accept()
            # A request entered the lane first; nothing was accepted.

    async def aclose(self) -> None:
        """Close the inner listener (idempotent)."""
        await self._inner.aclose()


class BrokerServer:
    """One broker: trusted config, seed map and runner in; a served socket out.

    The runner is injected by the caller (``__main__`` builds the sandbox
    runner from configuration; tests pass a fake). Nothing a client sends
    can choose it. :meth:`serve` owns it: it is closed (``aclose``) when
    ``serve`` returns. ``run_sync`` (blocking work off the event loop) and
    ``workspace`` (the pipeline's file operations) are injected for tests.
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
        run_sync: ThreadRunner = trio.to_thread.run_sync,
        workspace: WorkspaceOps | None = None,
    ) -> None:
        self.config = config
        self.seed_map = seed_map
        self.runner = runner
        #: What the config says this broker serves (``subsystem.py``).
        self.subsystem = subsystem_for(config)
        self.connection_cap = connection_cap
        self.grace_s = grace_s
        self._timeouts: dict[str, float] = {}
        if header_timeout_s is not None:
            self._timeouts["header_timeout_s"] = header_timeout_s
        if body_timeout_s is not None:
            self._timeouts["body_timeout_s"] = body_timeout_s
        self._run_sync = run_sync
        self._workspace = workspace
        self.service: Service | None = None
        self.recovery: Recovery | None = None
        #: Connections refused at the cap (for tests and benchmarks).
        self.refused = 0
        self._slots = trio.CapacityLimiter(connection_cap)
        self._stop = trio.Event()

    @property
    def active(self) -> int:
        """Connections holding a slot of the connection cap right now."""
        return self._slots.borrowed_tokens

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
        try:
            await self._serve(task_status)
        finally:
            with trio.CancelScope(shield=True), contextlib.suppress(Exception):
                await self.runner.aclose()

    async def _serve(self, task_status: trio.TaskStatus[None]) -> None:
        config = self.config
        run_sync = self._run_sync
        # A readiness file left by a killed predecessor must not announce us.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(config.ready_path)
        accounts, recovery = await open_accounts(
            config.journal_path, config.run_id, config.max_invocations, run_sync=run_sync
        )
        self.recovery = recovery
        audit = AuditLog(config.audit_path, schema=self.subsystem.audit_schema)
        try:
            for invocation_id in recovery.interrupted:
                # An audit write failure never stops the broker (audit.py).
                with contextlib.suppress(OSError):
                    audit.write(AuditRecord(invocation_id, policy.CATEGORY_INTERRUPTED))
            await self.runner.preflight()
            await self.runner.reconcile()
            await run_sync(clear_work_root, config.work_root)
            await self._warm()
            self.service = self._new_service(accounts, audit)
            sock = _bind_socket(config)
            listener = GatedListener(
                trio.SocketListener(trio.socket.from_stdlib_socket(sock)), self.service
            )
            try:
                await run_sync(_write_ready, config.ready_path, self.runner.degradations())
                await self._accept_until_stopped(listener, task_status)
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
                    await run_sync(clear_work_root, config.work_root)
                if self.service is not None:
                    await self.service.flush_refusals()
                    await self.service.flush_audit()
                accounts.close()
                audit.close()

    def _new_service(self, accounts: Accounts, audit: AuditLog) -> Service:
        return Service(
            self.config,
            self.seed_map,
            self.runner,
            accounts,
            audit,
            run_sync=self._run_sync,
            workspace=self._workspace,
            subsystem=self.subsystem,
        )

    async def _accept_until_stopped(
        self, listener: GatedListener, task_status: trio.TaskStatus[None]
    ) -> None:
        """Serve connections until :meth:`stop`; then the stop grace as a nursery deadline."""
        service = self.service
        assert service is not None
        with json_accept_log():
            async with trio.open_nursery() as handlers:
                async with trio.open_nursery() as acceptor:
                    await acceptor.start(
                        functools.partial(
                            trio.serve_listeners, self._handle, [listener], handler_nursery=handlers
                        )
                    )
                    acceptor.start_soon(self._watch_protections, service)
                    task_status.started()
                    await self._stop.wait()
                    service.accepting = False
                    acceptor.cancel_scope.cancel()  # serve_listeners closes the listener
                # The in-flight invocation may finish within the grace; whatever
                # is still running at the deadline is cancelled.
                handlers.cancel_scope.deadline = trio.current_time() + self.grace_s

    async def _watch_protections(self, service: Service) -> None:
        """Halt on a protection lost mid-run, then say so in the readiness file.

        The harness reads the file again once the agent is done and reports
        the loss (``harness/lifecycle/orchestrate.py``); stderr has the precise reason.
        """
        lost = await service.watch_runner()
        announced = self.runner.degradations()
        if lost not in announced:
            announced = (*announced, lost)
        with contextlib.suppress(OSError):
            await self._run_sync(_write_ready, self.config.ready_path, announced)

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
            if entry.sensitivity != policy.SENSITIVITY_SEALED
        ]
        await self.runner.warm(seeds)
        for seed in seeds:
            # the first query of each seed finds its container prepared
            await self.runner.prepare(seed, self.config.work_root)

    async def _handle(self, stream: trio.SocketStream) -> None:
        """One accepted connection: take a slot of the cap, or refuse it."""
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            self.refused += 1
            await self._refuse(stream)
            return
        try:
            await self._connection(stream)
        finally:
            self._slots.release()

    async def _refuse(self, stream: trio.SocketStream) -> None:
        assert self.service is not None
        try:
            await self.service.gate.hold()
            with trio.move_on_after(REFUSE_TIMEOUT_S):
                await send_response(stream, CANONICAL_ERROR_BODY)
        finally:
            await trio.aclose_forcefully(stream)
        await self.service.count_refusal(policy.CATEGORY_CONNECTION_CAP)

    async def _connection(self, stream: trio.SocketStream) -> None:
        service = self.service
        assert service is not None
        try:
            try:
                request = await read_request(
                    stream,
                    max_body=service.subsystem.max_body_bytes,
                    hold=service.gate.hold,
                    **self._timeouts,
                )
            except HttpReject as exc:
                # Answered as soon as the running invocation (if any) has
                # answered -- at once when the lane is idle -- so its timing
                # depends only on the client's bytes and on answers the agent
                # already sees; then counted against maxInvocations (service.py).
                await service.gate.hold()
                await send_response(stream, CANONICAL_ERROR_BODY)
                await service.count_refusal(exc.reason)
                return

            async def send(body: bytes) -> None:
                await send_response(stream, body)

            raw = RawRequest(
                request.method, request.target, request.http_version, request.headers, request.body
            )
            await service.handle(raw, send)
        except Exception as exc:
            # A bug must cost one connection, never the server.
            report_bug(exc)
        finally:
            await trio.aclose_forcefully(stream)
