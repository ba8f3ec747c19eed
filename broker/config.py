"""The broker's trusted configuration and seed map (spec 14.2, 14.6, 14.7).

Theory of operation: everything the broker needs to decide *whether* and *how*
an invocation runs comes from two files the trusted harness writes into the
broker-private root before the broker starts: the broker config (paths,
limits, runtime, run id) and the seed map (repository -> opaque seed id and
trusted sensitivity). Nothing here is ever derived from a request.

Parsing is split as the house style asks: :func:`parse_config` and
:func:`parse_seed_map` take already-decoded JSON values and return frozen,
validated values; :func:`load_config` and :func:`load_seed_map` are the thin
file-reading shells. Every error is a :class:`ConfigError` (an operator
fault) naming the key (``config.enclave.proxyPort: ...``): the broker
refuses to start.

One config format serves both subsystems (spec 15.1: a sibling broker on
the same core). ``subsystem`` (default ``bounded-query``) selects the
request frame and the runner; a ``bounded-agent`` broker also carries the
trusted enclave settings (``enclave``: :class:`EnclaveOptions`), required
for it and refused for a query broker, and its runtime must be one an
enclave can use (``docker`` or ``gvisor``: sbx is capability-blocked,
spec 15.7).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from bounded_query.broker.protocol import is_valid_slug, policy
from bounded_query.broker.protocol.policy import (
    ENCLAVE_ENGINES,
    ENCLAVE_MAX_OUTPUT_BYTES,
    ENCLAVE_MAX_TASK_BYTES,
    ENCLAVE_OCI_RUNTIMES,
    MAX_AGENT_TIMEOUT_S,
    MAX_INVOCATIONS,
    MAX_MEMORY_BYTES,
    MAX_TIMEOUT_S,
    MIN_INVOCATIONS,
    MIN_TIMEOUT_S,
    RUN_BUDGETS,
    RUN_ID_PATTERN,
    RUNTIMES,
    SENSITIVITIES,
    SUBSYSTEM_AGENT,
    SUBSYSTEM_QUERY,
    parse_memory_limit,
)
from bounded_query.broker.runner import EnclaveOptions, RunnerSettings

__all__ = [
    "CONFIG_ENV",
    "SUBSYSTEMS",
    "BrokerConfig",
    "ConfigError",
    "SeedEntry",
    "SeedMap",
    "encode_config",
    "encode_seed_map",
    "load_config",
    "load_seed_map",
    "parse_config",
    "parse_seed_map",
]

#: Environment variable naming the config file when ``--config`` is absent.
CONFIG_ENV = "BOUNDED_QUERY_BROKER_CONFIG"

#: Config and seed-map files are small; a larger file is not ours.
MAX_CONFIG_FILE_BYTES = 1 << 20

_HEX_RUN_ID = re.compile(RUN_ID_PATTERN)
_HEX_SEED_ID = re.compile(r"[0-9a-f]{1,128}")
_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
#: Docker's network-name rule, bounded (the name is trusted; this catches typos).
_NETWORK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
#: A model id as providers spell them (``claude-haiku-4-5``, ``gpt-4o-mini``):
#: the harness's rule for ``boundedAgents.model`` (no ``/``, space or URL).
_MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")

#: The subsystems one broker process can serve (one per process, spec 15.1).
SUBSYSTEMS: tuple[str, ...] = (SUBSYSTEM_QUERY, SUBSYSTEM_AGENT)
#: Sanity caps of the enclave's resource settings (not security bounds: the
#: harness derives them from the operator's section; these catch a broken
#: writer). 1024 CPUs, the kernel's largest pid_max, and a tmpfs of at least
#: one page and at most MAX_MEMORY_BYTES.
MAX_ENCLAVE_NANO_CPUS = 1024 * 10**9
MAX_ENCLAVE_PIDS = 4 * 1024**2
MIN_ENCLAVE_TMPFS_BYTES = 4096
MAX_PORT = 65535

_CONFIG_KEYS = frozenset(
    {
        "version",
        "runId",
        "socketPath",
        "socketUid",
        "socketGid",
        "privateRoot",
        "seedMap",
        "runtime",
        "timeout",
        "memoryLimit",
        "maxInvocations",
        "image",
        "dockerHost",
        "hostPathMap",
        "subsystem",
        "enclave",
    }
)
_ENCLAVE_KEYS = frozenset(
    {
        "engine",
        "model",
        "network",
        "proxyAddress",
        "proxyPort",
        "controlSocket",
        "nanoCpus",
        "pidsLimit",
        "tmpfsBytes",
        "maxOutputBytes",
        "maxTaskBytes",
    }
)


class ConfigError(ValueError):
    """The trusted configuration is missing or malformed (operator fault)."""


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    """Validated broker configuration (the JSON file the harness writes)."""

    run_id: str
    socket_path: Path
    socket_uid: int | None
    socket_gid: int | None
    private_root: Path
    seed_map_path: Path
    runtime: str
    timeout_s: int
    memory_limit: str
    memory_bytes: int
    max_invocations: int
    image: str
    docker_host: str
    host_path_map: tuple[tuple[str, str], ...]
    #: Which subsystem this broker serves (``subsystem.py``: frame, payload).
    subsystem: str = SUBSYSTEM_QUERY
    #: The enclave settings of a bounded-agent broker (None for queries).
    enclave: EnclaveOptions | None = None

    def __post_init__(self) -> None:
        if self.subsystem not in SUBSYSTEMS:
            raise ConfigError(f"config.subsystem: expected one of {list(SUBSYSTEMS)}")
        if (self.subsystem == SUBSYSTEM_AGENT) != (self.enclave is not None):
            raise ConfigError("config.enclave: required exactly for a bounded-agent broker")

    @property
    def journal_path(self) -> Path:
        """``state/journal`` under the private root."""
        return self.private_root / "state" / "journal"

    @property
    def audit_path(self) -> Path:
        """``audit/audit.jsonl`` under the private root."""
        return self.private_root / "audit" / "audit.jsonl"

    @property
    def ready_path(self) -> Path:
        """``control/ready`` under the private root."""
        return self.private_root / "control" / "ready"

    @property
    def work_root(self) -> Path:
        """``work/`` under the private root (one directory per invocation)."""
        return self.private_root / "work"

    @property
    def seeds_root(self) -> Path:
        """``seeds/`` under the private root (written by the harness)."""
        return self.private_root / "seeds"

    def runner_settings(self) -> RunnerSettings:
        """The subset of this config a sandbox runner may see."""
        return RunnerSettings(
            runtime=self.runtime,
            run_id=self.run_id,
            image=self.image,
            timeout_s=self.timeout_s,
            memory_bytes=self.memory_bytes,
            docker_host=self.docker_host,
            host_path_map=self.host_path_map,
        )


@dataclass(frozen=True, slots=True)
class SeedEntry:
    """One repository of the seed map: trusted sensitivity and opaque seed id."""

    repo: str
    seed_id: str
    sensitivity: str
    commit: str

    @property
    def budget_bits(self) -> int | None:
        """Run budget in bits, None for unmetered (public)."""
        return RUN_BUDGETS[self.sensitivity]


@dataclass(frozen=True, slots=True)
class SeedMap:
    """Seed map keyed by lowercased repo slug (lookups are case-insensitive)."""

    entries: Mapping[str, SeedEntry]

    def lookup(self, repo: str) -> SeedEntry | None:
        """Return the entry for ``repo`` (any case), or None when not configured."""
        return self.entries.get(repo.lower())


def _require(obj: Mapping[str, object], key: str, kind: type, where: str) -> object:
    if key not in obj:
        raise ConfigError(f"{where}.{key}: missing")
    value = obj[key]
    if kind is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{where}.{key}: expected an integer")
    elif not isinstance(value, kind):
        raise ConfigError(f"{where}.{key}: expected {kind.__name__}")
    return value


def _abs_path(obj: Mapping[str, object], key: str) -> Path:
    text = _require(obj, key, str, "config")
    assert isinstance(text, str)
    pure = PurePosixPath(text)
    if not pure.is_absolute() or ".." in pure.parts or "\x00" in text:
        raise ConfigError(f"config.{key}: must be an absolute path without '..'")
    return Path(text)


def _optional_id(obj: Mapping[str, object], key: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**32:
        raise ConfigError(f"config.{key}: expected null or a non-negative integer id")
    return value


def parse_config(obj: object) -> BrokerConfig:
    """Validate a decoded broker config document.

    Raises:
        ConfigError: unknown or missing keys, wrong types, out-of-range limits.
    """
    if not isinstance(obj, dict):
        raise ConfigError("config: expected a JSON object")
    unknown = sorted(set(obj) - _CONFIG_KEYS)
    if unknown:
        raise ConfigError(f"config: unknown keys {unknown}")
    if obj.get("version") != 1 or isinstance(obj.get("version"), bool):
        raise ConfigError("config.version: must be 1")
    run_id = _require(obj, "runId", str, "config")
    assert isinstance(run_id, str)
    if not _HEX_RUN_ID.fullmatch(run_id):
        raise ConfigError("config.runId: expected 16-64 lowercase hex digits")
    runtime = _require(obj, "runtime", str, "config")
    assert isinstance(runtime, str)
    if runtime not in RUNTIMES:
        raise ConfigError(f"config.runtime: expected one of {sorted(RUNTIMES)}")
    subsystem = obj.get("subsystem", SUBSYSTEM_QUERY)
    if subsystem not in SUBSYSTEMS:
        raise ConfigError(f"config.subsystem: expected one of {list(SUBSYSTEMS)}")
    agent = subsystem == SUBSYSTEM_AGENT
    enclave: EnclaveOptions | None = None
    if agent:
        if "enclave" not in obj:
            raise ConfigError("config.enclave: missing (required for a bounded-agent broker)")
        enclave = _parse_enclave(obj["enclave"])
        if runtime not in ENCLAVE_OCI_RUNTIMES:
            raise ConfigError(
                f"config.runtime: an enclave runs on one of {sorted(ENCLAVE_OCI_RUNTIMES)}"
                " (sbx is capability-blocked, spec 15.7)"
            )
    elif "enclave" in obj:
        raise ConfigError("config.enclave: only a bounded-agent broker has enclave settings")
    timeout = _require(obj, "timeout", int, "config")
    assert isinstance(timeout, int)
    max_timeout, spec = (MAX_AGENT_TIMEOUT_S, "15.2") if agent else (MAX_TIMEOUT_S, "14.2")
    if not MIN_TIMEOUT_S <= timeout <= max_timeout:
        raise ConfigError(
            f"config.timeout: must be {MIN_TIMEOUT_S}-{max_timeout} seconds (spec {spec})"
        )
    max_inv = _require(obj, "maxInvocations", int, "config")
    assert isinstance(max_inv, int)
    if not MIN_INVOCATIONS <= max_inv <= MAX_INVOCATIONS:
        raise ConfigError(
            f"config.maxInvocations: must be {MIN_INVOCATIONS}-{MAX_INVOCATIONS} (spec 14.2)"
        )
    memory = _require(obj, "memoryLimit", str, "config")
    assert isinstance(memory, str)
    try:
        memory_bytes = parse_memory_limit(memory)
    except ValueError as exc:
        raise ConfigError(f"config.{exc}") from None
    image = _require(obj, "image", str, "config")
    assert isinstance(image, str)
    if not image or len(image) > 255 or not image.isprintable() or " " in image:
        raise ConfigError("config.image: expected a non-empty image reference")
    docker_host = _require(obj, "dockerHost", str, "config")
    assert isinstance(docker_host, str)
    if not policy.docker_socket_path(docker_host).startswith("/"):
        raise ConfigError("config.dockerHost: must be a unix:// URL (spec 14.2 preflight)")
    path_map = _require(obj, "hostPathMap", dict, "config")
    assert isinstance(path_map, dict)
    pairs: list[tuple[str, str]] = []
    for src, dst in path_map.items():
        if not (isinstance(dst, str) and src.startswith("/") and dst.startswith("/")):
            raise ConfigError("config.hostPathMap: expected absolute path -> absolute path")
        pairs.append((src, dst))
    return BrokerConfig(
        run_id=run_id,
        socket_path=_abs_path(obj, "socketPath"),
        socket_uid=_optional_id(obj, "socketUid"),
        socket_gid=_optional_id(obj, "socketGid"),
        private_root=_abs_path(obj, "privateRoot"),
        seed_map_path=_abs_path(obj, "seedMap"),
        runtime=runtime,
        timeout_s=timeout,
        memory_limit=memory,
        memory_bytes=memory_bytes,
        max_invocations=max_inv,
        image=image,
        docker_host=docker_host,
        host_path_map=tuple(sorted(pairs)),
        subsystem=subsystem,
        enclave=enclave,
    )


def _bounded_int(obj: Mapping[str, object], key: str, low: int, high: int) -> int:
    value = _require(obj, key, int, "config.enclave")
    assert isinstance(value, int)
    if not low <= value <= high:
        raise ConfigError(f"config.enclave.{key}: must be {low}-{high}")
    return value


def _pattern_str(obj: Mapping[str, object], key: str, pattern: re.Pattern[str], what: str) -> str:
    value = _require(obj, key, str, "config.enclave")
    assert isinstance(value, str)
    if pattern.fullmatch(value) is None:
        raise ConfigError(f"config.enclave.{key}: expected {what}")
    return value


def _parse_enclave(obj: object) -> EnclaveOptions:
    """The ``enclave`` object of a bounded-agent broker config (spec 15.2, 15.6)."""
    if not isinstance(obj, dict):
        raise ConfigError("config.enclave: expected a JSON object")
    unknown = sorted(set(obj) - _ENCLAVE_KEYS)
    if unknown:
        raise ConfigError(f"config.enclave: unknown keys {unknown}")
    engine = _require(obj, "engine", str, "config.enclave")
    if engine not in ENCLAVE_ENGINES:
        raise ConfigError(
            f"config.enclave.engine: expected one of {list(ENCLAVE_ENGINES)}"
            " (the engines with an enclave adapter)"
        )
    assert isinstance(engine, str)
    address = _require(obj, "proxyAddress", str, "config.enclave")
    assert isinstance(address, str)
    try:
        proxy_address = str(ipaddress.IPv4Address(address))
    except ValueError:
        raise ConfigError("config.enclave.proxyAddress: expected a dotted IPv4 address") from None
    if proxy_address != address:  # pragma: no cover - IPv4Address is strict already
        raise ConfigError("config.enclave.proxyAddress: expected a dotted IPv4 address")
    control = _require(obj, "controlSocket", str, "config.enclave")
    assert isinstance(control, str)
    pure = PurePosixPath(control)
    if not pure.is_absolute() or ".." in pure.parts or "\x00" in control:
        raise ConfigError("config.enclave.controlSocket: must be an absolute path without '..'")
    return EnclaveOptions(
        engine=engine,
        model=_pattern_str(obj, "model", _MODEL_NAME, "a model id"),
        network=_pattern_str(obj, "network", _NETWORK_NAME, "a Docker network name"),
        proxy_address=proxy_address,
        proxy_port=_bounded_int(obj, "proxyPort", 1, MAX_PORT),
        control_socket=Path(control),
        nano_cpus=_bounded_int(obj, "nanoCpus", 1, MAX_ENCLAVE_NANO_CPUS),
        pids_limit=_bounded_int(obj, "pidsLimit", 1, MAX_ENCLAVE_PIDS),
        tmpfs_bytes=_bounded_int(obj, "tmpfsBytes", MIN_ENCLAVE_TMPFS_BYTES, MAX_MEMORY_BYTES),
        max_output_bytes=_bounded_int(obj, "maxOutputBytes", 1, ENCLAVE_MAX_OUTPUT_BYTES),
        max_task_bytes=_bounded_int(obj, "maxTaskBytes", 1, ENCLAVE_MAX_TASK_BYTES),
    )


def _encode_enclave(options: EnclaveOptions) -> dict[str, object]:
    return {
        "engine": options.engine,
        "model": options.model,
        "network": options.network,
        "proxyAddress": options.proxy_address,
        "proxyPort": options.proxy_port,
        "controlSocket": str(options.control_socket),
        "nanoCpus": options.nano_cpus,
        "pidsLimit": options.pids_limit,
        "tmpfsBytes": options.tmpfs_bytes,
        "maxOutputBytes": options.max_output_bytes,
        "maxTaskBytes": options.max_task_bytes,
    }


def parse_seed_map(obj: object) -> SeedMap:
    """Validate a decoded seed map (spec 14.6: the only source of sensitivity).

    Raises:
        ConfigError: malformed entries, bad slugs, duplicate repos (any case).
    """
    if not isinstance(obj, dict) or set(obj) != {"version", "repos"}:
        raise ConfigError("seedMap: expected an object with exactly 'version' and 'repos'")
    if obj["version"] != 1 or isinstance(obj["version"], bool):
        raise ConfigError("seedMap.version: must be 1")
    repos = obj["repos"]
    if not isinstance(repos, list):
        raise ConfigError("seedMap.repos: expected an array")
    entries: dict[str, SeedEntry] = {}
    for index, item in enumerate(repos):
        where = f"seedMap.repos[{index}]"
        if not isinstance(item, dict) or set(item) != {"repo", "seedId", "sensitivity", "commit"}:
            raise ConfigError(f"{where}: expected exactly repo, seedId, sensitivity, commit")
        repo, seed_id = item["repo"], item["seedId"]
        sensitivity, commit = item["sensitivity"], item["commit"]
        if not is_valid_slug(repo):
            raise ConfigError(f"{where}.repo: not an owner/repo slug")
        assert isinstance(repo, str)  # is_valid_slug checked it
        if not isinstance(seed_id, str) or not _HEX_SEED_ID.fullmatch(seed_id):
            raise ConfigError(f"{where}.seedId: expected lowercase hex")
        if sensitivity not in SENSITIVITIES:
            raise ConfigError(f"{where}.sensitivity: expected one of {sorted(SENSITIVITIES)}")
        if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
            raise ConfigError(f"{where}.commit: expected a full lowercase hex commit id")
        key = repo.lower()
        if key in entries:
            raise ConfigError(f"{where}.repo: duplicate repository (case-insensitive)")
        entries[key] = SeedEntry(repo, seed_id, sensitivity, commit)
    return SeedMap(entries)


def encode_config(config: BrokerConfig) -> dict[str, object]:
    """The broker config document for ``config`` (what ``parse_config`` reads back).

    The harness writes it (``harness/staging/outputs.py``) and the broker parses it:
    both sides go through this module, so a key exists in one place and
    ``parse_config(encode_config(c)) == c`` for every valid ``c``.
    """
    return {
        "version": 1,
        "runId": config.run_id,
        "socketPath": str(config.socket_path),
        "socketUid": config.socket_uid,
        "socketGid": config.socket_gid,
        "privateRoot": str(config.private_root),
        "seedMap": str(config.seed_map_path),
        "runtime": config.runtime,
        "timeout": config.timeout_s,
        "memoryLimit": config.memory_limit,
        "maxInvocations": config.max_invocations,
        "image": config.image,
        "dockerHost": config.docker_host,
        "hostPathMap": dict(config.host_path_map),
        # A query broker's document is unchanged by the second subsystem
        # (``subsystem`` defaults to bounded-query); an agent broker's names both.
        **(
            {}
            if config.enclave is None
            else {"subsystem": config.subsystem, "enclave": _encode_enclave(config.enclave)}
        ),
    }


def encode_seed_map(seed_map: SeedMap) -> dict[str, object]:
    """The seed map document (spec 14.6), entries in ``seed_map``'s order.

    ``parse_seed_map(encode_seed_map(m)) == m`` for every valid ``m``.
    """
    return {
        "version": 1,
        "repos": [
            {
                "repo": entry.repo,
                "seedId": entry.seed_id,
                "sensitivity": entry.sensitivity,
                "commit": entry.commit,
            }
            for entry in seed_map.entries.values()
        ],
    }


def _load_json(path: Path, what: str) -> object:
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot read ({exc.strerror})") from None
    if len(raw) > MAX_CONFIG_FILE_BYTES:
        raise ConfigError(f"{what} {path}: larger than {MAX_CONFIG_FILE_BYTES} bytes")
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{what} {path}: not valid JSON ({exc})") from None


def load_config(path: Path) -> BrokerConfig:
    """Read and validate the broker config file. Raises ConfigError."""
    return parse_config(_load_json(path, "config"))


def load_seed_map(path: Path) -> SeedMap:
    """Read and validate the seed map file. Raises ConfigError."""
    return parse_seed_map(_load_json(path, "seed map"))
