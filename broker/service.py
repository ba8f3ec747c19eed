"""The invocation pipeline: one serialized lane (spec 14.1, 14.3-14.5, 14.7).

Theory of operation: every complete request enters one lane (its states:
``lane.py``). The decisions are pure (``admission.py``: ``admit`` and
``classify``); this module is the trio shell that journals what they decide
(``accounts.py``), runs the runner, moves files in worker threads and keeps
the timing. Inside the lane, in this order: **count** the request against
``maxInvocations`` (a request past the cap is not journaled), **validate**
its frame (the subsystem's, ``subsystem.py``), **look up** the repository in
the trusted seed map (sensitivity only from there), **charge** the schema
and check the balance, **journal** and fsync what that authorizes (only then
does anything touch a seed), create the workspace, run the runner, read and
check the result strictly, remove the workspace, journal the outcome
(unsynced: it authorizes nothing, and a lost outcome replays as
``interrupted``), and **wait for the timing bucket** measured from lane
entry.

Why everything is bucketed from lane entry: *every* answer the lane
produces, launched or rejected, leaves at a bucket boundary, so queueing
behind a previous invocation is itself bucketed time (that invocation
answered at a boundary after its own cleanup: spec 14.3.1, "Invocations
are serialized"). While a request decides, the refusal gate (``gate.py``)
holds every other client I/O; refusals are counted after they are answered
(``refusals.py``).

Why the next container is prepared after the answer: after a launched
invocation's answer left and the lane is free, the idle hook
(:meth:`Service.prepare_next`) lets the runner prepare that repository's
next container, so its start is off the next answer's path; it starts at
the answer's boundary, a moment the agent already knows, whatever the query
did.

Why an overflow halts the run (reasoning in ``timing.py``): when processing
is still running at the last boundary plus the tolerance, a watchdog
answers the canonical error at that fixed moment instead of the
secret-dependent moment processing ends, and every queued and later request
gets the canonical error at ``timing.halted_answer_at``, which depends only
on its arrival and on the overflow answer, never on the overrun.

Why a lost protection halts the run the same way: when the runner reports
that a protection it set up at start is gone (:meth:`Service.watch_runner`;
the page-cache pin died), a cross-invocation channel the channel policy
counted as closed is open again, so no later invocation may run. The
request holding the lane keeps its own answer (its query started with the
protection in place); the queued and later ones get the canonical error.

Every failure is the canonical error; its category goes only to the audit
log. A journal write failure is a local fault: the accounts turn *broken*
and every later request gets the canonical error (fail closed).
Collaborators are injected, never patched: the subsystem, the runner, the
accounts, the workspace operations, the thread runner, the wall clock of
the audit lines and the id generator; trio's clock times the lane.
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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import trio

from bounded_query.broker.accounts import Accounts, CapReached, ThreadRunner
from bounded_query.broker.admission import Admit, Classified, RawRequest, Reject, admit, classify
from bounded_query.broker.audit import AuditLog, AuditRecord
from bounded_query.broker.config import BrokerConfig, SeedMap
from bounded_query.broker.gate import RefusalGate
from bounded_query.broker.journal import Outcome
from bounded_query.broker.lane import LaneEvent, LaneState, gate_open, next_state
from bounded_query.broker.protocol import CANONICAL_ERROR_BODY, policy
from bounded_query.broker.refusals import AuditSink, RefusalCounter
from bounded_query.broker.runner import Degradation, Invocation, Runner, RunReport
from bounded_query.broker.subsystem import Subsystem, subsystem_for
from bounded_query.broker.timing import (
    BOUNDARIES_S,
    TOLERANCE_S,
    Landing,
    TimingOverflow,
    halted_answer_at,
    sleep_until_staged,
    wait_for_boundary,
)
from bounded_query.broker.workspace import WorkspaceOps

__all__ = [
    "HALTED_CATEGORIES",
    "Decision",
    "Service",
    "report_bug",
]


Sender = Callable[[bytes], Awaitable[None]]

#: Why the run halted (the reason on the operator's ``broker-halted`` line:
#: an overflow, or a protection the runner lost mid-run, ``watch_runner``)
#: -> the audit tally category of the answers after it.
HALTED_CATEGORIES: Mapping[str, str] = MappingProxyType(
    {
        policy.CATEGORY_BUCKET_OVERFLOW: policy.CATEGORY_HALTED,
        policy.CATEGORY_PROTECTION_LOST: policy.CATEGORY_HALTED_PROTECTION,
    }
)


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
        subsystem: Subsystem | None = None,
    ) -> None:
        self.config = config
        self.seed_map = seed_map
        self.runner = runner
        self.accounts = accounts
        self.audit_log = audit
        #: The config's subsystem (``subsystem_for``) unless one is injected (tests).
        self.subsystem = subsystem_for(config) if subsystem is None else subsystem
        if audit.schema != self.subsystem.audit_schema:
            raise ValueError("the audit log must write the subsystem's record type")
        self.boundaries_s = tuple(boundaries_s)
        self._new_id = new_id
        self._run_sync = run_sync
        self._workspace = workspace or WorkspaceOps()
        self._lane = trio.Lock()
        #: The lane's state (lane.py); the gate follows it.
        self.lane_state = LaneState.IDLE
        #: False once the broker stops: a request then gets ``broker-stopping``.
        self.accepting = True
        #: Trio time of the overflow answer (or the protection loss) that
        #: halted the run, or None.
        self.halted_at: float | None = None
        self._halted_category = HALTED_CATEGORIES[policy.CATEGORY_BUCKET_OVERFLOW]
        self.gate = RefusalGate()
        #: Cancel scopes of requests waiting for the lane (woken by a halt).
        self._queued: set[trio.CancelScope] = set()
        self.sink = AuditSink(audit, run_sync, wall_clock)
        self.refusals = RefusalCounter(
            accounts, self.sink, new_id, stopped=lambda: self.halted_at is not None
        )
        #: (lane entry, processing end, landing or None on overflow) of the last
        #: answer, on trio's clock; for benchmarks and tests only.
        self.last_timing: tuple[float, float, Landing | None] | None = None

    @property
    def broken(self) -> bool:
        """True after a journal failure: every later request gets the canonical error."""
        return self.accounts.broken

    def _step(self, event: LaneEvent) -> None:
        """Move the lane (lane.py's table) and the refusal gate with it."""
        was_open = gate_open(self.lane_state)
        self.lane_state = next_state(self.lane_state, event)
        if gate_open(self.lane_state):
            self.gate.open()
        elif was_open:
            self.gate.close()

    # -- what the server reports back (refusals.py) ------------------------

    async def count_refusal(self, reason: str) -> None:
        """Count and audit a transport-level refusal the server already answered."""
        await self.refusals.count(reason)

    async def flush_refusals(self) -> None:
        """Journal every pending refusal (at shutdown)."""
        await self.refusals.flush()

    async def flush_audit(self) -> None:
        """Write the pending refusal summary (at shutdown); never raises on I/O."""
        await self.sink.flush()

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
        await self.sink.tally(self._halted_category)

    def _halt(self, reason: str = policy.CATEGORY_BUCKET_OVERFLOW, **detail: str) -> None:
        """Stop serving: wake every request queued for the lane (module docstring)."""
        overflow = reason == policy.CATEGORY_BUCKET_OVERFLOW
        self._step(LaneEvent.OVERFLOW if overflow else LaneEvent.PROTECTION_LOST)
        self.halted_at = trio.current_time()
        self._halted_category = HALTED_CATEGORIES[reason]
        for scope in self._queued:
            scope.cancel()
        # The operator's precise reason (the agent only ever sees the canonical error).
        line = {"event": "broker-halted", "reason": reason, **detail}
        print(json.dumps(line, sort_keys=True), file=sys.stderr, flush=True)

    async def watch_runner(self) -> Degradation:
        """Halt the run as an overflow does when the runner loses a protection; return it.

        The server runs this for as long as it serves (module docstring).
        """
        lost = await self.runner.watch()
        if self.halted_at is None:
            self._halt(
                policy.CATEGORY_PROTECTION_LOST, subsystem=lost.subsystem, detail=lost.reason
            )
        return lost

    async def prepare_next(self, seed_dir: Path) -> None:
        """The idle hook: let the runner prepare the seed's next invocation.

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
        self._step(LaneEvent.ENTER)
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
                body, category, bucket_ms = (
                    CANONICAL_ERROR_BODY,
                    policy.CATEGORY_BUCKET_OVERFLOW,
                    None,
                )
            else:
                try:
                    landing = await wait_for_boundary(start, self.boundaries_s)
                    bucket_ms = round(landing.boundary_s * 1000)
                except TimingOverflow:
                    body, category, bucket_ms = (
                        CANONICAL_ERROR_BODY,
                        policy.CATEGORY_BUCKET_OVERFLOW,
                        None,
                    )
                self.last_timing = (start, processed, landing)
                # The refusals held during this pass leave with its answer.
                self._step(LaneEvent.ANSWER)
                await send(body)
            if answered:
                self.last_timing = (start, processed, None)
            if answered:
                decision = dataclasses.replace(decision, launched_seed=None)  # halted
            if not decision.counted:
                await self.sink.tally(category)
                return decision
            await self.sink.record(
                AuditRecord(
                    invocation_id=invocation_id,
                    category=category,
                    sensitivity=decision.sensitivity,
                    charge=decision.charge,
                    bucket_ms=bucket_ms,
                    wall_time=self.sink.wall(),
                    detail=decision.detail,
                    repo=decision.repo,
                    kind=decision.kind,
                )
            )
            return decision
        finally:
            if not gate_open(self.lane_state):
                self._step(LaneEvent.ANSWER)  # cancelled or failed before it answered
            self._step(LaneEvent.LEAVE)

    async def _overflow_watchdog(
        self, scope: trio.CancelScope, at: float, send: Sender, answered: list[bool]
    ) -> None:
        """At ``at``, answer the canonical error (once) and halt, unless cancelled first."""
        with scope:
            await sleep_until_staged(at)
            answered.append(True)
            self._halt(policy.CATEGORY_BUCKET_OVERFLOW)
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
                subsystem=self.subsystem,
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
            return Decision(CANONICAL_ERROR_BODY, policy.CATEGORY_MAX_INVOCATIONS, counted=False)
        except OSError:
            # A journal write failed: nothing after it happened.
            return Decision(CANONICAL_ERROR_BODY, policy.CATEGORY_JOURNAL_FAILED)
        except Exception as exc:
            # A bug of ours: tell the operator (no request data), answer the
            # canonical error. An invocation left in flight is closed as
            # interrupted at the next start-up; its debit stands.
            report_bug(exc)
            return Decision(CANONICAL_ERROR_BODY, policy.CATEGORY_BROKER_INTERNAL)

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
            return Classified(policy.CATEGORY_WORKSPACE_FAILED)
        invocation = Invocation(
            run_id=self.config.run_id,
            invocation_id=invocation_id,
            seed_dir=self.config.seeds_root / admitted.entry.seed_id,
            workspace=workspace,
            script=admitted.payload,
        )
        try:
            report = await self._run_runner(invocation)
            raw = None if report is None or report.failure is not None else report.result
            if raw is not None and len(raw) > self.subsystem.max_answer_bytes:
                # The runner reads with the subsystem's limit; longer is a
                # runner bug: refused like any other bad answer.
                raw = None
            result = classify(report, raw, admitted.schema)
        except BaseException as exc:
            # Cancelled (shutdown grace expired) or a bug while checking the
            # result: the invocation is interrupted, never re-run, never
            # refunded; the workspace must not survive.
            reason = (
                "shutdown" if isinstance(exc, trio.Cancelled) else policy.CATEGORY_BROKER_INTERNAL
            )
            with trio.CancelScope(shield=True):
                await self._run_sync(self._workspace.remove, workspace)
                if not self.broken:
                    with contextlib.suppress(OSError):
                        await self.accounts.commit([Outcome(invocation_id, "interrupted", reason)])
            raise
        if not await self._run_sync(self._workspace.remove, workspace):
            return Classified(policy.CATEGORY_CLEANUP_FAILED)
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
