"""The API proxy process: the enclave's TCP side, the broker's control socket, the upstream.

Theory of operation (the trio layer over the pure modules):

* **Two listeners.** TCP ``(listen.host, listen.port)`` for the enclave
  (later on the internal bounded-agent network, spec 15.6) and a Unix
  socket for the broker (``controlSocket``, 0600 in a 0700 directory). The
  control routes exist only on the Unix socket; the TCP side only ever
  runs :func:`decide`. Both read exactly one request per connection with
  the project's transport (``broker/http.py``: head and body bounds,
  deadlines, no chunked bodies, no obsolete folding, no duplicate
  Content-Length) and close after the answer.
* **Arming.** :attr:`ApiProxy.state` follows the arming table
  (``_arming.py``). On ``arm`` the proxy opens a fresh upstream client for
  that invocation; on ``disarm`` the state changes first (so no new request
  is admitted), then every in-flight upstream exchange is cancelled and the
  client closed, and only then does the broker get its answer: when disarm
  returns, nothing of that invocation is reaching the provider any more.
  No connection is reused across invocations (an invocation's TLS session
  and pooled connections die with its client).
* **Forwarding.** :func:`decide` and the ``Forwarded`` step run without an
  await in between, so concurrent requests are counted exactly. The
  upstream client is httpx2 with ``trust_env=False`` (proxy variables and
  netrc are ignored), ``follow_redirects=False`` and explicit timeouts;
  the whole exchange is bounded by ``responseTimeout``. A 2xx response is
  streamed back chunk by chunk as it arrives (chunked encoding; at most
  :data:`MAX_RESPONSE_BYTES`, else the stream is cut) while
  :class:`UsageMeter` reads token counts from it. A 3xx is never followed
  (502); any other non-2xx status is passed on with a fixed body and at
  most a numeric ``retry-after`` (``_wire.py``).
* **Usage.** One record per request (``_usage.py``), appended in a worker
  thread; a failing usage write never changes an answer (it is reported on
  stderr once).

Errors: a client's protocol fault is a 4xx and a usage record; an upstream
fault a 502/504; a bug in a handler costs that one connection (reported on
stderr as one JSON line, never with request data).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import stat
import sys
from dataclasses import dataclass, field

import httpx2
import trio

from bounded_query.broker.apiproxy._arming import Armed, ArmingState, Disarmed, Forwarded, step
from bounded_query.broker.apiproxy._config import ProxyConfig
from bounded_query.broker.apiproxy._control import (
    ArmCommand,
    ControlError,
    DisarmCommand,
    arm_event,
    bad_request_response,
    disarm_event,
    encode_control_response,
    parse_control,
)
from bounded_query.broker.apiproxy._decide import Forward, Refuse, RequestHead, decide
from bounded_query.broker.apiproxy._limits import (
    CONNECT_TIMEOUT_S,
    CONNECTION_CAP,
    CONTROL_MAX_BODY_BYTES,
    MAX_REQUEST_BYTES,
    MAX_RESPONSE_BYTES,
    READ_TIMEOUT_S,
)
from bounded_query.broker.apiproxy._usage import CATEGORY_FORWARDED, UsageMeter, UsageRecord
from bounded_query.broker.apiproxy._wire import (
    LAST_CHUNK,
    REFUSED_BODY,
    UPSTREAM_ERROR_BODY,
    chunk,
    error_response,
    stream_head,
)
from bounded_query.broker.apiproxy.usagelog import UsageLog, utc_timestamp
from bounded_query.broker.http import HttpReject, read_request

__all__ = ["ApiProxy", "report"]

#: Deadline for writing a refusal or a control answer; a client that never reads is dropped.
SEND_TIMEOUT_S = 5.0
#: Listen backlog of both sockets.
LISTEN_BACKLOG = 128
#: After a refusal: how long and how much of the unread request is drained.
LINGER_S = 2.0
LINGER_BYTES = 1024 * 1024
RECEIVE_BYTES = 64 * 1024
#: HttpReject reasons that get a status other than 400.
_REJECT_STATUS = {"http-body-too-large": 413, "http-header-too-large": 431}


def report(event: str, **fields: object) -> None:
    """One JSON line on stderr for the operator (never request data or credentials)."""
    print(json.dumps({"event": event, **fields}, sort_keys=True), file=sys.stderr, flush=True)


@dataclass(eq=False)
class _Session:
    """One armed invocation's upstream client and its in-flight exchanges."""

    invocation: str
    client: httpx2.AsyncClient
    scopes: set[trio.CancelScope] = field(default_factory=set)
    #: Set whenever the last in-flight exchange ends.
    idle: trio.Event = field(default_factory=trio.Event)

    def enter(self, scope: trio.CancelScope) -> None:
        """One exchange started."""
        if not self.scopes:
            self.idle = trio.Event()
        self.scopes.add(scope)

    def leave(self, scope: trio.CancelScope) -> None:
        """One exchange ended."""
        self.scopes.discard(scope)
        if not self.scopes:
            self.idle.set()


@dataclass
class _Outcome:
    status: int
    category: str
    response_bytes: int = 0
    input_tokens: int | None = None
    output_tokens: int | None = None
    #: Whether a response head went to the client.
    answered: bool = False


def _bind_control(path: os.PathLike[str] | str) -> socket.socket:
    """Bind the control socket: directory 0700 (created), socket 0600, stale socket replaced."""
    path = os.fspath(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    info = os.lstat(parent)
    if not stat.S_ISDIR(info.st_mode) or info.st_mode & 0o077 or info.st_uid != os.geteuid():
        raise OSError(errno.EPERM, "control socket directory must be ours and 0700", parent)
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        old = os.umask(0o177)
        try:
            sock.bind(path)
        finally:
            os.umask(old)
        sock.listen(LISTEN_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


async def _send(stream: trio.abc.Stream, data: bytes) -> None:
    with trio.move_on_after(SEND_TIMEOUT_S):
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(data)


async def _linger(stream: trio.SocketStream) -> None:
    """Close gently after a refusal, so the client can read it.

    A request refused before it was read to the end leaves bytes unread;
    closing at once would make the kernel answer them with a reset, which
    can destroy the refusal before the client reads it. So: shut down our
    side (the client sees EOF), then read and discard what is still coming
    for a bounded time and amount (a "lingering close").
    """
    with trio.move_on_after(LINGER_S):
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_eof()
            drained = 0
            while drained < LINGER_BYTES:
                part = await stream.receive_some(RECEIVE_BYTES)
                if not part:
                    break
                drained += len(part)


class ApiProxy:
    """One API proxy: trusted config and credential in; two served sockets out."""

    def __init__(
        self,
        config: ProxyConfig,
        credential: bytes,
        usage: UsageLog,
    ) -> None:
        self.config = config
        self._credential = credential
        self._usage = usage
        self.state: ArmingState = Disarmed()
        self._session: _Session | None = None
        self._slots = trio.CapacityLimiter(CONNECTION_CAP)
        self._stop = trio.Event()
        self._usage_failed = False
        #: The TCP port actually bound (useful with ``listen.port`` 0).
        self.port: int | None = None

    @property
    def active(self) -> int:
        """Client connections holding a slot of the connection cap right now."""
        return int(self._slots.borrowed_tokens)

    def stop(self) -> None:
        """Begin a stop (idempotent)."""
        self._stop.set()

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Bind both sockets, report the TCP port to ``task_status``, serve until :meth:`stop`.

        Raises:
            OSError: an address or the control path is unusable.
        """
        config = self.config
        listeners = await trio.open_tcp_listeners(
            config.listen_port, host=config.listen_host, backlog=LISTEN_BACKLOG
        )
        try:
            control_sock = _bind_control(config.control_socket)
        except BaseException:
            for listener in listeners:
                await trio.aclose_forcefully(listener)
            raise
        control = trio.SocketListener(trio.socket.from_stdlib_socket(control_sock))
        self.port = int(listeners[0].socket.getsockname()[1])
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(trio.serve_listeners, self._client, listeners)
                await nursery.start(trio.serve_listeners, self._control, [control])
                task_status.started(self.port)
                await self._stop.wait()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self._end_session()
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(config.control_socket)

    # --- the enclave side ---------------------------------------------------------------

    async def _client(self, stream: trio.SocketStream) -> None:
        try:
            try:
                self._slots.acquire_nowait()
            except trio.WouldBlock:
                await _send(stream, error_response(503, REFUSED_BODY))
                await self._record(None, 0, _Outcome(503, "connection-cap"), None)
                await _linger(stream)
                return
            try:
                await self._exchange(stream)
            finally:
                self._slots.release()
        except Exception as exc:
            report("api-proxy-bug", error=type(exc).__name__)
        finally:
            await trio.aclose_forcefully(stream)

    async def _exchange(self, stream: trio.SocketStream) -> None:
        try:
            request = await read_request(stream, max_body=MAX_REQUEST_BYTES)
        except HttpReject as exc:
            status = _REJECT_STATUS.get(exc.reason, 400)
            await _send(stream, error_response(status, REFUSED_BODY))
            await self._record(self._invocation(), 0, _Outcome(status, exc.reason), None)
            await _linger(stream)
            return
        head = RequestHead(request.method, request.target, request.http_version, request.headers)
        decision = decide(head, request.body, self.state, self.config, self._credential)
        if isinstance(decision, Refuse):
            await _send(stream, error_response(decision.status, REFUSED_BODY))
            outcome = _Outcome(decision.status, decision.category)
            await self._record(self._invocation(), len(request.body), outcome, None)
            await _linger(stream)
            return
        # No await between the decision and the count: concurrent requests
        # are counted exactly (decide already refused an exhausted budget).
        counted = step(self.state, Forwarded())
        session = self._session
        if not counted.accepted or session is None:  # pragma: no cover - decide checked both
            await _send(stream, error_response(403, REFUSED_BODY))
            return
        self.state = counted.state
        outcome = await self._forward(stream, decision, session)
        await self._record(session.invocation, len(decision.body), outcome, decision)

    async def _forward(
        self, stream: trio.SocketStream, forward: Forward, session: _Session
    ) -> _Outcome:
        """Send ``forward`` upstream and relay the answer; never raises for I/O.

        The outcome's status is what the client got: once a stream head has
        gone out, a later failure only changes the category (the client
        sees a cut stream).
        """
        url = self.config.upstream.url(forward.target)
        outcome = _Outcome(502, "upstream-error")
        failure: tuple[int, str] | None = None
        with trio.CancelScope() as scope:
            session.enter(scope)
            try:
                with trio.move_on_after(self.config.response_timeout_s) as deadline:
                    request = session.client.build_request(
                        "POST", url, headers=list(forward.headers), content=forward.body
                    )
                    response = await session.client.send(request, stream=True)
                    try:
                        await self._relay(stream, response, outcome)
                    finally:
                        with trio.CancelScope(shield=True):
                            await response.aclose()
                if deadline.cancelled_caught:
                    failure = (504, "upstream-timeout")
            except httpx2.TimeoutException:
                failure = (504, "upstream-timeout")
            except (httpx2.HTTPError, httpx2.StreamError, OSError):
                failure = (502, "upstream-error")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                failure = (outcome.status, "client-gone")
            finally:
                session.leave(scope)
        if scope.cancelled_caught:
            failure = (502, "disarmed-midstream")
        if failure is not None:
            status, outcome.category = failure
            if not outcome.answered:
                outcome.status = status
                await _send(stream, error_response(status, UPSTREAM_ERROR_BODY))
        return outcome

    async def _relay(
        self, stream: trio.SocketStream, response: httpx2.Response, outcome: _Outcome
    ) -> None:
        """Pass an upstream response on (see the module docstring)."""
        status = response.status_code
        if status < 200 or 300 <= status < 400:
            # Never followed, never passed on: the Location is the upstream's.
            outcome.status, outcome.category = 502, "upstream-redirect"
            outcome.answered = True
            await stream.send_all(error_response(502, UPSTREAM_ERROR_BODY))
            return
        if status >= 400:
            outcome.status, outcome.category = status, "upstream-status"
            outcome.answered = True
            retry = response.headers.get("retry-after")
            retry_bytes = retry.encode("latin-1") if retry is not None else None
            await stream.send_all(error_response(status, UPSTREAM_ERROR_BODY, retry_bytes))
            outcome.response_bytes = len(UPSTREAM_ERROR_BODY)
            return
        content_type = response.headers.get("content-type")
        content_type_bytes = content_type.encode("latin-1") if content_type is not None else None
        meter = UsageMeter(content_type_bytes or b"")
        outcome.status, outcome.category = status, "upstream-truncated"
        outcome.answered = True
        await stream.send_all(stream_head(status, content_type_bytes))
        # Decoded bytes: a provider that compresses although asked for identity
        # still reaches the client readable (no content-encoding is passed on),
        # and the bound counts what is sent, so a compression bomb stops there.
        # aclosing: leaving early (the bound, a cancel) closes httpx2's generators now.
        async with contextlib.aclosing(response.aiter_bytes()) as pieces:
            async for data in pieces:
                if not data:
                    continue
                if outcome.response_bytes + len(data) > MAX_RESPONSE_BYTES:
                    outcome.category = "response-too-large"
                    return
                meter.feed(data)
                await stream.send_all(chunk(data))
                outcome.response_bytes += len(data)
                outcome.input_tokens = meter.input_tokens
                outcome.output_tokens = meter.output_tokens
        meter.finish()
        await stream.send_all(LAST_CHUNK)
        outcome.category = CATEGORY_FORWARDED
        outcome.input_tokens, outcome.output_tokens = meter.input_tokens, meter.output_tokens

    # --- the broker side ---------------------------------------------------------------

    async def _control(self, stream: trio.SocketStream) -> None:
        try:
            try:
                request = await read_request(stream, max_body=CONTROL_MAX_BODY_BYTES)
                command = parse_control(request.method, request.target, request.body)
                if isinstance(command, ArmCommand):
                    status, body = await self._arm(command)
                elif isinstance(command, DisarmCommand):
                    status, body = await self._disarm(command)
                else:
                    status, body = encode_control_response(None, self.state)
            except (HttpReject, ControlError) as exc:
                report("api-proxy-control-refused", reason=str(exc)[:200])
                status, body = bad_request_response()
            await _send(stream, error_response(status, body))
        except Exception as exc:
            report("api-proxy-bug", error=type(exc).__name__)
        finally:
            await trio.aclose_forcefully(stream)

    async def _arm(self, command: ArmCommand) -> tuple[int, bytes]:
        result = step(self.state, arm_event(command, self.config.max_model_requests))
        if result.accepted:
            assert isinstance(result.state, Armed)
            assert self._session is None
            self._session = _Session(result.state.invocation, self._new_client())
        self.state = result.state
        report("api-proxy-" + result.outcome)
        return encode_control_response(result, self.state)

    async def _disarm(self, command: DisarmCommand) -> tuple[int, bytes]:
        result = step(self.state, disarm_event(command))
        # The state changes before anything is awaited: nothing new is admitted.
        self.state = result.state
        await self._end_session()
        report("api-proxy-" + result.outcome)
        return encode_control_response(result, self.state)

    async def _end_session(self) -> None:
        session, self._session = self._session, None
        if session is None:
            return
        for scope in list(session.scopes):
            scope.cancel()
        with trio.CancelScope(shield=True):
            # Cancelled exchanges unwind at their next checkpoint; wait for them.
            if session.scopes:
                await session.idle.wait()
            with contextlib.suppress(Exception):
                await session.client.aclose()

    def _new_client(self) -> httpx2.AsyncClient:
        timeout = httpx2.Timeout(
            connect=CONNECT_TIMEOUT_S,
            read=READ_TIMEOUT_S,
            write=READ_TIMEOUT_S,
            pool=CONNECT_TIMEOUT_S,
        )
        return httpx2.AsyncClient(
            trust_env=False,
            follow_redirects=False,
            timeout=timeout,
            limits=httpx2.Limits(max_connections=CONNECTION_CAP, max_keepalive_connections=4),
        )

    # --- usage ---------------------------------------------------------------------------

    def _invocation(self) -> str | None:
        return self.state.invocation if isinstance(self.state, Armed) else None

    async def _record(
        self,
        invocation: str | None,
        request_bytes: int,
        outcome: _Outcome,
        forward: Forward | None,
    ) -> None:
        record = UsageRecord(
            timestamp=utc_timestamp(),
            invocation=invocation,
            engine=self.config.engine,
            route=self.config.route.name,
            status=outcome.status,
            category=outcome.category,
            request_bytes=request_bytes,
            response_bytes=outcome.response_bytes,
            input_tokens=outcome.input_tokens,
            output_tokens=outcome.output_tokens,
            clamped=forward.clamped if forward is not None else False,
            tools_stripped=forward.tools_stripped if forward is not None else 0,
        )
        try:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._usage.write, record)
        except OSError as exc:
            if not self._usage_failed:
                self._usage_failed = True
                report("api-proxy-usage-write-failed", errno=exc.errno)
