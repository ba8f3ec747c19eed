"""Loading, validating and normalizing the ``boundedQueries`` section (spec 14.2).

(The ``boundedAgents`` section, spec 15.2, is checked by ``agents.py`` with
the same parser and problem format; :func:`load_config` runs both.)

Theory of operation (seed 001, section 2 "Processing Model"): the document is
read from a file or from standard input (``--config -``); the format comes
from the extension (``.json``, ``.yaml``/``.yml``), otherwise JSON is tried
first and YAML second. The ``boundedQueries`` section is validated with
``jsonschema`` against the schema file shipped next to this module
(``bounded-queries.schema.json``, closed world); the other AWF sections may be
present and are ignored. Every problem is collected, each with its location
and a fix hint, and the caller exits 2 before anything else happens.

Strictness beyond plain ``json``/``yaml.safe_load`` (docs/architecture.md decision 6):

* duplicate mapping keys are rejected in JSON and in YAML;
* ``NaN``/``Infinity`` are rejected;
* an integer is a plain integer token: ``30.0`` (a float) is not an integer;
* YAML booleans are only ``true``/``false`` (YAML 1.2): ``enabled: yes`` is a
  string and therefore invalid, never a silent enable; YAML integers are plain
  decimal (``1:30`` and ``0o17`` stay strings).

Normalization applies the defaults, turns a legacy bare-string repository into
``{repo, sensitivity: "internal"}`` with a warning, and enables only on an
explicit ``enabled: true``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO, Any

import yaml
from jsonschema import Draft202012Validator, validators

from bounded_query.broker.protocol import policy

__all__ = [
    "MAX_CONFIG_BYTES",
    "SCHEMA_PATH",
    "SECTION",
    "ApiTarget",
    "BoundedAgentsConfig",
    "BoundedQueriesConfig",
    "ConfigError",
    "LoadedConfig",
    "PrivateRepo",
    "Problem",
    "load_config",
    "normalize",
    "parse_document",
    "strict_validator",
    "validate_section",
]

#: Name of the section we own in an AWF configuration document.
SECTION = "boundedQueries"
#: The JSON Schema of the section, shipped with the package.
SCHEMA_PATH = Path(__file__).parent.parent / "bounded-queries.schema.json"
#: A configuration document larger than this is refused before parsing
#: (a real one is a few kilobytes; this only bounds parser work).
MAX_CONFIG_BYTES = 1024 * 1024
_SLUG_HINT = (
    'use a bare "owner/repo" slug (letters, digits, "-" in the owner; letters, '
    'digits, ".", "_", "-" in the name; no "://", "..", "?", "#", "*" or extra "/")'
)


@dataclass(frozen=True, slots=True)
class Problem:
    """One configuration problem: where it is, what is wrong, how to fix it."""

    location: str
    message: str
    hint: str

    def __str__(self) -> str:
        return f"{self.location}: {self.message} (fix: {self.hint})"


class ConfigError(Exception):
    """The configuration is unusable (operator fault; the harness exits 2)."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


@dataclass(frozen=True, slots=True)
class PrivateRepo:
    """One configured repository with its trusted sensitivity."""

    repo: str
    sensitivity: str

    def __post_init__(self) -> None:
        if not isinstance(self.repo, str) or not isinstance(self.sensitivity, str):
            raise TypeError("PrivateRepo fields must be strings")

    @property
    def budget(self) -> int | None:
        """Run budget in bits, None when unmetered (spec 14.1)."""
        return policy.RUN_BUDGETS.get(self.sensitivity)


@dataclass(frozen=True, slots=True)
class BoundedQueriesConfig:
    """The normalized section. Values are checked by :mod:`.preflight`."""

    enabled: bool = policy.DEFAULT_ENABLED
    private_repos: tuple[PrivateRepo, ...] = ()
    runtime: str = policy.DEFAULT_RUNTIME
    timeout: int = policy.DEFAULT_TIMEOUT_S
    memory_limit: str = policy.DEFAULT_MEMORY_LIMIT
    interpreter: str = policy.DEFAULT_INTERPRETER
    max_invocations: int = policy.DEFAULT_MAX_INVOCATIONS

    @property
    def slugs(self) -> tuple[str, ...]:
        """The configured slugs, in configuration order."""
        return tuple(r.repo for r in self.private_repos)


@dataclass(frozen=True, slots=True)
class ApiTarget:
    """Where the API proxy sends one provider's requests (``apiProxy.targets.<provider>``).

    ``scheme`` is ``https`` unless the operator passed
    ``--allow-insecure-api-target`` for an ``http://HOST[:PORT]`` target.
    """

    scheme: str
    host: str
    port: int
    base_path: str

    @property
    def url(self) -> str:
        """``scheme://host:port[/base/path]``: the API proxy's ``upstream.url`` form."""
        return f"{self.scheme}://{self.host}:{self.port}{self.base_path}"


@dataclass(frozen=True, slots=True)
class BoundedAgentsConfig:
    """The normalized ``boundedAgents`` section (spec 15.2). Values are checked
    by :mod:`.preflight`; the byte sizes are parsed from their Docker-style
    strings (``memoryLimit``, ``tmpfsLimit``) and ``cpuLimit`` into nano-CPUs.
    ``target`` is the API target of the engine's provider (the default: the
    provider's public API over https).
    """

    enabled: bool = policy.DEFAULT_ENABLED
    private_repos: tuple[PrivateRepo, ...] = ()
    runtime: str = policy.DEFAULT_RUNTIME
    engine: str = policy.DEFAULT_AGENT_ENGINE
    profile: str = policy.DEFAULT_AGENT_PROFILE
    model: str = ""
    timeout: int = policy.DEFAULT_AGENT_TIMEOUT_S
    memory_limit: str = policy.DEFAULT_MEMORY_LIMIT
    cpu_limit: str = policy.DEFAULT_AGENT_CPU_LIMIT
    pids_limit: int = policy.ENCLAVE_PIDS_LIMIT
    tmpfs_limit: str = policy.DEFAULT_AGENT_TMPFS_LIMIT
    max_output_bytes: int = policy.DEFAULT_AGENT_MAX_OUTPUT_BYTES
    max_task_bytes: int = policy.DEFAULT_AGENT_MAX_TASK_BYTES
    max_invocations: int = policy.DEFAULT_AGENT_MAX_INVOCATIONS
    max_model_requests: int = policy.DEFAULT_MAX_MODEL_REQUESTS
    max_model_tokens: int = policy.DEFAULT_MAX_MODEL_TOKENS
    target: ApiTarget | None = None

    @property
    def slugs(self) -> tuple[str, ...]:
        """The configured slugs, in configuration order."""
        return tuple(r.repo for r in self.private_repos)

    @property
    def memory_bytes(self) -> int:
        """``memoryLimit`` in bytes (memory = memory-swap for the enclave).

        Raises:
            ValueError: not a valid limit (a loaded configuration always is).
        """
        return policy.parse_memory_limit(self.memory_limit)

    @property
    def tmpfs_bytes(self) -> int:
        """``tmpfsLimit`` in bytes: the size of each of /tmp and /agent.

        Raises:
            ValueError: not a valid limit (a loaded configuration always is).
        """
        return policy.parse_memory_limit(self.tmpfs_limit)

    @property
    def nano_cpus(self) -> int:
        """``cpuLimit`` in nano-CPUs (Docker's ``NanoCpus``).

        Raises:
            ValueError: not a valid limit (a loaded configuration always is).
        """
        return policy.parse_cpu_limit(self.cpu_limit)


@dataclass(frozen=True, slots=True)
class LoadedConfig:
    """A validated, normalized configuration and the warnings it produced."""

    config: BoundedQueriesConfig
    warnings: tuple[str, ...]
    source: str
    #: The ``boundedAgents`` section (disabled when absent).
    agents: BoundedAgentsConfig = BoundedAgentsConfig()


# --------------------------------------------------------------------- parsing


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class _StrictYamlLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 booleans, plain decimal ints, no duplicate keys."""


def _install_resolvers() -> None:
    resolvers: dict[Any, list[tuple[str, Any]]] = {}
    for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items():
        dropped = ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int")
        resolvers[first] = [(t, r) for t, r in entries if t not in dropped]
    _StrictYamlLoader.yaml_implicit_resolvers = resolvers
    _StrictYamlLoader.add_implicit_resolver(
        "tag:yaml.org,2002:bool",
        re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
        list("tTfF"),
    )
    _StrictYamlLoader.add_implicit_resolver(
        "tag:yaml.org,2002:int", re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789")
    )

    def construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
        loader.flatten_mapping(node)
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            try:
                duplicate = key in out
            except TypeError as exc:  # unhashable key
                raise yaml.constructor.ConstructorError(
                    None, None, "unhashable mapping key", key_node.start_mark
                ) from exc
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            out[key] = loader.construct_object(value_node, deep=True)
        return out

    _StrictYamlLoader.add_constructor("tag:yaml.org,2002:map", construct_mapping)


_install_resolvers()


def _parse_json(text: str) -> Any:
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)


def _parse_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_StrictYamlLoader)  # a SafeLoader subclass


def parse_document(data: bytes, name: str) -> Any:
    """Parse configuration bytes; ``name`` is the path or ``-`` (seed 001 section 2).

    Raises:
        ConfigError: oversize, not UTF-8, or neither valid JSON nor YAML.
    """
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            [Problem(name, f"document is larger than {MAX_CONFIG_BYTES} bytes", "shrink it")]
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        problem = Problem(name, f"not UTF-8 ({exc.reason})", "save it as UTF-8")
        raise ConfigError([problem]) from None
    lower = name.lower()
    if lower.endswith(".json"):
        attempts = [("JSON", _parse_json)]
    elif lower.endswith((".yaml", ".yml")):
        attempts = [("YAML", _parse_yaml)]
    else:
        attempts = [("JSON", _parse_json), ("YAML", _parse_yaml)]
    failures: list[str] = []
    for fmt, parser in attempts:
        try:
            return parser(text)
        except (ValueError, yaml.YAMLError, RecursionError) as exc:
            detail = " ".join(str(exc).split())
            failures.append(f"{fmt}: {detail}")
    raise ConfigError(
        [
            Problem(
                name,
                "cannot parse the document (" + "; ".join(failures) + ")",
                "write valid JSON or YAML without duplicate keys",
            )
        ]
    )


# ------------------------------------------------------------------ validation


def _is_plain_int(_checker: Any, instance: object) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


_StrictValidator = validators.extend(
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_plain_int),
)


@cache
def strict_validator(path: Path) -> Any:
    """The validator of the shipped schema at ``path`` (plain integers only: ``30.0``
    and ``true`` are not integers), checked once."""
    schema = json.loads(path.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return _StrictValidator(schema)


def _validator() -> Any:
    return strict_validator(SCHEMA_PATH)


def _location(path: Iterable[object]) -> str:
    out = SECTION
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _one_of(names: tuple[str, ...]) -> str:
    """``"a", "b" or "c"`` (the hints name the policy's values)."""
    quoted = [f'"{name}"' for name in names]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1]


_FIELD_HINTS: Mapping[str, str] = {
    "enabled": "use true or false",
    "privateRepos": 'use a list of {"repo": "owner/repo", "sensitivity": ...} objects',
    "runtime": "use " + _one_of(policy.RUNTIMES),
    "timeout": (
        f"use a whole number of seconds from {policy.MIN_TIMEOUT_S} to {policy.MAX_TIMEOUT_S}"
    ),
    "memoryLimit": 'use a Docker-style limit such as "512m" or "1g"',
    "interpreter": f'use "{policy.DEFAULT_INTERPRETER}" (the only supported interpreter)',
    "maxInvocations": (
        f"use a whole number from {policy.MIN_INVOCATIONS} to {policy.MAX_INVOCATIONS}"
    ),
    "repo": _SLUG_HINT,
    "sensitivity": "use " + _one_of(policy.SENSITIVITIES),
}


def _hint_for(error: Any) -> str:
    path = list(error.absolute_path)
    field = next((p for p in reversed(path) if isinstance(p, str)), None)
    in_repos = bool(path) and path[0] == "privateRepos"
    if error.validator == "pattern" and in_repos:
        return _SLUG_HINT
    if error.validator == "required":
        return "add the missing property (" + _FIELD_HINTS["sensitivity"].removeprefix("use ") + ")"
    if in_repos and isinstance(path[-1], int):
        return 'use "owner/repo" or {"repo": "owner/repo", "sensitivity": "internal"}'
    if field is not None and field in _FIELD_HINTS:
        return _FIELD_HINTS[field]
    if not path:
        return "make boundedQueries a mapping of the properties in spec 14.2"
    return "see spec 14.2"


def _errors_to_problems(errors: Iterable[Any]) -> list[Problem]:
    problems: list[Problem] = []
    for error in errors:
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            allowed = sorted(error.schema.get("properties", {}))
            for key in sorted(set(error.instance) - set(allowed), key=str):
                problems.append(
                    Problem(
                        _location([*error.absolute_path, key]),
                        "unknown property",
                        "remove it; allowed: " + ", ".join(allowed),
                    )
                )
            continue
        message = error.message
        if error.validator == "pattern":  # the regex itself helps nobody
            what = "owner/repo slug" if "privateRepos" in error.absolute_path else "value"
            message = f"{error.instance!r} is not a valid {what}"
        if len(message) > 200:
            message = message[:200] + "..."
        problems.append(Problem(_location(error.absolute_path), message, _hint_for(error)))
    return sorted(problems, key=lambda p: (p.location, p.message))


def validate_section(document: Any) -> list[Problem]:
    """Validate the ``boundedQueries`` section of a parsed document.

    Returns every problem (empty when valid); a missing section is valid.
    """
    if not isinstance(document, dict):
        return [
            Problem(
                "(document)",
                f"the configuration must be a mapping, not {type(document).__name__}",
                'write an object such as {"boundedQueries": {...}}',
            )
        ]
    if SECTION not in document:
        return []
    return _errors_to_problems(_validator().iter_errors(document[SECTION]))


# --------------------------------------------------------------- normalization


def normalize(section: Mapping[str, Any] | None) -> tuple[BoundedQueriesConfig, list[str]]:
    """Apply defaults and legacy normalization to a *validated* section.

    Returns the config and the warnings (legacy bare-string repositories).
    """
    if section is None:
        return BoundedQueriesConfig(), []
    warnings: list[str] = []
    repos: list[PrivateRepo] = []
    for entry in section.get("privateRepos", []):
        if isinstance(entry, str):
            warnings.append(
                f'boundedQueries.privateRepos entry "{entry}" is a legacy bare string; '
                'it is treated as {"repo": "' + entry + '", "sensitivity": "internal"}. '
                "Write the object form so the sensitivity is explicit."
            )
            repos.append(PrivateRepo(entry, policy.LEGACY_SENSITIVITY))
        else:
            repos.append(PrivateRepo(entry["repo"], entry["sensitivity"]))
    merged = {**policy.DEFAULTS, **section}
    return (
        BoundedQueriesConfig(
            enabled=merged["enabled"] is True,
            private_repos=tuple(repos),
            runtime=merged["runtime"],
            timeout=merged["timeout"],
            memory_limit=merged["memoryLimit"],
            interpreter=merged["interpreter"],
            max_invocations=merged["maxInvocations"],
        ),
        warnings,
    )


def load_config(source: str, stdin: IO[bytes] | None = None) -> LoadedConfig:
    """Read, parse, validate and normalize a configuration (``source`` ``-`` = stdin).

    Raises:
        ConfigError: every problem found, each with location and fix hint.
    """
    if source == "-":
        if stdin is None:
            raise ConfigError([Problem("-", "no standard input", "pipe the configuration in")])
        data = stdin.read(MAX_CONFIG_BYTES + 1)
    else:
        try:
            with open(source, "rb") as handle:
                data = handle.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ConfigError(
                [Problem(source, f"cannot read ({exc.strerror})", "pass an existing readable file")]
            ) from None
    document = parse_document(data, source)
    # Lazily: agents.py builds on this module's values.
    from bounded_query.harness.configuration.agents import normalize_agents, validate_agents

    problems = validate_section(document) + validate_agents(document)
    if problems:
        raise ConfigError(problems)
    config, warnings = normalize(document.get(SECTION))
    return LoadedConfig(config, tuple(warnings), source, normalize_agents(document))
