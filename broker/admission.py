"""The pipeline's decisions without I/O: admission and outcome (spec 14.1, 14.3-14.5, 14.10).

Theory of operation: the lane (``service.py``) is a thin trio shell around
two pure functions, so every branch of what the broker decides can be tested
as a table, without trio, files or a runner:

* :func:`admit` takes one complete request (plain values, :class:`RawRequest`),
  the trusted seed map and the ledger, and says whether the request is
  rejected (:class:`Reject`) or launched (:class:`Admit`), and which journal
  records must be durable before anything else happens. The checks run in
  the spec's order: *count* (the cap, checked first: a request past it is
  not journaled), *validate* (HTTP version, request line, frame), *look up*
  (sensitivity only from the seed map), *charge* and *afford* (nothing is
  debited for an invalid request or an unaffordable charge; ``public`` is
  unmetered; ``sealed`` can never fund the 4-bit minimum). A launch is
  authorized by one write of ``admitted`` (repo + charge), ``debit`` and
  ``launched``; a counted rejection by one ``admitted`` carrying the
  rejection.
* :func:`classify` takes what the runner reported and the raw result file
  and says how the invocation ended (:class:`Classified`): the category
  (audit only; the agent sees the canonical error for every failure) and,
  on success, the canonical re-serialization of the answer.

Categories are the protected audit vocabulary (docs/architecture.md
decision 7): the agent only ever sees :data:`CANONICAL_ERROR_BODY` or an
``ok`` body.
"""

from __future__ import annotations

from dataclasses import dataclass

from bounded_query.broker.config import SeedEntry, SeedMap
from bounded_query.broker.journal import Admitted, Debit, Launched, Outcome, Record
from bounded_query.broker.ledger import Ledger, affordable
from bounded_query.broker.protocol import (
    CANONICAL_ERROR_BODY,
    RequestError,
    Schema,
    charge,
    check_output,
    check_request_line,
    ok_body,
    policy,
)
from bounded_query.broker.runner import RunReport
from bounded_query.broker.subsystem import BOUNDED_QUERY, Subsystem

__all__ = [
    "Admit",
    "Classified",
    "RawRequest",
    "Reject",
    "admit",
    "classify",
    "schema_kind",
]


@dataclass(frozen=True, slots=True)
class RawRequest:
    """One complete request as plain values (the transport's lowercased header names).

    The pipeline never sees the transport's own types; ``server.py``
    copies these five fields out of what ``http.py`` parsed.
    """

    method: bytes
    target: bytes
    http_version: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


@dataclass(frozen=True, slots=True)
class Reject:
    """The request is answered with the canonical error and never launched.

    ``records`` is what to journal (fsync'd) before answering: one
    ``admitted`` carrying ``category`` when the rejection counts, nothing
    when it cannot count (the cap is reached, the journal has failed).
    ``entry`` is the configured repository the request named, once looked
    up; ``detail`` and ``kind`` are for the audit line only.
    """

    category: str
    records: tuple[Record, ...] = ()
    entry: SeedEntry | None = None
    detail: str | None = None
    kind: str | None = None

    @property
    def counted(self) -> bool:
        """Whether the rejection is journaled (and so counts against maxInvocations)."""
        return bool(self.records)


@dataclass(frozen=True, slots=True)
class Admit:
    """The request launches: ``records`` (admitted, debit, launched) authorize it."""

    entry: SeedEntry
    #: What the runner gets (the subsystem's payload: a query's script bytes).
    payload: bytes
    schema: Schema
    charge: int
    kind: str
    records: tuple[Record, ...]


def schema_kind(schema: Schema) -> str:
    """The root type of ``schema`` as its DSL name (``boolean``, ``object``, ...)."""
    name = type(schema.root).__name__
    return name.removesuffix("Node").lower()


def _counted(
    invocation_id: str,
    category: str,
    *,
    entry: SeedEntry | None = None,
    detail: str | None = None,
    kind: str | None = None,
) -> Reject:
    """A rejection that counts: one ``admitted`` record carrying ``category``."""
    record = Admitted(invocation_id, rejection=category)
    return Reject(category, (record,), entry, detail, kind)


def admit(
    request: RawRequest,
    seed_map: SeedMap,
    ledger: Ledger,
    max_invocations: int,
    invocation_id: str,
    *,
    accepting: bool = True,
    broken: bool = False,
    subsystem: Subsystem = BOUNDED_QUERY,
) -> Reject | Admit:
    """Decide one request (pure; module docstring for the order of the checks).

    ``invocation_id`` names the records to journal; ``accepting`` is False
    while the broker stops (a counted ``broker-stopping`` rejection);
    ``broken`` is True after a journal failure (nothing can be counted any
    more); ``subsystem`` parses the frame and makes the payload. Never
    raises for anything a client sends: every client fault is a
    :class:`Reject` whose ``detail`` names the location, never script or
    output bytes.
    """
    if broken:
        return Reject(policy.CATEGORY_BROKER_INTERNAL)
    if ledger.invocations >= max_invocations:
        return Reject(policy.CATEGORY_MAX_INVOCATIONS)
    if not accepting:
        return _counted(invocation_id, policy.CATEGORY_BROKER_STOPPING)
    try:
        if request.http_version != b"1.1":
            raise RequestError("HTTP/1.1 required")
        check_request_line(request.method, request.target)
        parsed = subsystem.parse_frame(request.headers, request.body)
    except RequestError as exc:
        return _counted(invocation_id, policy.CATEGORY_INVALID_REQUEST, detail=str(exc))
    kind = schema_kind(parsed.schema)
    entry = seed_map.lookup(parsed.private_repo)
    if entry is None:
        return _counted(invocation_id, policy.CATEGORY_REPO_NOT_ALLOWED, kind=kind)
    bits = charge(parsed.schema)
    if not affordable(bits, ledger.spent(entry.repo), entry.budget_bits):
        return _counted(invocation_id, policy.CATEGORY_BUDGET_EXHAUSTED, entry=entry, kind=kind)
    records = (
        Admitted(invocation_id, repo=entry.repo, charge=bits),
        Debit(invocation_id, entry.repo, bits),
        Launched(invocation_id),
    )
    return Admit(entry, subsystem.payload(parsed), parsed.schema, bits, kind, records)


@dataclass(frozen=True, slots=True)
class Classified:
    """How a launched invocation ended: a category and, on success, the canonical answer."""

    category: str
    canonical: str | None = None

    def __post_init__(self) -> None:
        if (self.category == policy.CATEGORY_OK) != (self.canonical is not None):
            raise ValueError("an answer exactly when the category is ok")

    @property
    def body(self) -> bytes:
        """The response body: ``ok`` with the canonical result, else the canonical error."""
        return CANONICAL_ERROR_BODY if self.canonical is None else ok_body(self.canonical)

    def outcome(self, invocation_id: str) -> Outcome:
        """The journal's ``outcome`` record for this result."""
        if self.canonical is not None:
            return Outcome(invocation_id, policy.CATEGORY_OK)
        return Outcome(invocation_id, "error", self.category)


def classify(report: RunReport | None, raw: bytes | None, schema: Schema) -> Classified:
    """Classify one invocation from the runner's report and the raw result file (pure).

    ``report`` is None when the runner raised (a runner bug:
    ``runner-internal``); a reported failure is its own category; ``raw``
    is None when the result file was missing or unacceptable (not a
    regular file, over the size cap); both that and a result that does not
    match ``schema`` strictly are ``invalid-output``.
    """
    if report is None:
        return Classified(policy.CATEGORY_RUNNER_INTERNAL)
    if report.failure is not None:
        return Classified(report.failure)
    canonical = None if raw is None else check_output(raw, schema)
    if canonical is None:
        return Classified(policy.CATEGORY_INVALID_OUTPUT)
    return Classified(policy.CATEGORY_OK, canonical)
