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
``harness/staging/outputs.py``), where ``bounded-query-cost`` reads the budgets. So
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
    "AGENT_FORBIDDEN_CONTROLS",
    "AGENT_PROFILES",
    "AGENT_PROTOCOL_VERSION",
    "AGENT_SUBSYSTEM_VARIABLES",
    "AGENT_VARIABLES",
    "CATEGORY_AUDIT_TRUNCATED",
    "CATEGORY_BROKER_INTERNAL",
    "CATEGORY_BROKER_STOPPING",
    "CATEGORY_BUCKET_OVERFLOW",
    "CATEGORY_BUDGET_EXHAUSTED",
    "CATEGORY_CLEANUP_FAILED",
    "CATEGORY_CONNECTION_CAP",
    "CATEGORY_ENCLAVE_PROXY",
    "CATEGORY_ENCLAVE_TOPOLOGY",
    "CATEGORY_HALTED",
    "CATEGORY_HALTED_PROTECTION",
    "CATEGORY_HTTP_BODY_TIMEOUT",
    "CATEGORY_HTTP_BODY_TOO_LARGE",
    "CATEGORY_HTTP_CHUNKED",
    "CATEGORY_HTTP_CONNECTION_LOST",
    "CATEGORY_HTTP_DUPLICATE_LENGTH",
    "CATEGORY_HTTP_HEADER_TIMEOUT",
    "CATEGORY_HTTP_HEADER_TOO_LARGE",
    "CATEGORY_HTTP_MALFORMED",
    "CATEGORY_HTTP_NO_REQUEST",
    "CATEGORY_HTTP_OBS_FOLD",
    "CATEGORY_HTTP_TRUNCATED",
    "CATEGORY_HTTP_UPGRADE",
    "CATEGORY_INTERRUPTED",
    "CATEGORY_INVALID_OUTPUT",
    "CATEGORY_INVALID_REQUEST",
    "CATEGORY_JOURNAL_FAILED",
    "CATEGORY_LAUNCH_FAILED",
    "CATEGORY_MAX_INVOCATIONS",
    "CATEGORY_NONZERO_EXIT",
    "CATEGORY_OK",
    "CATEGORY_OOM",
    "CATEGORY_OTHER",
    "CATEGORY_PROTECTION_LOST",
    "CATEGORY_REFUSAL_SUMMARY",
    "CATEGORY_REPO_NOT_ALLOWED",
    "CATEGORY_RUNNER_INTERNAL",
    "CATEGORY_WORKSPACE_FAILED",
    "DEFAULTS",
    "DEFAULT_AGENT_CPU_LIMIT",
    "DEFAULT_AGENT_ENGINE",
    "DEFAULT_AGENT_IMAGE",
    "DEFAULT_AGENT_MAX_INVOCATIONS",
    "DEFAULT_AGENT_MAX_OUTPUT_BYTES",
    "DEFAULT_AGENT_MAX_TASK_BYTES",
    "DEFAULT_AGENT_PROFILE",
    "DEFAULT_AGENT_TIMEOUT_S",
    "DEFAULT_AGENT_TMPFS_LIMIT",
    "DEFAULT_DOCKER_HOST",
    "DEFAULT_DOCKER_SOCKET",
    "DEFAULT_ENABLED",
    "DEFAULT_IMAGE",
    "DEFAULT_INTERPRETER",
    "DEFAULT_MAX_INVOCATIONS",
    "DEFAULT_MAX_MODEL_REQUESTS",
    "DEFAULT_MAX_MODEL_TOKENS",
    "DEFAULT_MEMORY_LIMIT",
    "DEFAULT_RUNTIME",
    "DEFAULT_TIMEOUT_S",
    "DOCKER_API_VERSION",
    "DOCKER_UNIX_SCHEME",
    "ENCLAVE_API_PROXY_ALIAS",
    "ENCLAVE_ENGINES",
    "ENCLAVE_IMAGES",
    "ENCLAVE_MAX_OUTPUT_BYTES",
    "ENCLAVE_MAX_TASK_BYTES",
    "ENCLAVE_NETWORK",
    "ENCLAVE_OCI_RUNTIMES",
    "ENCLAVE_PIDS_LIMIT",
    "ENCLAVE_TMPFS_BYTES",
    "ENV_AGENT_REPOS",
    "ENV_AGENT_SKILL",
    "ENV_AGENT_SOCKET",
    "ENV_REPOS",
    "ENV_SKILL",
    "ENV_SOCKET",
    "INTERPRETERS",
    "LABEL_AGENT_INVOCATION",
    "LABEL_AGENT_RUN",
    "LABEL_ENCLAVE_ENGINE",
    "LABEL_INVOCATION",
    "LABEL_OWNER",
    "LABEL_ROLE",
    "LABEL_RUN",
    "LAUNCHABLE_RUNTIMES",
    "LEGACY_SENSITIVITY",
    "MAX_AGENT_TIMEOUT_S",
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
    "OCI_RUNC",
    "OCI_RUNSC",
    "OCI_RUNSC_NET",
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
    "SENSITIVITY_CONFIDENTIAL",
    "SENSITIVITY_INTERNAL",
    "SENSITIVITY_PUBLIC",
    "SENSITIVITY_SEALED",
    "SLUG_PATTERN",
    "SLUG_RE",
    "SUBSYSTEM_AGENT",
    "SUBSYSTEM_QUERY",
    "docker_socket_path",
    "parse_memory_limit",
]

# --- 14.1 sensitivity classes and run budgets -------------------------------------

#: Run budget per sensitivity class in bits (spec 14.1); None means unmetered.
#: A budget is per repository for the whole run and never refills.
SENSITIVITY_PUBLIC = "public"
SENSITIVITY_INTERNAL = "internal"
SENSITIVITY_CONFIDENTIAL = "confidential"
#: Budget 0: configured, staged, and never runs a query.
SENSITIVITY_SEALED = "sealed"
RUN_BUDGETS: Mapping[str, int | None] = MappingProxyType(
    {
        SENSITIVITY_PUBLIC: None,
        SENSITIVITY_INTERNAL: 64,
        SENSITIVITY_CONFIDENTIAL: 8,
        SENSITIVITY_SEALED: 0,
    }
)
#: The sensitivity classes, in the spec's order (least to most sensitive).
SENSITIVITIES: tuple[str, ...] = tuple(RUN_BUDGETS)
#: The metered classes and their budgets (``sealed``'s 0 bits fund nothing).
METERED_BUDGETS: Mapping[str, int] = MappingProxyType(
    {name: bits for name, bits in RUN_BUDGETS.items() if bits is not None}
)
#: A legacy bare-string ``privateRepos`` entry gets this class (spec 14.2).
LEGACY_SENSITIVITY = SENSITIVITY_INTERNAL

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
OCI_RUNC = "runc"
OCI_RUNSC = "runsc"
OCI_RUNTIMES: Mapping[str, str] = MappingProxyType(
    {RUNTIME_DOCKER: OCI_RUNC, RUNTIME_GVISOR: OCI_RUNSC}
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
#: The agent container's default image (built the same way).
DEFAULT_AGENT_IMAGE = "bounded-query-agent:latest"
#: The only Docker host scheme the harness talks to itself (sweeps,
#: reconcile) and the preflight accepts.
DOCKER_UNIX_SCHEME = "unix://"
#: The Docker Engine socket (the preflight accepts only unix:// hosts).
DEFAULT_DOCKER_SOCKET = "/var/run/docker.sock"
DEFAULT_DOCKER_HOST = DOCKER_UNIX_SCHEME + DEFAULT_DOCKER_SOCKET
#: The Engine API version every client of ours speaks (docker.io 20.10 on
#: these machines serves 1.41; pinning it skips the SDK's version probe).
DOCKER_API_VERSION = "1.41"


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

# --- 14.8 the agent's environment -----------------------------------------------------

#: The broker's Unix socket, as the agent sees it.
ENV_SOCKET = "AWF_BOUNDED_QUERY_SOCKET"
#: The generated SKILL.md, as the agent sees it.
ENV_SKILL = "AWF_BOUNDED_QUERY_SKILL"
#: The usable repositories' slugs, comma-separated.
ENV_REPOS = "AWF_BOUNDED_QUERY_REPOS"
#: The three variables the agent gets (spec 14.8), in that order.
AGENT_VARIABLES: tuple[str, ...] = (ENV_SOCKET, ENV_SKILL, ENV_REPOS)

# --- audit categories (operator records; never shown to the agent) ----------------------

#: An answered invocation whose result validated.
CATEGORY_OK = "ok"
# Admission (broker/admission.py): refused before anything touches a repository.
CATEGORY_MAX_INVOCATIONS = "max-invocations"
CATEGORY_BROKER_STOPPING = "broker-stopping"
CATEGORY_INVALID_REQUEST = "invalid-request"
CATEGORY_REPO_NOT_ALLOWED = "repo-not-allowed"
CATEGORY_BUDGET_EXHAUSTED = "bit-budget-exhausted"
CATEGORY_JOURNAL_FAILED = "journal-failed"
CATEGORY_CONNECTION_CAP = "connection-cap"
# The run and its classification.
CATEGORY_BROKER_INTERNAL = "broker-internal"
CATEGORY_RUNNER_INTERNAL = "runner-internal"
CATEGORY_WORKSPACE_FAILED = "workspace-failed"
CATEGORY_CLEANUP_FAILED = "cleanup-failed"
CATEGORY_LAUNCH_FAILED = "query-launch-failed"
CATEGORY_NONZERO_EXIT = "query-nonzero-exit"
CATEGORY_OOM = "query-oom"
CATEGORY_INVALID_OUTPUT = "invalid-output"
CATEGORY_INTERRUPTED = "interrupted-by-restart"
# The overflow halt (spec 14.3.1): the invocation that overflowed, and every
# answer after it.
CATEGORY_BUCKET_OVERFLOW = "timing-bucket-overflow"
CATEGORY_HALTED = "halted-after-overflow"
# The other halt: a protection the runner set up at start is gone (the
# page-cache pin died), and the answers after it.
CATEGORY_PROTECTION_LOST = "protection-lost"
CATEGORY_HALTED_PROTECTION = "halted-after-protection-lost"
# The transport (broker/http.py): a frame that never became a request.
CATEGORY_HTTP_MALFORMED = "http-malformed"
CATEGORY_HTTP_CONNECTION_LOST = "http-connection-lost"
CATEGORY_HTTP_HEADER_TOO_LARGE = "http-header-too-large"
CATEGORY_HTTP_OBS_FOLD = "http-obs-fold"
CATEGORY_HTTP_DUPLICATE_LENGTH = "http-duplicate-content-length"
CATEGORY_HTTP_HEADER_TIMEOUT = "http-header-timeout"
CATEGORY_HTTP_BODY_TIMEOUT = "http-body-timeout"
CATEGORY_HTTP_NO_REQUEST = "http-no-request"
CATEGORY_HTTP_CHUNKED = "http-chunked-body"
CATEGORY_HTTP_UPGRADE = "http-upgrade"
CATEGORY_HTTP_BODY_TOO_LARGE = "http-body-too-large"
CATEGORY_HTTP_TRUNCATED = "http-truncated-body"
# The audit log's own records (broker/audit.py): one line of per-category
# counts of uncounted answers, the marker of skipped lines, and the bucket
# that collects categories past the summary's bound.
CATEGORY_REFUSAL_SUMMARY = "refusal-summary"
CATEGORY_AUDIT_TRUNCATED = "audit-truncated"
CATEGORY_OTHER = "other"

# --- 15 bounded agents: the enclave -----------------------------------------------------

#: The OCI runtime name of gVisor with networking (enclaves only).
OCI_RUNSC_NET = "runsc-net"
#: Configured runtime -> OCI runtime of an enclave. An enclave needs one
#: network peer (the API proxy, spec 15.6), so gVisor needs its own
#: registration with networking: the queries' ``runsc`` has
#: ``--network=none`` and an enclave never falls back to runc (spec 15.7).
ENCLAVE_OCI_RUNTIMES: Mapping[str, str] = MappingProxyType(
    {RUNTIME_DOCKER: OCI_RUNC, RUNTIME_GVISOR: OCI_RUNSC_NET}
)
#: The dedicated internal network of enclaves (spec 15.6, ``internal: true``
#: with this explicit name).
ENCLAVE_NETWORK = "awf-bounded-agent"
#: The API proxy's fixed name on that network, the enclave's only peer (the
#: engine's base URL names it; the enclave's constant /etc/hosts maps it).
ENCLAVE_API_PROXY_ALIAS = "awf-api-proxy"
#: Engines with an enclave adapter and image so far (spec 15.2 lists
#: copilot, claude, codex, gemini; the others fail closed until they land).
ENCLAVE_ENGINES: tuple[str, ...] = ("claude", "copilot")
#: The enclave image per engine (built from Debian packages and the pinned
#: npm package, never pulled: sandbox/enclave_image/build.sh).
ENCLAVE_IMAGES: Mapping[str, str] = MappingProxyType(
    {
        "claude": "bounded-query-enclave-claude:latest",
        "copilot": "bounded-query-enclave-copilot:latest",
    }
)
#: spec 15.2 defaults: ``pidsLimit`` 128 and ``tmpfsLimit`` "64m" (each of
#: /tmp and /agent).
ENCLAVE_PIDS_LIMIT = 128
ENCLAVE_TMPFS_BYTES = 64 * 1024**2
#: spec 15.2 upper bounds of ``maxOutputBytes`` (the result file) and
#: ``maxTaskBytes`` (the caller's task text).
ENCLAVE_MAX_OUTPUT_BYTES = 8192
ENCLAVE_MAX_TASK_BYTES = 65536

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


# --- 15.2 boundedAgents: defaults and bounds; 15.8 the agent's variables ----------------

#: spec 15.2 defaults of the ``boundedAgents`` section (the others are shared
#: with ``boundedQueries`` or listed with the enclave above).
DEFAULT_AGENT_ENGINE = "copilot"
DEFAULT_AGENT_PROFILE = "openai"
AGENT_PROFILES: tuple[str, ...] = ("openai", "anthropic")
DEFAULT_AGENT_TIMEOUT_S = 120
#: 540 s: the 10-minute bucket keeps its last minute for cleanup (spec 15.2).
MAX_AGENT_TIMEOUT_S = 540
DEFAULT_AGENT_CPU_LIMIT = "1"
DEFAULT_AGENT_TMPFS_LIMIT = "64m"
DEFAULT_AGENT_MAX_OUTPUT_BYTES = ENCLAVE_MAX_OUTPUT_BYTES
DEFAULT_AGENT_MAX_TASK_BYTES = 4096
DEFAULT_AGENT_MAX_INVOCATIONS = 8
#: The bounded-agent subsystem's name (events, records, the broker config's
#: ``subsystem``); the query subsystem's is :data:`SUBSYSTEM_QUERY`.
SUBSYSTEM_AGENT = "bounded-agent"
SUBSYSTEM_QUERY = "bounded-query"
#: Labels of every bounded-agent container (spec 15.4 step 5).
LABEL_AGENT_RUN = "awf.bounded-agent.run"
LABEL_AGENT_INVOCATION = "awf.bounded-agent.invocation"
#: The agent's variables for the bounded-agent subsystem (spec 15.8).
ENV_AGENT_SOCKET = "AWF_BOUNDED_AGENT_SOCKET"
ENV_AGENT_SKILL = "AWF_BOUNDED_AGENT_SKILL"
ENV_AGENT_REPOS = "AWF_BOUNDED_AGENT_REPOS"
AGENT_SUBSYSTEM_VARIABLES: tuple[str, ...] = (ENV_AGENT_SOCKET, ENV_AGENT_SKILL, ENV_AGENT_REPOS)

# --- 15.3 bounded agents: the request frame (agent-broker) -------------------------------

#: ``X-AWF-Agent-Version``: the bounded-agent frame's one version.
AGENT_PROTOCOL_VERSION = 1
#: The trusted controls spec 15.3 names, as the request keys a caller might
#: try to set them with (``resourceLimit``; as a header, ``X-AWF-Resource-Limit``):
#: every one is refused explicitly, on top of the unknown-key and
#: unknown-header rules, so a future widening of the accepted keys fails a
#: test instead of granting a capability.
AGENT_FORBIDDEN_CONTROLS: tuple[str, ...] = (
    "image",
    "command",
    "executable",
    "mount",
    "path",
    "environment",
    "endpoint",
    "network",
    "proxy",
    "credential",
    "timeout",
    "resourceLimit",
    "runtime",
    "toolDefinition",
)


# --- agent-harness: 15.2 boundedAgents bounds, providers, the enclave images' pins ------

__all__ += [
    "AGENT_CREDENTIAL_VARIABLES",
    "AGENT_ENGINE_PROVIDERS",
    "AGENT_MODEL_PATTERN",
    "AGENT_PROVIDER_HOSTS",
    "COPILOT_BYOK_BASE_URL",
    "COPILOT_BYOK_TYPE",
    "COPILOT_BYOK_TYPES",
    "CPU_LIMIT_PATTERN",
    "DOCKER_NETWORK_NAME_PATTERN",
    "ENCLAVE_ENGINE_VERSIONS",
    "LABEL_IMAGE_ENGINE",
    "LABEL_IMAGE_ENGINE_VERSION",
    "LABEL_IMAGE_RECIPE",
    "MAX_AGENT_NANO_CPUS",
    "MAX_AGENT_PIDS_LIMIT",
    "MAX_CPU_FRACTION_DIGITS",
    "MAX_CPU_INTEGER_DIGITS",
    "MIN_AGENT_NANO_CPUS",
    "MIN_AGENT_OUTPUT_BYTES",
    "MIN_AGENT_PIDS_LIMIT",
    "MIN_AGENT_TASK_BYTES",
    "NANO_CPUS_PER_CPU",
    "parse_cpu_limit",
]

#: Bounds of ``pidsLimit`` (Docker ``--pids-limit``; spec 15.2 default
#: :data:`ENCLAVE_PIDS_LIMIT`). Docker's -1/0 mean "unlimited", so 1 is the
#: floor; the cap is a sanity bound (an engine needs tens of processes).
MIN_AGENT_PIDS_LIMIT = 1
MAX_AGENT_PIDS_LIMIT = 4096
#: ``cpuLimit`` (Docker ``--cpus``) in nano-CPUs: Docker refuses less than
#: 0.01 CPU; more than 64 CPUs is a typo on any machine this runs on.
NANO_CPUS_PER_CPU = 10**9
MIN_AGENT_NANO_CPUS = 10**7
MAX_AGENT_NANO_CPUS = 64 * 10**9
#: At most this many digits before and after the point (nano-CPU precision).
MAX_CPU_INTEGER_DIGITS = 2
MAX_CPU_FRACTION_DIGITS = 9
#: The shape of a ``cpuLimit`` (the schema file's pattern): plain decimal,
#: no sign, exponent, spaces or leading point.
CPU_LIMIT_PATTERN = r"[0-9]{1,2}(?:\.[0-9]{1,9})?"
#: ``maxOutputBytes`` and ``maxTaskBytes`` start at one byte (spec 15.2).
MIN_AGENT_OUTPUT_BYTES = 1
MIN_AGENT_TASK_BYTES = 1
#: The model name the configuration accepts: the API proxy's rule (a plain
#: provider model name such as ``claude-sonnet-4-5`` or ``gpt-4o-mini``;
#: no ``/``, space or URL).
AGENT_MODEL_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}"
#: The engine -> the ``apiProxy.targets`` provider its model calls go to,
#: and each provider's public API (the default target, over https).
AGENT_ENGINE_PROVIDERS: Mapping[str, str] = MappingProxyType(
    {"claude": "anthropic", "copilot": "copilot", "codex": "openai", "gemini": "gemini"}
)
AGENT_PROVIDER_HOSTS: Mapping[str, str] = MappingProxyType(
    {
        "anthropic": "api.anthropic.com",
        "copilot": "api.githubcopilot.com",
        "openai": "api.openai.com",
        "gemini": "generativelanguage.googleapis.com",
    }
)
#: The harness environment's provider credential per engine (read once,
#: never printed; spec 15.2/issue 18): claude's key; copilot's BYOK key with
#: its base URL and type, or its GitHub token.
AGENT_CREDENTIAL_VARIABLES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "claude": ("ANTHROPIC_API_KEY",),
        "copilot": ("COPILOT_PROVIDER_API_KEY", "COPILOT_GITHUB_TOKEN"),
        "codex": ("OPENAI_API_KEY",),
        "gemini": ("GEMINI_API_KEY",),
    }
)
#: The copilot BYOK route's companions of ``COPILOT_PROVIDER_API_KEY``, and
#: the only provider type the proxy's copilot route speaks (OpenAI chat
#: completions, broker/apiproxy/_routes.py).
COPILOT_BYOK_BASE_URL = "COPILOT_PROVIDER_BASE_URL"
COPILOT_BYOK_TYPE = "COPILOT_PROVIDER_TYPE"
COPILOT_BYOK_TYPES: tuple[str, ...] = ("openai",)
#: The pinned engine version of each enclave image (the image's
#: ``bounded-query.engine-version`` label; sandbox/enclave_image/build.sh
#: pins the same, tests/protocol/test_policy.py ties the two).
ENCLAVE_ENGINE_VERSIONS: Mapping[str, str] = MappingProxyType(
    {"claude": "2.1.328", "copilot": "1.0.102"}
)
#: The enclave images' labels (written by sandbox/enclave_image/build.sh).
LABEL_IMAGE_RECIPE = "bounded-query.recipe"
LABEL_IMAGE_ENGINE = "bounded-query.engine"
LABEL_IMAGE_ENGINE_VERSION = "bounded-query.engine-version"
#: A Docker network name ``--api-proxy-egress-network`` accepts: dockerd's
#: own rule for names, bounded.
DOCKER_NETWORK_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"


def parse_cpu_limit(text: str) -> int:
    """Parse a Docker ``--cpus`` value (``"1"``, ``"0.5"``, ``"1.25"``) into nano-CPUs.

    Exact decimal arithmetic (no float): at most
    :data:`MAX_CPU_INTEGER_DIGITS` digits, an optional point and at most
    :data:`MAX_CPU_FRACTION_DIGITS` more; no sign, exponent or spaces.

    Raises:
        ValueError: (configuration fault) anything else, or a value outside
            [:data:`MIN_AGENT_NANO_CPUS`, :data:`MAX_AGENT_NANO_CPUS`] (0.01-64).
    """
    if not isinstance(text, str) or re.fullmatch(CPU_LIMIT_PATTERN, text) is None:
        raise ValueError(f'cpuLimit {text!r}: expected a decimal number of CPUs such as "1"')
    whole, _, fraction = text.partition(".")
    value = int(whole) * NANO_CPUS_PER_CPU + int(fraction.ljust(MAX_CPU_FRACTION_DIGITS, "0"))
    if not MIN_AGENT_NANO_CPUS <= value <= MAX_AGENT_NANO_CPUS:
        raise ValueError(f"cpuLimit {text!r}: must be between 0.01 and 64")
    return value


# --- 15.5/15.6 the enclave runner (sandbox/enclave_runner.py) --------------------------

#: The enclave image's label naming its engine (sandbox/enclave_image/build.sh):
#: the runner's preflight refuses an image built for another engine.
LABEL_ENCLAVE_ENGINE = "bounded-query.engine"
#: Runner failure: the enclave network or the API proxy on it is not as the
#: run set it up (not internal, the proxy gone or moved, another member), so
#: no enclave is launched (broker/runner.py FAILURE_CATEGORIES).
CATEGORY_ENCLAVE_TOPOLOGY = "enclave-topology"
#: Runner failure: the API proxy could not be armed for the invocation, or
#: is not known to be disarmed after an earlier one; no enclave is launched.
CATEGORY_ENCLAVE_PROXY = "enclave-proxy"
#: Runner failure: the wall-clock timeout ran out and the container was killed
#: (the query runner's literal in FAILURE_CATEGORIES, named for the enclave runner).
CATEGORY_TIMEOUT = "query-timeout"

# --- 15 bounded agents: the run's lifecycle (agent-lifecycle) ---------------------------

#: Label of the engine objects the harness itself creates for the bounded-agent
#: subsystem (the API-proxy container, the enclave and egress networks); the
#: value is the run id. Never :data:`LABEL_AGENT_RUN`: the agent broker's
#: reconcile removes everything with that label, and must not remove its proxy.
LABEL_AGENT_HARNESS = "awf.bounded-agent.harness"
#: The pool the enclave network's subnet is taken from (one ``/28`` per run,
#: chosen from the run id, the next block on an overlap): outside Docker's
#: default address pools (172.17.0.0/12, 192.168.0.0/16).
ENCLAVE_SUBNET_POOL = "10.213.0.0/16"
ENCLAVE_SUBNET_PREFIX = 28
#: The API proxy's TCP port on the enclave network (the engine's base URL).
API_PROXY_PORT = 8080
#: The harness variables holding the real provider credential, per engine
#: (spec 15.6, ENGINES.md): read once, wiped, written as the proxy's 0400 file.
API_PROXY_CREDENTIAL_VARIABLES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {"claude": ("ANTHROPIC_API_KEY",)}
)
#: The upstream of each engine's provider when the configuration names none.
API_PROXY_DEFAULT_UPSTREAMS: Mapping[str, str] = MappingProxyType(
    {"claude": "https://api.anthropic.com"}
)

__all__ += [
    "API_PROXY_CREDENTIAL_VARIABLES",
    "API_PROXY_DEFAULT_UPSTREAMS",
    "API_PROXY_PORT",
    "ENCLAVE_SUBNET_POOL",
    "ENCLAVE_SUBNET_PREFIX",
    "LABEL_AGENT_HARNESS",
]

# --- 14.6 the compose broker service's label ------------------------------------------------

#: Label of the compose broker service a ``run --compose`` starts (value: the
#: run id). Never :data:`LABEL_RUN`: a broker's reconcile of its own run
#: label must not catch the broker itself.
LABEL_HARNESS_RUN = "bounded-query.harness-run"

__all__ += ["LABEL_HARNESS_RUN"]
