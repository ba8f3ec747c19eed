"""Validating and normalizing the ``boundedAgents`` section (spec 15.2).

Theory of operation: the section is checked the way ``boundedQueries`` is
(``config.py``): the shipped JSON Schema ``bounded-agents.schema.json``
(closed world for the section) collects every problem with its location and
a fix hint, then the checks no pattern can state run on the schema-valid
values -- the memory and tmpfs ranges (the shared ``parse_memory_limit``),
``tmpfsLimit`` at most ``memoryLimit``, the ``cpuLimit`` range, repositories
unique case-insensitively, and ``container.enableDind`` refused while the
subsystem is enabled. The schema applies to the whole document, but only
when it has a ``boundedAgents`` section: of the AWF sections ``apiProxy``
and ``container`` only ``apiProxy.targets.<provider>.{host, basePath}`` and
``container.enableDind`` are read, so a document without bounded agents is
judged exactly as before.

``container.enableDind`` (decided): refused only while bounded agents are
enabled. Spec 15.2 makes "enableDind disabled" a bounded-agent requirement
(the primary agent reaching the enclave's Docker daemon would bypass every
disclosure bound); this harness never gives an agent a Docker daemon, and
without bounded agents the key is AWF's, ignored like the rest of the
``container`` section.

The API target: the engine's provider (``policy.AGENT_ENGINE_PROVIDERS``)
names the ``apiProxy.targets`` entry; absent, the provider's public API over
https. ``host`` is ``HOST[:PORT]``, optionally with ``https://`` or
``http://``; a plain-http target is normalized here and refused by the
preflight unless ``--allow-insecure-api-target`` was given (the flag is the
command line's, not the document's). The final parse is the API proxy's own
(``parse_upstream_url``), so a target the harness accepts is one the proxy
accepts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bounded_query.broker.apiproxy._config import ConfigError as ProxyConfigError
from bounded_query.broker.apiproxy._config import parse_upstream_url
from bounded_query.broker.protocol import policy
from bounded_query.harness.configuration.config import (
    ApiTarget,
    BoundedAgentsConfig,
    PrivateRepo,
    Problem,
    strict_validator,
)

__all__ = [
    "AGENTS_SCHEMA_PATH",
    "AGENTS_SECTION",
    "default_target",
    "normalize_agents",
    "parse_api_target",
    "provider_of",
    "target_problems",
    "validate_agents",
]

#: Name of the section (spec 15.2).
AGENTS_SECTION = "boundedAgents"
#: The JSON Schema of the section and of the keys it reads elsewhere.
AGENTS_SCHEMA_PATH = Path(__file__).parent.parent / "bounded-agents.schema.json"

_SLUG_HINT = (
    'use a bare "owner/repo" slug (letters, digits, "-" in the owner; letters, '
    'digits, ".", "_", "-" in the name; no "://", "..", "?", "#", "*" or extra "/")'
)


def _one_of(names: Iterable[str]) -> str:
    quoted = [f'"{name}"' for name in names]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1]


def _range(low: int, high: int, unit: str = "") -> str:
    return f"use a whole number{unit} from {low} to {high}"


_HINTS: Mapping[str, str] = {
    "enabled": "use true or false",
    "privateRepos": 'use a list of {"repo": "owner/repo", "sensitivity": ...} objects',
    "repo": _SLUG_HINT,
    "sensitivity": "use " + _one_of(policy.SENSITIVITIES),
    "runtime": "use " + _one_of(policy.RUNTIMES),
    "engine": "use " + _one_of(policy.AGENT_ENGINES),
    "profile": "use " + _one_of(policy.AGENT_PROFILES),
    "model": (
        'use the provider\'s plain model name, such as "claude-sonnet-4-5" or "gpt-4o-mini"'
        ' (letters, digits, ".", "_", ":", "-"; at most 128 characters)'
    ),
    "timeout": _range(policy.MIN_TIMEOUT_S, policy.MAX_AGENT_TIMEOUT_S, " of seconds"),
    "memoryLimit": 'use a Docker-style limit from "6m" to "64g", such as "512m" or "1g"',
    "tmpfsLimit": 'use a Docker-style size from "6m" up to memoryLimit, such as "64m"',
    "cpuLimit": 'use a Docker --cpus value from "0.01" to "64" as a string, such as "1" or "0.5"',
    "pidsLimit": _range(policy.MIN_AGENT_PIDS_LIMIT, policy.MAX_AGENT_PIDS_LIMIT),
    "maxOutputBytes": _range(policy.MIN_AGENT_OUTPUT_BYTES, policy.ENCLAVE_MAX_OUTPUT_BYTES),
    "maxTaskBytes": _range(policy.MIN_AGENT_TASK_BYTES, policy.ENCLAVE_MAX_TASK_BYTES),
    "maxInvocations": _range(policy.MIN_INVOCATIONS, policy.MAX_INVOCATIONS),
    "maxModelRequests": _range(policy.MIN_MODEL_REQUESTS, policy.MAX_MODEL_REQUESTS),
    "maxModelTokens": _range(policy.MIN_MODEL_TOKENS, policy.MAX_MODEL_TOKENS),
    "host": (
        'use "HOST[:PORT]" (lower case), optionally with "https://"; "http://HOST[:PORT]"'
        " only together with --allow-insecure-api-target; no path, user or query"
    ),
    "basePath": 'use "" or "/segment[/segment...]" (no trailing "/", no "." or "..")',
    "enableDind": "use true or false (bounded agents need false)",
    "targets": "name the provider: " + _one_of(sorted(policy.AGENT_PROVIDER_HOSTS)),
}
_REQUIRED_HINTS: Mapping[str, str] = {
    "model": "add model: " + _HINTS["model"].removeprefix("use "),
    "privateRepos": 'add privateRepos: [{"repo": "owner/repo", "sensitivity": "internal"}]',
    "repo": 'add "repo": "owner/repo"',
    "sensitivity": "add sensitivity: " + _one_of(policy.SENSITIVITIES),
}


def _location(path: Iterable[object]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


def _hint(error: Any) -> str:
    path = list(error.absolute_path)
    if error.validator == "required":
        missing = [name for name in _REQUIRED_HINTS if f"'{name}'" in error.message]
        if missing:
            return _REQUIRED_HINTS[missing[0]]
    if error.validator == "minItems" and path[-1:] == ["privateRepos"]:
        return _REQUIRED_HINTS["privateRepos"]
    field = next((p for p in reversed(path) if isinstance(p, str)), None)
    if path[:2] == [AGENTS_SECTION, "privateRepos"] and isinstance(path[-1], int):
        return 'use {"repo": "owner/repo", "sensitivity": "internal"} (no bare-string form)'
    if field is not None and field in _HINTS:
        return _HINTS[field]
    if path[:1] == ["apiProxy"]:
        return 'use "apiProxy": {"targets": {"<provider>": {"host": ..., "basePath": ...}}}'
    if path[:1] == ["container"]:
        return 'use "container": {"enableDind": false}'
    return "make boundedAgents a mapping of the properties in spec 15.2"


def _schema_problems(document: Mapping[str, Any]) -> list[Problem]:
    problems: list[Problem] = []
    for error in strict_validator(AGENTS_SCHEMA_PATH).iter_errors(document):
        path = list(error.absolute_path)
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            allowed = sorted(error.schema.get("properties", {}))
            for key in sorted(set(error.instance) - set(allowed), key=str):
                problems.append(
                    Problem(
                        _location([*path, key]),
                        "unknown property",
                        "remove it; allowed: " + ", ".join(allowed),
                    )
                )
            continue
        message = error.message
        if error.validator == "required":
            missing = [name for name in _REQUIRED_HINTS if f"'{name}'" in message]
            if missing and missing[0] in ("model", "privateRepos"):
                path = [*path, missing[0]]
                message = "missing: required while enabled is true"
        if error.validator == "pattern":  # the regex itself helps nobody
            what = "owner/repo slug" if "privateRepos" in path else "value"
            message = f"{error.instance!r} is not a valid {what}"
        elif error.validator == "minItems":
            message = "no repository is configured while enabled is true"
        if len(message) > 200:
            message = message[:200] + "..."
        problems.append(Problem(_location(path), message, _hint(error)))
    return problems


def _range_problems(section: Mapping[str, Any]) -> list[Problem]:
    """What the schema's patterns cannot state (run on a schema-valid section)."""
    problems: list[Problem] = []
    where = AGENTS_SECTION
    memory: int | None = None
    for key, default in (
        ("memoryLimit", policy.DEFAULT_MEMORY_LIMIT),
        ("tmpfsLimit", policy.DEFAULT_AGENT_TMPFS_LIMIT),
    ):
        text = section.get(key, default)
        try:
            value = policy.parse_memory_limit(text)
        except ValueError as exc:
            message = str(exc).replace("memoryLimit", key, 1)
            problems.append(Problem(f"{where}.{key}", message, _HINTS[key]))
            continue
        if key == "memoryLimit":
            memory = value
        elif memory is not None and value > memory:
            problems.append(
                Problem(
                    f"{where}.tmpfsLimit",
                    f"tmpfsLimit {text!r} is larger than memoryLimit: the enclave's tmpfs"
                    " mounts are charged to its memory",
                    _HINTS["tmpfsLimit"],
                )
            )
    try:
        policy.parse_cpu_limit(section.get("cpuLimit", policy.DEFAULT_AGENT_CPU_LIMIT))
    except ValueError as exc:
        problems.append(Problem(f"{where}.cpuLimit", str(exc), _HINTS["cpuLimit"]))
    seen: dict[str, int] = {}
    for index, entry in enumerate(section.get("privateRepos", [])):
        key = entry["repo"].lower()
        if key in seen:
            problems.append(
                Problem(
                    f"{where}.privateRepos[{index}]",
                    f"duplicate of privateRepos[{seen[key]}] (slugs compare case-insensitively)",
                    "list each repository once",
                )
            )
        else:
            seen[key] = index
    return problems


def validate_agents(document: Any) -> list[Problem]:
    """Every problem of the ``boundedAgents`` section and the keys it reads.

    Returns an empty list when the document has no such section (or is not
    a mapping: ``config.validate_section`` reports that once).
    """
    if not isinstance(document, dict) or AGENTS_SECTION not in document:
        return []
    problems = _schema_problems(document)
    section = document[AGENTS_SECTION]
    if problems:
        return sorted(problems, key=lambda p: (p.location, p.message))
    problems += _range_problems(section)
    problems += target_problems(document)
    container = document.get("container")
    if (
        section.get("enabled") is True
        and isinstance(container, dict)
        and container.get("enableDind") is True
    ):
        problems.append(
            Problem(
                "container.enableDind",
                "enableDind is true while bounded agents are enabled: a primary agent that"
                " reaches a Docker daemon can start or inspect enclaves and bypass every"
                " disclosure bound (spec 15.2)",
                "set container.enableDind to false (or disable boundedAgents)",
            )
        )
    return sorted(problems, key=lambda p: (p.location, p.message))


def provider_of(engine: str) -> str:
    """The ``apiProxy.targets`` provider an engine's model calls go to."""
    return policy.AGENT_ENGINE_PROVIDERS[engine]


def default_target(provider: str) -> ApiTarget:
    """The provider's public API over https (the default target)."""
    return ApiTarget("https", policy.AGENT_PROVIDER_HOSTS[provider], 443, "")


def parse_api_target(host: str, base_path: str = "") -> ApiTarget:
    """Parse ``apiProxy.targets.<provider>.host`` and ``.basePath`` into an ApiTarget.

    ``host`` is ``HOST[:PORT]`` (https), ``https://HOST[:PORT]`` or
    ``http://HOST[:PORT]`` (refused later by the preflight unless
    ``--allow-insecure-api-target``).

    Raises:
        ValueError: (configuration fault) anything the API proxy would refuse.
    """
    url = host if "://" in host else "https://" + host
    _scheme, _, authority = url.partition("://")
    if "/" in authority:
        raise ValueError(f"host {host!r}: a path belongs in basePath")
    try:
        upstream = parse_upstream_url(url + base_path, allow_insecure=True)
    except ProxyConfigError as exc:
        detail = str(exc).removeprefix("upstream.url: ")
        raise ValueError(f"host {host!r} basePath {base_path!r}: {detail}") from None
    return ApiTarget(upstream.scheme, upstream.host, upstream.port, upstream.base_path)


def _target(document: Mapping[str, Any], engine: str) -> ApiTarget:
    provider = provider_of(engine)
    api_proxy = document.get("apiProxy")
    targets = api_proxy.get("targets", {}) if isinstance(api_proxy, dict) else {}
    entry = targets.get(provider) if isinstance(targets, dict) else None
    if not isinstance(entry, dict):
        return default_target(provider)
    host = entry.get("host", policy.AGENT_PROVIDER_HOSTS[provider])
    return parse_api_target(str(host), str(entry.get("basePath", "")))


def target_problems(document: Mapping[str, Any]) -> list[Problem]:
    """The engine's target, parsed the API proxy's way (after the schema passed)."""
    section = document[AGENTS_SECTION]
    engine = section.get("engine", policy.DEFAULT_AGENT_ENGINE)
    try:
        _target(document, engine)
    except ValueError as exc:
        where = f"apiProxy.targets.{provider_of(engine)}.host"
        return [Problem(where, str(exc), _HINTS["host"])]
    return []


def normalize_agents(document: Mapping[str, Any]) -> BoundedAgentsConfig:
    """Apply the defaults to a *validated* document's ``boundedAgents`` section.

    A document without the section gives the disabled default.
    """
    section = document.get(AGENTS_SECTION)
    if section is None:
        return BoundedAgentsConfig()
    engine = section.get("engine", policy.DEFAULT_AGENT_ENGINE)
    return BoundedAgentsConfig(
        enabled=section.get("enabled") is True,
        private_repos=tuple(
            PrivateRepo(entry["repo"], entry["sensitivity"])
            for entry in section.get("privateRepos", [])
        ),
        runtime=section.get("runtime", policy.DEFAULT_RUNTIME),
        engine=engine,
        profile=section.get("profile", policy.DEFAULT_AGENT_PROFILE),
        model=section.get("model", ""),
        timeout=section.get("timeout", policy.DEFAULT_AGENT_TIMEOUT_S),
        memory_limit=section.get("memoryLimit", policy.DEFAULT_MEMORY_LIMIT),
        cpu_limit=section.get("cpuLimit", policy.DEFAULT_AGENT_CPU_LIMIT),
        pids_limit=section.get("pidsLimit", policy.ENCLAVE_PIDS_LIMIT),
        tmpfs_limit=section.get("tmpfsLimit", policy.DEFAULT_AGENT_TMPFS_LIMIT),
        max_output_bytes=section.get("maxOutputBytes", policy.DEFAULT_AGENT_MAX_OUTPUT_BYTES),
        max_task_bytes=section.get("maxTaskBytes", policy.DEFAULT_AGENT_MAX_TASK_BYTES),
        max_invocations=section.get("maxInvocations", policy.DEFAULT_AGENT_MAX_INVOCATIONS),
        max_model_requests=section.get("maxModelRequests", policy.DEFAULT_MAX_MODEL_REQUESTS),
        max_model_tokens=section.get("maxModelTokens", policy.DEFAULT_MAX_MODEL_TOKENS),
        target=_target(document, engine),
    )
