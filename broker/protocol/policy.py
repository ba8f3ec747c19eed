"""Policy constants: one source for every fact the broker, harness, sandbox and wrapper share.

Theory of operation: the numbers, names and rules of spec 14.1, 14.2 and 14.7
that more than one module needs (the sensitivity budgets, the configuration
limits and defaults, the runtime names, the container labels, the default
image and Docker host, the slug rule, the query uid, memory-limit parsing)
are defined here once and imported everywhere else. The shipped JSON Schema
of the ``boundedQueries`` section, SKILL.md and the README repeat some of
them; ``tests/protocol/test_policy.py`` ties those copies to this module.

This module lives in the protocol package because that package is copied
verbatim into the agent's wrapper directory (``bq_protocol/``, see
``harness/outputs.py``), where ``bounded-query-cost`` reads the budgets. So
it is pure and standard-library only, and must run on Python 3.8: no
``slots=True`` dataclasses, no ``X | Y`` outside annotations
(docs/architecture.md "Layout").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "AGENT_ENGINES",
    "DEFAULTS",
    "DEFAULT_DOCKER_HOST",
    "DEFAULT_ENABLED",
    "DEFAULT_IMAGE",
    "DEFAULT_INTERPRETER",
    "DEFAULT_MAX_INVOCATIONS",
    "DEFAULT_MAX_MODEL_REQUESTS",
    "DEFAULT_MAX_MODEL_TOKENS",
    "DEFAULT_MEMORY_LIMIT",
    "DEFAULT_RUNTIME",
    "DEFAULT_TIMEOUT_S",
    "DOCKER_UNIX_SCHEME",
    "INTERPRETERS",
    "LABEL_INVOCATION",
    "LABEL_OWNER",
    "LABEL_ROLE",
    "LABEL_RUN",
    "LAUNCHABLE_RUNTIMES",
    "LEGACY_SENSITIVITY",
    "MAX_INVOCATIONS",
    "MAX_MEMORY_BYTES",
    "MAX_MEMORY_DIGITS",
    "MAX_MODEL_REQUESTS",
    "MAX_MODEL_TOKENS",
    "MAX_PRIVATE_REPOS",
    "MAX_TIMEOUT_S",
    "MEMORY_LIMIT_PATTERN",
    "MEMORY_UNITS",
    "METERED_BUDGETS",
    "MIN_INVOCATIONS",
    "MIN_MEMORY_BYTES",
    "MIN_MODEL_REQUESTS",
    "MIN_MODEL_TOKENS",
    "MIN_TIMEOUT_S",
    "OCI_RUNTIMES",
    "QUERY_GID",
    "QUERY_UID",
    "RUNTIMES",
    "RUNTIME_DOCKER",
    "RUNTIME_GVISOR",
    "RUNTIME_SBX",
    "RUN_BUDGETS",
    "RUN_ID_PATTERN",
    "SENSITIVITIES",
    "SLUG_PATTERN",
    "SLUG_RE",
    "docker_socket_path",
    "parse_memory_limit",
]

# --- 14.1 sensitivity classes and run budgets -------------------------------------

#: Run budget per sensitivity class in bits (spec 14.1); None means unmetered.
#: A budget is per repository for the whole run and never refills.
RUN_BUDGETS: Mapping[str, int | None] = MappingProxyType(
    {"public": None, "internal": 64, "confidential": 8, "sealed": 0}
)
#: The sensitivity classes, in the spec's order (least to most sensitive).
SENSITIVITIES: tuple[str, ...] = tuple(RUN_BUDGETS)
#: The metered classes and their budgets (``sealed``'s 0 bits fund nothing).
METERED_BUDGETS: Mapping[str, int] = MappingProxyType(
    {name: bits for name, bits in RUN_BUDGETS.items() if bits is not None}
)
#: A legacy bare-string ``privateRepos`` entry gets this class (spec 14.2).
LEGACY_SENSITIVITY = "internal"

# --- 14.2 configuration limits --------------------------------------------------------

#: Query timeout bounds in seconds. The last minute of the 600 s timing bucket
#: (spec 14.3.1) is reserved for termination and cleanup, hence 540.
MIN_TIMEOUT_S = 1
MAX_TIMEOUT_S = 540
#: Bounds of ``maxInvocations`` (answered invocations per run, spec 14.2).
MIN_INVOCATIONS = 1
MAX_INVOCATIONS = 10000
#: At most this many configured repositories (bounds staging and the seed map).
MAX_PRIVATE_REPOS = 64

# --- 14.2 runtimes and interpreters ---------------------------------------------------

RUNTIME_DOCKER = "docker"
RUNTIME_GVISOR = "gvisor"
RUNTIME_SBX = "sbx"
#: Every runtime name spec 14.2 allows in a configuration, in the spec's order.
#: "sbx" is accepted by the configuration and refused by the runner factory
#: (fail-closed preview: it never falls back to another runtime).
RUNTIMES: tuple[str, ...] = (RUNTIME_DOCKER, RUNTIME_GVISOR, RUNTIME_SBX)
#: Configured runtime -> OCI runtime registered with dockerd ("sbx" is absent:
#: it is never launched).
OCI_RUNTIMES: Mapping[str, str] = MappingProxyType(
    {RUNTIME_DOCKER: "runc", RUNTIME_GVISOR: "runsc"}
)
#: The runtimes a runner can actually start.
LAUNCHABLE_RUNTIMES: tuple[str, ...] = tuple(OCI_RUNTIMES)
#: The only supported query interpreter.
INTERPRETERS: tuple[str, ...] = ("python3",)

# --- 14.2 defaults --------------------------------------------------------------------

DEFAULT_ENABLED = False
DEFAULT_RUNTIME = RUNTIME_DOCKER
DEFAULT_TIMEOUT_S = 30
DEFAULT_MEMORY_LIMIT = "512m"
DEFAULT_INTERPRETER = "python3"
DEFAULT_MAX_INVOCATIONS = 32
#: The defaults keyed by the configuration's property names.
DEFAULTS: Mapping[str, object] = MappingProxyType(
    {
        "enabled": DEFAULT_ENABLED,
        "runtime": DEFAULT_RUNTIME,
        "timeout": DEFAULT_TIMEOUT_S,
        "memoryLimit": DEFAULT_MEMORY_LIMIT,
        "interpreter": DEFAULT_INTERPRETER,
        "maxInvocations": DEFAULT_MAX_INVOCATIONS,
    }
)
#: The query image (built from Debian packages, never pulled).
DEFAULT_IMAGE = "bounded-query-python:latest"
#: The only Docker host scheme the harness talks to itself (sweeps,
#: reconcile) and the preflight accepts.
DOCKER_UNIX_SCHEME = "unix://"
#: The Docker Engine socket (the preflight accepts only unix:// hosts).
DEFAULT_DOCKER_HOST = DOCKER_UNIX_SCHEME + "/var/run/docker.sock"


def docker_socket_path(docker_host: str) -> str:
    """The socket path of a ``unix://`` Docker host, else the empty string."""
    if docker_host.startswith(DOCKER_UNIX_SCHEME):
        return docker_host[len(DOCKER_UNIX_SCHEME) :]
    return ""


# --- 14.7 container identity and labels ----------------------------------------------

#: The unprivileged identity of every query process ("nobody"/"nogroup",
#: spec 14.7 ``--user 65534:65534``).
QUERY_UID = 65534
QUERY_GID = 65534
#: Label keys on everything a run creates, so stragglers can be found and
#: removed by run (reconcile), by invocation, by role and by owning harness.
LABEL_RUN = "bounded-query.run"
LABEL_INVOCATION = "bounded-query.invocation"
LABEL_ROLE = "bounded-query.role"
LABEL_OWNER = "bounded-query.owner"
#: A run id (the run label's value): lower-case hex, as the harness makes them
#: (16 random bytes). The broker's configuration and the harness's owner
#: record refuse anything else, so it is always a safe label filter.
RUN_ID_PATTERN = r"[0-9a-f]{16,64}"

# --- 15.2 bounded agents: the engines and the model bounds the API proxy enforces ----

#: The coding-agent engines spec 15.2 names, in the spec's order.
AGENT_ENGINES: tuple[str, ...] = ("copilot", "claude", "codex", "gemini")
#: ``maxModelRequests``: model requests forwarded per invocation (spec 15.2,
#: 1-64, default 8). The API proxy counts them for every engine, so the
#: spec's "legacy" bound is real for copilot too (docs/architecture.md decision 10).
MIN_MODEL_REQUESTS = 1
MAX_MODEL_REQUESTS = 64
DEFAULT_MAX_MODEL_REQUESTS = 8
#: ``maxModelTokens``: the completion-token cap per model request (spec 15.2,
#: 1-32768, default 1024); the API proxy clamps each request's field to it.
MIN_MODEL_TOKENS = 1
MAX_MODEL_TOKENS = 32768
DEFAULT_MAX_MODEL_TOKENS = 1024

# --- 14.2 the owner/repo slug ------------------------------------------------------------

#: Owner: a GitHub login; repo: GitHub's repository-name characters, not "."
#: and without "..". Explicit ASCII classes; use only with ``fullmatch`` (a
#: ``$`` inside the lookahead is end-of-string there, since no class accepts a
#: newline). The schema file carries it as ``^SLUG_PATTERN$(?![\\s\\S])``.
SLUG_PATTERN = r"[A-Za-z0-9][A-Za-z0-9-]{0,38}/(?!\.$)(?![^/]*\.\.)[A-Za-z0-9._-]{1,100}"
SLUG_RE = re.compile(SLUG_PATTERN)

# --- 14.2 memory limits ------------------------------------------------------------------

#: Docker-style unit suffixes (case-insensitive) and their multipliers.
MEMORY_UNITS: Mapping[str, int] = MappingProxyType(
    {"": 1, "b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
)
#: At most this many digits, so ``int()`` stays cheap.
MAX_MEMORY_DIGITS = 15
#: The shape of a memory limit (the schema file's ``memoryLimit`` pattern).
MEMORY_LIMIT_PATTERN = f"[0-9]{{1,{MAX_MEMORY_DIGITS}}}[bkmgBKMG]?"
#: Smallest memory limit Docker accepts for a container (6 MiB).
MIN_MEMORY_BYTES = 6 * 1024**2
#: Largest memory limit we accept for a query (64 GiB): a sanity cap, not a
#: security bound; the machine class has 24 GiB.
MAX_MEMORY_BYTES = 64 * 1024**3


def parse_memory_limit(text: str) -> int:
    """Parse a Docker-style memory limit (``"512m"``, ``"1g"``) into bytes (spec 14.2).

    Accepts a plain decimal integer of at most :data:`MAX_MEMORY_DIGITS`
    ASCII digits with an optional unit ``b``, ``k``, ``m`` or ``g``
    (case-insensitive).

    Raises:
        ValueError: (configuration fault) anything else, or a value outside
            [:data:`MIN_MEMORY_BYTES`, :data:`MAX_MEMORY_BYTES`] (6m-64g).
    """
    if not isinstance(text, str) or not text:
        raise ValueError(f"memoryLimit {text!r}: expected a number with unit b, k, m or g")
    body = text.lower()
    unit = body[-1] if body[-1] in "bkmg" else ""
    digits = body[: len(body) - len(unit)]
    # isdigit() alone accepts non-ASCII digits; the length check keeps int() cheap.
    if not (digits.isascii() and digits.isdigit() and len(digits) <= MAX_MEMORY_DIGITS):
        raise ValueError(f"memoryLimit {text!r}: expected a number with unit b, k, m or g")
    value = int(digits) * MEMORY_UNITS[unit]
    if not MIN_MEMORY_BYTES <= value <= MAX_MEMORY_BYTES:
        raise ValueError(f"memoryLimit {text!r}: must be between 6m and 64g")
    return value
