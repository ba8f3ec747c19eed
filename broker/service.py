"""The invocation pipeline (spec 14.1, 14.3, 14.4, 14.5, 14.7).

Theory of operation: every complete HTTP request enters one serialized lane.
The decisions are pure (``admission.py``: :func:`~bounded_query.broker.admission.admit`
and :func:`~bounded_query.broker.admission.classify`); this module is the
trio shell that journals what they decide (``accounts.py``), runs the
runner, moves files in worker threads and keeps the timing. Inside the
lane, in this order:

1. **count** it against ``maxInvocations`` (every response counts,
   rejections included; a request past the cap is rejected without being
   journaled, since the cap is already reached);
2. **validate** the request line and frame (``parse_frame``);
3. **look up** the repository in the trusted seed map (sensitivity only from
   there);
4. **charge** the schema and check the balance (nothing is debited for an
   invalid request or an unaffordable charge; ``public`` is unmetered;
   ``sealed`` can never fund the 4-bit minimum);
5. **journal** and fsync ``admitted`` with the rejection, or ``admitted``
   (repo + charge), ``debit`` and ``launched`` in one write -- only then
   does anything touch a seed;
6. create the workspace, hand the invocation to the runner, read the result
   file (O_NOFOLLOW, regular, size cap), check it strictly against the
   schema, remove the workspace, journal the outcome (unsynced: it
   authorizes nothing, and a lost outcome replays as ``interrupted``);
7. **wait for the timing bucket** measured from lane entry, then answer;
8. after a launched invocation's answer left and the lane is free, the
   **idle hook** (:meth:`Service.prepare_next`) lets the runner prepare
   that repository's next container (issue 20), so its start is off the
   next answer's path; it starts at the answer's boundary, whatever the
   query did.

Timing policy: *every* answer produced by the lane -- launched invocations
and rejections alike -- leaves at a bucket boundary measured from the moment
the request entered the lane (a rejection normally lands on the 10 ms one).
Queueing behind a previous invocation is itself bucketed time: that
invocation answered at a boundary after its own cleanup (spec 14.3.1,
"Invocations are serialized").

The refusal gate (issue 9 part 5). Transport-level refusals (malformed HTTP,
missed deadlines, the connection cap; ``server.py``) are not in the lane,
and a refusal answered the moment it is raised is a free, fine-grained
clock: its latency follows the broker's load, and the broker's work peaks
exactly when a query ends (result check, container and workspace removal),
the secret moment the bucket exists to hide. A fixed delay or a fixed grid
would not help (the wake-up at the delayed moment is just as late under
load; only the sampling rate drops). So a refusal raised while a request
holds the lane waits for that request's answer and leaves with it
(:meth:`Service.hold_refusal`): during a query the broker answers nothing
before the query's own bucketed answer, which the agent sees anyway. The
same gate stops all other client I/O (``server.py``, ``http.py``): while a
request holds the lane unanswered the server accepts no connection (a
pending accept is cancelled, :meth:`Service.cancelled_when_gate_closes`;
new connections wait in the kernel's listen backlog), reads nothing (read
deadlines count only time spent reading) and sends no ``100 Continue``, so
neither a full backlog nor a tiny socket buffer lets the client time the
broker. When the lane is idle nothing secret is running and refusals leave
at once. Floods stay bounded (the connection cap and the listen backlog);
counting is unchanged (after the answer).

Overflow halts the run (issue 9 part 6; reasoning in ``timing.py``). When
the watchdog answers an overflow, the run stops serving: the requests queued
for the lane are woken at once, and they and every later request get the
canonical error at ``timing.halted_answer_at`` (the first boundary after
the later of their arrival and the overflow answer), without waiting for the
overrun to end. The overrunning invocation keeps the lane until it has been
stopped and cleaned up, but no one waits for that any more. Nothing is
journaled after the halt (no invocation can run any more, so the cap has
nothing left to limit); the halt lasts for this broker process.

Collaborators are injected, never patched: the runner, the accounts (with
their thread runner), the workspace operations (``WorkspaceOps``), the
thread runner for file work, the wall clock of the audit lines and the id
generator; trio's own clock times the lane (MockClock in tests).

Every failure is the canonical error; its category goes only to the audit
log. A journal write failure is a local fault: the service turns *broken*
and answers every later request with the canonical error (fail closed).

maxInvocations and transport-level refusals (spec 14.10: "maxInvocations
counts every response, including rejections"). Decision: every response
counts, so a transport-level refusal (malformed HTTP, missed deadline,
oversize head or body, the connection cap) is counted too
(:meth:`Service.count_refusal`), journaled as an ``admitted`` record with
the refusal as its rejection, exactly like a lane rejection. Two
differences, both deliberate:

* it is counted *after* it was answered, so its timing keeps depending on
  nothing but the client's own bytes and the refusal gate (not on the
  journal's fsync, which an invocation could slow down); a broker killed
  between the answer and the fsync forgets those few counts, which is
  harmless: such an answer carried no repository information, and the cap
  is an operational limit, not a disclosure bound;
* once the cap is reached nothing more is journaled (as for the lane), so
  a hostile client can cause at most ``maxInvocations`` journal writes in
  a whole run.

Audit (issue 9 part 4; ``audit.py``): an answer that was journaled gets an
audit line of its own; an uncounted one (past the cap, after a journal
failure, after a halt) only adds to a per-category tally that leaves as one
summary record per interval and at shutdown, so a flood costs O(1) audit
bytes, and the file itself is capped.

The cap check and the journal append happen under one lock
(:meth:`Accounts.commit <bounded_query.broker.accounts.Accounts.commit>`),
so concurrent refusals and the lane can never count past the cap together.
Refusals are counted by group commit (:meth:`Service.count_refusal`): one
``admitted`` record each, but one append and fsync per batch, and only the
connection doing the flush waits for the disk, so a flood below the cap
cannot keep the connection slots busy (a valid request right after it is
still served).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio
from bounded_query.broker.accounts import Accounts, CapReached, ThreadRunner
from bounded_query.broker.admission import Admit, Classified, RawRequest, Reject, admit, classify
from bounded_query.broker.audit import AuditLog, AuditRecord, RefusalSummary, RefusalTally
from bounded_query.broker.config import BrokerConfig, SeedMap
from bounded_query.broker.journal import Admitted, Outcome
from bounded_query.broker.protocol import CANONICAL_ERROR_BODY, TIMING_BUCKETS_MS
from bounded_query.broker.runner import Invocation, Runner, RunReport
from bounded_query.broker.timing import (
    TOLERANCE_S,
    Landing,
    TimingOverflow,
    halted_answer_at,
    sleep_until_staged,
    wait_for_boundary,
)
from bounded_query.broker.workspace import WorkspaceOps

__all__ = [
    "BOUNDARIES_S",
    "Decision",
    "Service",
    "report_bug",
]

#: Spec 14.3.1 boundaries in seconds, from the protocol's normative constant.
BOUNDARIES_S: tuple[float, ...] = tuple(ms / 1000 for ms in TIMING_BUCKETS_MS)

Sender = Callable[[bytes], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Decision:
    """What one pass through the lane produced (before timing)."""

    body: bytes
    category: str
    sensitivity: str | None = None
    charge: int | None = None
    detail: str | None = None
    #: False when nothing was journaled for it (past the cap, broken): its
    #: audit goes to the tally, not to a line of its own.
    counted: bool = True
    #: The configured slug the request named, when it named one (audit only).
    repo: str | None = None
    #: The schema's root type, once the frame parsed (audit only).
    kind: str | None = None
    #: The seed a launched invocation ran on (for the idle hook); None otherwise.
    launched_seed: Path | None = None


def _rejected(reject: Reject) -> Decision:
    entry = reject.entry
    return Decision(
        CANONICAL_ERROR_BODY,
        reject.category,
        entry.sensitivity if entry else None,
        detail=reject.detail,
        counted=reject.counted,
        repo=entry.repo if entry else None,
        kind=reject.kind,
    )


class Service:
    """The serialized lane: accounts, runner and timing for each request."""

    def __init__(
        self,
        config: BrokerConfig,
        seed_map: SeedMap,
        runner: Runner,
        accounts: Accounts,
        audit: AuditLog,
        *,
        boundaries_s: Sequence[float] = BOUNDARIES_S,
        new_id: Callable[[], str] = lambda: secrets.token_hex(16),
        run_sync: ThreadRunner = trio.to_thread.run_sync,
        workspace: WorkspaceOps | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.seed_map = seed_map
        self.runner = runner
        self.accounts = accounts
        self.audit_log = audit
        self.boundaries_s = tuple(boundaries_s)
        self._new_id = new_id
        self._run_sync = run_sync
        self._workspace = workspace or WorkspaceOps()
        self._wall_clock = wall_clock
        self._lane = trio.Lock()
        self.accepting = True
        #: Trio time of the overflow answer that halted the run, or None.
        self.halted_at: float | None = None
        #: Opens when the current lane holder has sent its answer (refusal gate).
        self._gate: trio.Event | None = None
        #: Cancel scopes of requests waiting for the lane (woken by a halt).
        self._queued: set[trio.CancelScope] = set()
        #: Cancel scopes of client I/O to stop when the gate closes (accept).
        self._gate_watchers: set[trio.CancelScope] = set()
        self._tally = RefusalTally()
        #: Answered refusals waiting to be counted (at most the cap's room).
        self._pending_refusals: list[str] = []
        self._flushing = False
        #: (lane entry, processing end, landing or None on overflow) of the last
        #: answer, on trio's clock; for benchmarks and tests only.
        self.last_timing: tuple[float, float, Landing | None] | None = None

    @property
    def broken(self) -> bool:
        """True after a journal failure: every later request gets the canonical error."""
        return self.accounts.broken

    def _wall(self) -> float:
        return round(self._wall_clock(), 3)

    # -- counting refusals -----------------------------------------------

    async def count_refusal(self, reason: str) -> None:
        """Count and audit a transport-level refusal the server already answered.

        See the module docstring: every response counts against
        maxInvocations; nothing is journaled once the cap is reached, the
        journal has failed or the run is halted, and such an uncounted
        refusal only adds to the audit tally. Counting is a group commit:
        the refusal joins the pending batch, and the first caller to find
        no flush in progress writes every pending refusal (one ``admitted``
        record each, one fsync per batch) while the others return at once,
        so a flood never keeps more than one connection waiting for the disk.
        Never raises on a journal or audit failure.
        """
        if (
            self.broken
            or self.halted_at is not None
            or len(self._pending_refusals) >= self.accounts.room
        ):
            await self.tally(reason)
            return
        self._pending_refusals.append(reason)
        if not self._flushing:
            await self.flush_refusals()

    async def flush_refusals(self) -> None:
        """Journal and audit every pending refusal, batch by batch (also at shutdown)."""
        if self._flushing:
            return
        self._flushing = True
        try:
            while self._pending_refusals:
                batch, self._pending_refusals = self._pending_refusals, []
                await self._count_batch(batch)
        finally:
            self._flushing = False

    async def _count_batch(self, batch: list[str]) -> None:
        """Journal as many of ``batch`` as the cap allows (one append); tally the rest."""
        counted = await self._journal_refusals(batch)
        wall = self._wall()
        lines = [AuditRecord(r.invocation_id, r.rejection or "", wall_time=wall) for r in counted]
        if lines:
            await self._run_sync(self._write_lines, lines)
        for reason in batch[len(counted) :]:
            await self.tally(reason)

    async def _journal_refusals(self, batch: list[str]) -> list[Admitted]:
        """The records journaled for the head of ``batch`` (none if broken, halted or full)."""
        while not self.broken and self.halted_at is None:
            records = [Admitted(self._new_id(), rejection=r) for r in batch[: self.accounts.room]]
            if not records:
                return []
            try:
                await self.accounts.commit(records)
            except CapReached:
                continue  # the lane took a slot meanwhile: recompute the room
            except OSError:
                return []  # the service is broken now
            return records
        return []

    # -- audit -----------------------------------------------------------

    def _write_lines(self, records: Sequence[AuditRecord]) -> None:
        for record in records:
            with contextlib.suppress(OSError):
                self.audit_log.write(record)

    async def audit(self, record: AuditRecord) -> None:
        """Write one audit line; an audit failure never changes an answer."""
        # A full disk must not change the answer; the journal still holds the truth.
        with contextlib.suppress(OSError):
            await self._run_sync(self.audit_log.write, record)

    async def tally(self, category: str) -> None:
        """Count one uncounted answer in the audit tally (one summary per interval)."""
        due = self._tally.add(category, trio.current_time(), self._wall())
        if due is not None:
            await self._write_summary(due)

    async def flush_audit(self) -> None:
        """Write the pending refusal summary (at shutdown); never raises on I/O."""
        pending = self._tally.flush(self._wall())
        if pending is not None:
            await self._write_summary(pending)

    async def _write_summary(self, summary: RefusalSummary) -> None:
        with contextlib.suppress(OSError):
            await self._run_sync(self.audit_log.write_summary, summary)

    # -- the refusal gate ------------------------------------------------

    async def hold_refusal(self) -> None:
        """Wait until the current lane holder has answered (the refusal gate).

        A transport-level refusal raised while an invocation holds the lane
        leaves together with that invocation's own bucketed answer, so
        refusals are no clock while a query runs (module docstring). Returns
        at once when the lane is idle or the run is halted.
        """
        gate = self._gate
        if gate is not None:
            await gate.wait()

    @property
    def gate_open(self) -> bool:
        """True when no request holds the lane unanswered (client I/O may proceed)."""
        return self._gate is None or self._gate.is_set()

    @contextlib.contextmanager
    def cancelled_when_gate_closes(self) -> Iterator[trio.CancelScope]:
        """A cancel scope that is cancelled as soon as a request enters the lane.

        The server wraps ``accept`` in it, so no connection is accepted while
        a query runs (a client that fills the listen backlog could otherwise
        time the broker's accept).
        """
        with trio.CancelScope() as scope:
            self._gate_watchers.add(scope)
            try:
                if not self.gate_open:
                    scope.cancel()
                yield scope
            finally:
                self._gate_watchers.discard(scope)

    # -- the lane --------------------------------------------------------

    async def handle(self, request: RawRequest, send: Sender) -> None:
        """Run one request through the lane and send its bucketed answer via ``send``.

        If processing is still running at the last boundary plus the
        tolerance, a watchdog answers the canonical error at that fixed
        moment (spec 14.3.1, fail-closed overflow) instead of at the
        secret-dependent moment processing ends, and the run halts: the
        requests queued behind it and every later request get the canonical
        error at :func:`~bounded_query.broker.timing.halted_answer_at`, a
        moment that depends only on their arrival and on the overflow answer,
        never on how long the overrun lasts (module docstring).
        """
        arrived = trio.current_time()
        if self.halted_at is None:
            with trio.CancelScope() as queued:
                self._queued.add(queued)
                try:
                    await self._lane.acquire()
                finally:
                    self._queued.discard(queued)
            if not queued.cancelled_caught:
                if self.halted_at is None:
                    try:
                        decision = await self._serve_in_lane(request, send)
                    finally:
                        self._lane.release()
                    if decision.launched_seed is not None:
                        await self.prepare_next(decision.launched_seed)
                    return
                # Handed the lane just as the run halted: give it back.
                self._lane.release()
        await self._answer_halted(arrived, send)

    async def _answer_halted(self, arrived: float, send: Sender) -> None:
        """The canonical error at a moment independent of any overrun."""
        assert self.halted_at is not None
        await sleep_until_staged(halted_answer_at(arrived, self.halted_at, self.boundaries_s[0]))
        await send(CANONICAL_ERROR_BODY)
        await self.tally("halted-after-overflow")

    def _halt(self) -> None:
        """Stop serving after an overflow: wake every request queued for the lane."""
        self.halted_at = trio.current_time()
        for scope in self._queued:
            scope.cancel()
        # The operator's precise reason (the agent only ever sees the canonical error).
        line = {"event": "broker-halted", "reason": "timing-bucket-overflow"}
        print(json.dumps(line, sort_keys=True), file=sys.stderr, flush=True)

    async def prepare_next(self, seed_dir: Path) -> None:
        """The idle hook: let the runner prepare the seed's next invocation (issue 20).

        Called after an answer of that seed has left and the lane is free
        (and at start-up for every seed that can run), never while a request
        waits for it and never after a halt or during shutdown, so the
        preparation starts at a moment the agent already knows (the answer's
        boundary) whatever the query did. The runner serializes it with
        later requests itself (a request waits for a preparation under way).
        """
        if self.halted_at is not None or not self.accepting or self.broken:
            return
        try:
            await self.runner.prepare(seed_dir, self.config.work_root)
        except trio.Cancelled:
            raise
        except Exception as exc:  # a runner bug: the next query takes the cold path
            report_bug(exc)

    async def _serve_in_lane(self, request: RawRequest, send: Sender) -> Decision:
        """One lane pass (the caller holds the lane): decide, bucket, answer, audit."""
        gate = self._gate = trio.Event()
        for watcher in self._gate_watchers:
            watcher.cancel()
        try:
            start = trio.current_time()
            invocation_id = self._new_id()
            overflow_at = start + self.boundaries_s[-1] + TOLERANCE_S
            answered: list[bool] = []
            async with trio.open_nursery() as nursery:
                watchdog = trio.CancelScope()
                nursery.start_soon(self._overflow_watchdog, watchdog, overflow_at, send, answered)
                decision = await self._decide(invocation_id, request)
                watchdog.cancel()
            processed = trio.current_time()
            body, category = decision.body, decision.category
            bucket_ms: int | None
            landing: Landing | None = None
            if answered:
                # Answered (and halted) by the watchdog; nobody waits for the lane.
                body, category, bucket_ms = CANONICAL_ERROR_BODY, "timing-bucket-overflow", None
            else:
                try:
                    landing = await wait_for_boundary(start, self.boundaries_s)
                    bucket_ms = round(landing.boundary_s * 1000)
                except TimingOverflow:
                    body, category, bucket_ms = CANONICAL_ERROR_BODY, "timing-bucket-overflow", None
                self.last_timing = (start, processed, landing)
                # The refusals held during this pass leave with its answer.
                gate.set()
                await send(body)
            if answered:
                self.last_timing = (start, processed, None)
        finally:
            gate.set()
        if answered:
            decision = dataclasses.replace(decision, launched_seed=None)  # halted
        if not decision.counted:
            await self.tally(category)
            return decision
        await self.audit(
            AuditRecord(
                invocation_id=invocation_id,
                category=category,
                sensitivity=decision.sensitivity,
                charge=decision.charge,
                bucket_ms=bucket_ms,
                wall_time=self._wall(),
                detail=decision.detail,
                repo=decision.repo,
                kind=decision.kind,
            )
        )
        return decision

    async def _overflow_watchdog(
        self, scope: trio.CancelScope, at: float, send: Sender, answered: list[bool]
    ) -> None:
        """At ``at``, answer the canonical error (once) and halt, unless cancelled first."""
        with scope:
            await sleep_until_staged(at)
            answered.append(True)
            self._halt()
            gate = self._gate
            if gate is not None:
                gate.set()
            with trio.CancelScope(shield=True):
                await send(CANONICAL_ERROR_BODY)

    async def _decide(self, invocation_id: str, request: RawRequest) -> Decision:
        """Admit (pure), journal what it authorizes, run a launch; every fault is a Decision."""
        try:
            verdict = admit(
                request,
                self.seed_map,
                self.accounts.ledger,
                self.accounts.max_invocations,
                invocation_id,
                accepting=self.accepting,
                broken=self.broken,
            )
            if verdict.records:
                # One durable write authorizes everything that follows: the
                # count (and for a launch the debit and the launch itself).
                # Nothing touches a seed before fsync returns.
                await self.accounts.commit(verdict.records)
            if isinstance(verdict, Reject):
                return _rejected(verdict)
            return await self._launch(invocation_id, verdict)
        except CapReached:
            # A refusal counted meanwhile took the last slot; nothing was written.
            return Decision(CANONICAL_ERROR_BODY, "max-invocations", counted=False)
        except OSError:
            # A journal write failed: nothing after it happened.
            return Decision(CANONICAL_ERROR_BODY, "journal-failed")
        except Exception as exc:
            # A bug of ours: tell the operator (no request data), answer the
            # canonical error. An invocation left in flight is closed as
            # interrupted at the next start-up; its debit stands.
            report_bug(exc)
            return Decision(CANONICAL_ERROR_BODY, "broker-internal")

    async def _launch(self, invocation_id: str, admitted: Admit) -> Decision:
        """Run an admitted invocation and journal its outcome."""
        result = await self._run(invocation_id, admitted)
        # The outcome authorizes nothing (the bits are spent and the count is
        # taken either way), so it is not fsync'd: if it is lost in a crash,
        # replay records the invocation as interrupted, which changes no total.
        await self.accounts.commit([result.outcome(invocation_id)], sync=False)
        entry = admitted.entry
        return Decision(
            result.body,
            result.category,
            entry.sensitivity,
            admitted.charge,
            repo=entry.repo,
            kind=admitted.kind,
            launched_seed=self.config.seeds_root / entry.seed_id,
        )

    async def _run(self, invocation_id: str, admitted: Admit) -> Classified:
        """Workspace, runner, result file, classification, cleanup."""
        workspace = self.config.work_root / invocation_id
        try:
            await self._run_sync(self._workspace.make, workspace)
        except OSError:
            return Classified("workspace-failed")
        invocation = Invocation(
            run_id=self.config.run_id,
            invocation_id=invocation_id,
            seed_dir=self.config.seeds_root / admitted.entry.seed_id,
            workspace=workspace,
            script=admitted.script.encode("utf-8"),
        )
        try:
            report = await self._run_runner(invocation)
            raw: bytes | None = None
            if report is not None and report.failure is None:
                raw = await self._run_sync(self._workspace.read_result, invocation.result_path)
            result = classify(report, raw, admitted.schema)
        except BaseException as exc:
            # Cancelled (shutdown grace expired) or a bug while checking the
            # result: the invocation is interrupted, never re-run, never
            # refunded; the workspace must not survive.
            reason = "shutdown" if isinstance(exc, trio.Cancelled) else "broker-internal"
            with trio.CancelScope(shield=True):
                await self._run_sync(self._workspace.remove, workspace)
                if not self.broken:
                    with contextlib.suppress(OSError):
                        await self.accounts.commit([Outcome(invocation_id, "interrupted", reason)])
            raise
        if not await self._run_sync(self._workspace.remove, workspace):
            return Classified("cleanup-failed")
        return result

    async def _run_runner(self, invocation: Invocation) -> RunReport | None:
        """The runner's report; None when the runner raised (a runner bug)."""
        try:
            return await self.runner.run(invocation)
        except trio.Cancelled:
            raise
        except Exception:  # a runner bug: log category, answer canonical error
            return None


def report_bug(exc: BaseException) -> None:
    """One JSON line on stderr for the operator: where, not what (no request data)."""
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f"{os.path.basename(frame.filename)}:{frame.lineno}" if frame else "?"
    line = {"event": "broker-bug", "type": type(exc).__name__, "where": where}
    print(json.dumps(line, sort_keys=True), file=sys.stderr, flush=True)
