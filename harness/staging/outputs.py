"""What staging hands to the broker and to the agent (spec 14.6, 14.8).

* Broker side, below the private root (0600 files): the seed map
  ``{"version": 1, "repos": [{repo, seedId, sensitivity, commit}]}`` -- the
  broker's only source of sensitivity -- and the broker config.
* Agent side, below the ingress root: ``run/`` (the socket directory),
  ``skill/SKILL.md`` and the read-only wrapper directory ``skill/bin`` with
  ``bounded-query``, ``bounded-query-cost`` and the MCP server
  ``bounded-query-mcp`` (verbatim copies, 0555) and
  ``bq_protocol/`` (a verbatim copy of the broker's protocol package, so the
  cost tool computes charges with the very code the broker runs).
* The bounded-agent subsystem's agent side (spec 15.8), below the agent
  ingress root, same layout: ``skill/SKILL.md`` (the agent skill) and
  ``skill/bin`` with ``bounded-agent`` (the same CLI file), the cost tool, the
  MCP server, ``bq_protocol/`` and ``bounded-agent.json`` (the run's
  ``maxTaskBytes``): :func:`write_agent_subsystem_side`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

from bounded_query.broker import protocol
from bounded_query.broker.config import (
    BrokerConfig,
    SeedEntry,
    SeedMap,
    encode_config,
    encode_seed_map,
)
from bounded_query.broker.protocol import policy
from bounded_query.broker.protocol.policy import DEFAULT_DOCKER_HOST, DEFAULT_IMAGE
from bounded_query.harness.configuration.config import BoundedAgentsConfig, BoundedQueriesConfig
from bounded_query.harness.lifecycle.paths import RunPaths
from bounded_query.harness.staging.seeds import StagedSeed, remove_read_only_tree
from bounded_query.harness.staging.skill import render_agent_skill, render_skill
from bounded_query.wrapper import bounded_query_cli

__all__ = [
    "broker_config_doc",
    "create_ingress_root",
    "install_agent_wrapper_dir",
    "install_wrapper_dir",
    "remove_roots",
    "seed_map_doc",
    "write_agent_ingress_files",
    "write_agent_side",
    "write_agent_subsystem_side",
    "write_json_private",
]

#: Wrapper sources (as installed) and the names the agent sees on PATH.
WRAPPER_FILES = {
    "bounded_query_cli.py": "bounded-query",
    "bounded_query_cost.py": "bounded-query-cost",
    "bounded_query_mcp.py": "bounded-query-mcp",
}
PROTOCOL_PACKAGE = "bq_protocol"


def _wrapper_source_dir() -> Path:
    import bounded_query.wrapper as wrapper_pkg

    return Path(next(iter(wrapper_pkg.__path__)))


def seed_map_doc(seeds: Iterable[StagedSeed]) -> dict[str, object]:
    """The seed map document (spec 14.6), through the broker's own codec."""
    entries = {s.repo.lower(): SeedEntry(s.repo, s.seed_id, s.sensitivity, s.commit) for s in seeds}
    return encode_seed_map(SeedMap(entries))


def broker_config_doc(
    paths: RunPaths,
    run_id: str,
    config: BoundedQueriesConfig,
    *,
    image: str = DEFAULT_IMAGE,
    docker_host: str = DEFAULT_DOCKER_HOST,
    host_path_map: Mapping[str, str] | None = None,
    socket_gid: int | None = None,
) -> dict[str, object]:
    """The broker config document (``bounded-query-broker --config``), through its codec.

    ``socket_gid`` is the agent's gid: the broker makes the socket directory
    and the socket that group's (0770/0660), so the agent can connect.
    """
    document = BrokerConfig(
        run_id=run_id,
        socket_path=paths.socket_path,
        socket_uid=None,
        socket_gid=socket_gid,
        private_root=paths.private_root,
        seed_map_path=paths.seed_map,
        runtime=config.runtime,
        timeout_s=config.timeout,
        memory_limit=config.memory_limit,
        memory_bytes=policy.parse_memory_limit(config.memory_limit),
        max_invocations=config.max_invocations,
        image=image,
        docker_host=docker_host,
        host_path_map=tuple(sorted((host_path_map or {}).items())),
    )
    return encode_config(document)


def write_json_private(path: Path, document: object) -> None:
    """Write ``document`` to ``path`` atomically with mode 0600."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(json.dumps(document, indent=2) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def create_ingress_root(paths: RunPaths) -> None:
    """Create the ingress root (0755), ``run/`` (0770) and ``skill/bin`` (writable for now)."""
    paths.ingress_root.parent.mkdir(parents=True, exist_ok=True)
    os.mkdir(paths.ingress_root, 0o755)
    os.chmod(paths.ingress_root, 0o755)
    os.mkdir(paths.socket_dir, 0o770)
    os.chmod(paths.socket_dir, 0o770)
    paths.wrapper_dir.mkdir(parents=True, mode=0o755)


def _copy_read_only(source: Path, target: Path, mode: int) -> None:
    shutil.copyfile(source, target, follow_symlinks=False)
    os.chmod(target, mode)


def install_wrapper_dir(wrapper_dir: Path) -> None:
    """Copy the wrapper, the cost tool and the protocol package verbatim, read-only."""
    source = _wrapper_source_dir()
    for name, target in WRAPPER_FILES.items():
        _copy_read_only(source / name, wrapper_dir / target, 0o555)
    _install_protocol_copy(wrapper_dir)


def _install_protocol_copy(wrapper_dir: Path) -> None:
    """``bq_protocol/``: the broker's protocol package, verbatim and read-only."""
    protocol_source = Path(next(iter(protocol.__path__)))
    package = wrapper_dir / PROTOCOL_PACKAGE
    package.mkdir(mode=0o755)
    for entry in sorted(protocol_source.iterdir()):
        if entry.is_file() and entry.suffix == ".py":
            _copy_read_only(entry, package / entry.name, 0o444)
    os.chmod(package, 0o555)


def _seal(directory: Path) -> None:
    for root, dirs, files in os.walk(directory, topdown=False):
        for name in files:
            path = os.path.join(root, name)
            os.chmod(path, 0o555 if os.stat(path).st_mode & 0o111 else 0o444)
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o555)
    os.chmod(directory, 0o555)


def write_agent_side(paths: RunPaths, config: BoundedQueriesConfig) -> None:
    """Create the ingress root with SKILL.md and the wrapper directory, then seal it."""
    try:
        create_ingress_root(paths)
    except FileExistsError:
        raise FileExistsError(f"ingress root {paths.ingress_root} already exists") from None
    install_wrapper_dir(paths.wrapper_dir)
    paths.skill_file.write_text(render_skill(config), encoding="utf-8")
    _seal(paths.skill_dir)


def remove_roots(paths: RunPaths) -> None:
    """Delete both roots (teardown)."""
    for root in (paths.ingress_root, paths.private_root):
        remove_read_only_tree(root)


# --- 15.8 the bounded-agent subsystem's agent side -------------------------------------

#: The agent ingress's wrapper directory: the client (the same file as
#: ``bounded-query``, run as ``bounded-agent``), the cost tool (the charge
#: algebra is the queries') and the MCP server, next to ``bq_protocol/`` and
#: the run's task limit (``bounded-agent.json``).
AGENT_WRAPPER_FILES = {
    "bounded_query_cli.py": bounded_query_cli.AGENT_PROGRAM,
    "bounded_query_cost.py": "bounded-query-cost",
    "bounded_query_mcp.py": "bounded-query-mcp",
}


def install_agent_wrapper_dir(wrapper_dir: Path, max_task_bytes: int) -> None:
    """Copy the bounded-agent tools and the protocol package verbatim, read-only,
    and write ``bounded-agent.json`` (the run's ``maxTaskBytes``, so the CLI
    refuses an oversize task locally; the broker enforces it regardless)."""
    source = _wrapper_source_dir()
    for name, target in AGENT_WRAPPER_FILES.items():
        _copy_read_only(source / name, wrapper_dir / target, 0o555)
    _install_protocol_copy(wrapper_dir)
    limits = wrapper_dir / bounded_query_cli.AGENT_LIMITS_FILE
    fd = os.open(limits, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
    with os.fdopen(fd, "wb") as handle:
        handle.write(bounded_query_cli.encode_agent_limits(max_task_bytes))


def write_agent_subsystem_side(paths: RunPaths, config: BoundedAgentsConfig) -> None:
    """The agent ingress root of the bounded-agent subsystem (spec 15.8): ``run/``
    for the agent broker's socket, ``skill/SKILL.md`` (:func:`render_agent_skill`)
    and the read-only wrapper directory ``skill/bin`` with ``bounded-agent``;
    then sealed, like the query side (:func:`write_agent_side`). ``paths`` are
    the agent roots (same layout as the query roots).

    Raises:
        FileExistsError: the ingress root already exists (a stale run: the
            sweep removes it, never this function).
    """
    try:
        create_ingress_root(paths)
    except FileExistsError:
        raise FileExistsError(f"agent ingress root {paths.ingress_root} already exists") from None
    write_agent_ingress_files(paths, config)
    _seal(paths.skill_dir)


def write_agent_ingress_files(paths: RunPaths, config: BoundedAgentsConfig) -> None:
    """The agent ingress's files, into a created ingress root (``skill/bin``
    still writable; the caller seals ``skill/`` afterwards): the wrapper
    directory (:func:`install_agent_wrapper_dir`) and ``skill/SKILL.md``."""
    install_agent_wrapper_dir(paths.wrapper_dir, config.max_task_bytes)
    paths.skill_file.write_text(render_agent_skill(config), encoding="utf-8")
