"""The broker's readiness file ``<privateRoot>/control/ready`` (spec 14.8).

The broker writes it once it listens, after recovery, reconcile and warming
(``server.py``); the harness starts the agent only once it exists and then
reports what it says (``harness/lifecycle/orchestrate.py``). It is one JSON object::

    {"pid": 1234, "degraded": [{"subsystem": "page-cache pin", "reason": "..."}]}

``degraded`` lists the protections the runner could not set up
(:class:`bounded_query.broker.runner.Degradation`); the run goes on without
them, and the operator must know. The file lives in the private root (0600
in a 0700 directory): the agent never reads it.

Pure: encoding and decoding only; the callers do the I/O.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .runner import Degradation

__all__ = ["UNREADABLE", "decode_ready", "encode_ready"]

#: What :func:`decode_ready` reports for content it cannot read (fail closed:
#: a readiness file we cannot read may have listed a missing protection).
UNREADABLE = Degradation("broker", "the readiness file is unreadable; protections are unknown")


def encode_ready(pid: int, degraded: Sequence[Degradation]) -> str:
    """The file's text (one JSON line)."""
    doc = {
        "pid": pid,
        "degraded": [{"subsystem": d.subsystem, "reason": d.reason} for d in degraded],
    }
    return json.dumps(doc, sort_keys=True) + "\n"


def decode_ready(text: str) -> tuple[Degradation, ...]:
    """The degradations the file announces; ``(UNREADABLE,)`` for anything malformed."""
    try:
        doc = json.loads(text)
    except ValueError:
        return (UNREADABLE,)
    if not isinstance(doc, dict) or not isinstance(doc.get("degraded"), list):
        return (UNREADABLE,)
    found: list[Degradation] = []
    for entry in doc["degraded"]:
        if not isinstance(entry, dict):
            return (UNREADABLE,)
        subsystem, reason = entry.get("subsystem"), entry.get("reason")
        if not isinstance(subsystem, str) or not isinstance(reason, str):
            return (UNREADABLE,)
        found.append(Degradation(subsystem, reason))
    return tuple(found)
