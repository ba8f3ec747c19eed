"""Fail-closed preflight before any clone (spec 14.2 "Preflight", 14.8).

Theory of operation: :func:`static_problems` checks everything that needs no
engine -- repository list, slugs, limits, interpreter, Docker host, staging
credential, seed sources, private-root overlap -- and returns *every* problem
at once. :func:`runtime_problems` then proves the configured runtime with the
engine: for ``docker`` the engine answers and the query image exists; for
``gvisor`` the sandbox's own runner preflight runs a probe container under
runsc; ``sbx`` is always blocked with its structured capability report and
never falls back. Any problem aborts the run with exit 2 before staging.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bounded_query.broker.protocol import policy
from bounded_query.broker.protocol.policy import (
    DEFAULT_DOCKER_HOST,
    MAX_INVOCATIONS,
    MAX_TIMEOUT_S,
    MIN_INVOCATIONS,
    MIN_TIMEOUT_S,
    docker_socket_path,
    parse_memory_limit,
)
from bounded_query.broker.runner import RunnerSettings, RunnerUnavailable
from bounded_query.harness.configuration.channel_policy import channel_decision
from bounded_query.harness.configuration.config import (
    BoundedAgentsConfig,
    BoundedQueriesConfig,
    Problem,
)
from bounded_query.harness.configuration.images import missing_hint
from bounded_query.harness.lifecycle.paths import RunPaths, overlap_problems
from bounded_query.harness.staging.seeds import StagingError, server_url
from bounded_query.harness.staging.tokens import TOKEN_VARIABLES
from bounded_query.sandbox import engine

__all__ = [
    "PreflightError",
    "PreflightInputs",
    "docker_host_from_env",
    "runtime_problems",
    "staging_token",
    "static_problems",
]


class PreflightError(Exception):
    """Preflight failed (operator/infrastructure fault; exit 2)."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(str(p) for p in self.problems))


@dataclass(frozen=True, slots=True)
class PreflightInputs:
    """What preflight looks at; ``seed_sources`` is keyed by lowercased slug."""

    config: BoundedQueriesConfig
    paths: RunPaths
    env: Mapping[str, str]
    seed_sources: Mapping[str, Path] = field(default_factory=dict)
    agent_visible: tuple[Path, ...] = ()
    #: ``--allow-insecure-server-url``: accept a plain-http GITHUB_SERVER_URL.
    allow_insecure_server: bool = False
    #: ``--allow-cross-invocation-channels`` (harness/configuration/channel_policy.py).
    allow_open_channels: bool = False
    #: The broker can give each invocation its own tmpfs (it runs as root).
    isolated_storage: bool = False
    #: The ``boundedAgents`` section: a ``--seed-source`` may name its
    #: repositories too (their own checks: ``agent_preflight.py``).
    agents: BoundedAgentsConfig = field(default_factory=BoundedAgentsConfig)


def docker_host_from_env(env: Mapping[str, str]) -> str:
    """The Docker host queries would use: ``$DOCKER_HOST`` or the default socket."""
    return env.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST


def staging_token(env: Mapping[str, str]) -> str | None:
    """The staging credential from GH_TOKEN, then GITHUB_TOKEN (spec 14.6 step 1)."""
    for name in TOKEN_VARIABLES:
        value = env.get(name, "")
        if value.strip():
            return value.strip()
    return None


def _repo_problems(config: BoundedQueriesConfig) -> list[Problem]:
    problems: list[Problem] = []
    if not config.private_repos:
        problems.append(
            Problem(
                "boundedQueries.privateRepos",
                "no repository is configured while enabled is true",
                'add at least one {"repo": "owner/repo", "sensitivity": ...} entry',
            )
        )
    seen: dict[str, int] = {}
    for index, repo in enumerate(config.private_repos):
        where = f"boundedQueries.privateRepos[{index}]"
        if not isinstance(repo.repo, str) or policy.SLUG_RE.fullmatch(repo.repo) is None:
            problems.append(Problem(where, f"unsafe slug {repo.repo!r}", 'use "owner/repo"'))
            continue
        key = repo.repo.lower()
        if key in seen:
            problems.append(
                Problem(
                    where,
                    f"duplicate of privateRepos[{seen[key]}] (slugs compare case-insensitively)",
                    "list each repository once",
                )
            )
        else:
            seen[key] = index
        if repo.budget is None and repo.sensitivity != "public":
            problems.append(
                Problem(where, f"unknown sensitivity {repo.sensitivity!r}", "see spec 14.1")
            )
    return problems


def _limit_problems(config: BoundedQueriesConfig) -> list[Problem]:
    problems: list[Problem] = []
    if not MIN_TIMEOUT_S <= config.timeout <= MAX_TIMEOUT_S:
        problems.append(
            Problem(
                "boundedQueries.timeout",
                f"{config.timeout} s is outside {MIN_TIMEOUT_S}-{MAX_TIMEOUT_S}; the last "
                "minute of the 600 s timing bucket is reserved for termination and cleanup",
                f"use at most {MAX_TIMEOUT_S}",
            )
        )
    if not MIN_INVOCATIONS <= config.max_invocations <= MAX_INVOCATIONS:
        limits = f"{MIN_INVOCATIONS}-{MAX_INVOCATIONS}"
        problems.append(
            Problem("boundedQueries.maxInvocations", f"outside {limits}", f"use {limits}")
        )
    if config.interpreter not in policy.INTERPRETERS:
        problems.append(
            Problem(
                "boundedQueries.interpreter",
                f"unsupported interpreter {config.interpreter!r}",
                'use "python3"',
            )
        )
    try:
        parse_memory_limit(config.memory_limit)
    except ValueError as exc:
        problems.append(Problem("boundedQueries.memoryLimit", str(exc), 'use e.g. "512m"'))
    if config.runtime not in policy.RUNTIMES:
        problems.append(
            Problem("boundedQueries.runtime", f"unknown runtime {config.runtime!r}", "see 14.2")
        )
    return problems


def _docker_host_problems(env: Mapping[str, str]) -> list[Problem]:
    host = docker_host_from_env(env)
    if not policy.docker_socket_path(host).startswith("/"):
        return [
            Problem(
                "DOCKER_HOST",
                f"{host!r} is not a unix:// socket; a network_mode: none broker cannot reach it",
                "point DOCKER_HOST at a local unix:///... socket (or unset it)",
            )
        ]
    socket_path = docker_socket_path(host)
    try:
        mode = os.stat(socket_path).st_mode
    except OSError as exc:
        return [
            Problem(
                "DOCKER_HOST",
                f"{socket_path}: {exc.strerror}",
                "start the engine (.ci/provision-engine)",
            )
        ]
    if not stat.S_ISSOCK(mode):
        return [Problem("DOCKER_HOST", f"{socket_path} is not a socket", "fix DOCKER_HOST")]
    return []


def _source_problems(inputs: PreflightInputs) -> list[Problem]:
    problems: list[Problem] = []
    configured = {r.repo.lower() for r in inputs.config.private_repos}
    if inputs.agents.enabled:
        configured |= {r.repo.lower() for r in inputs.agents.private_repos}
    for slug, path in sorted(inputs.seed_sources.items()):
        where = f"--seed-source {slug}"
        if slug not in configured:
            problems.append(
                Problem(where, "names a repository that is not configured", "fix the slug")
            )
        if not path.exists():
            problems.append(
                Problem(where, f"{path} does not exist", "pass a git repository or bundle")
            )
    sources = inputs.seed_sources
    remote = [r.repo for r in inputs.config.private_repos if r.repo.lower() not in sources]
    if remote:
        try:
            server_url(inputs.env, allow_insecure=inputs.allow_insecure_server)
        except StagingError as exc:
            problems.append(Problem("GITHUB_SERVER_URL", str(exc), "fix GITHUB_SERVER_URL"))
    if remote and staging_token(inputs.env) is None:
        problems.append(
            Problem(
                "GH_TOKEN/GITHUB_TOKEN",
                "no staging credential, but these repositories must be cloned: "
                + ", ".join(remote),
                "export GH_TOKEN (or GITHUB_TOKEN), or stage them with --seed-source",
            )
        )
    return problems


def channel_problems(inputs: PreflightInputs) -> list[Problem]:
    """The cross-invocation channel policy's refusal, if any (``channel_policy.py``)."""
    decision = channel_decision(
        inputs.config.runtime,
        (repo.sensitivity for repo in inputs.config.private_repos),
        isolated_storage=inputs.isolated_storage,
        allow_open=inputs.allow_open_channels,
    )
    return [] if decision.problem is None else [decision.problem]


def static_problems(inputs: PreflightInputs) -> list[Problem]:
    """Every engine-free preflight problem (empty when all pass)."""
    config = inputs.config
    problems = _repo_problems(config) + _limit_problems(config)
    problems += _docker_host_problems(inputs.env)
    problems += _source_problems(inputs)
    problems += channel_problems(inputs)
    visible = (*inputs.agent_visible, inputs.paths.ingress_root)
    for text in overlap_problems(inputs.paths.private_root, visible):
        problems.append(
            Problem(
                "private root",
                text,
                "run from a workspace outside /var/tmp and mount nothing under the private root",
            )
        )
    return problems


def _docker_client(docker_host: str) -> Any:
    return engine.docker_client(docker_host, 30)


def _engine_problems(docker_host: str, image: str, runtime: str) -> list[Problem]:

    unreachable = _docker_host_problems({"DOCKER_HOST": docker_host})
    if unreachable:
        # Checked first: the SDK leaks a socket when it cannot connect at all.
        return [Problem(policy.RUNTIME_DOCKER, unreachable[0].message, unreachable[0].hint)]
    try:
        client = _docker_client(docker_host)
    except Exception as exc:
        return [
            Problem(
                policy.RUNTIME_DOCKER, f"cannot connect to {docker_host}: {exc}", "start the engine"
            )
        ]
    try:
        info = client.info()
        problems: list[Problem] = []
        try:
            client.images.get(image)
        except Exception:
            problems.append(
                Problem(
                    "image",
                    f"query image {image} is not present (nothing can be pulled)",
                    missing_hint(image),
                )
            )
        oci = policy.OCI_RUNTIMES[policy.RUNTIME_GVISOR]
        if runtime == policy.RUNTIME_GVISOR and oci not in (info.get("Runtimes") or {}):
            problems.append(
                Problem(
                    "boundedQueries.runtime",
                    "gvisor selected but runsc is not registered with the Docker daemon",
                    "register runsc in /etc/docker/daemon.json (.ci/provision-engine)",
                )
            )
        return problems
    except Exception as exc:
        return [
            Problem(
                policy.RUNTIME_DOCKER, f"engine at {docker_host} does not answer: {exc}", "start it"
            )
        ]
    finally:
        client.close()


async def _gvisor_probe(settings: RunnerSettings) -> list[Problem]:
    try:
        # Lazily: the sandbox package pulls in the docker SDK's runner code.
        from bounded_query.sandbox import create_runner
    except ImportError as exc:
        return [Problem("boundedQueries.runtime", f"gvisor runner unavailable: {exc}", "install")]
    try:
        runner = create_runner(settings)
        try:
            await runner.preflight()
        finally:
            await runner.aclose()  # the probe's engine client (and nothing else) goes
    except RunnerUnavailable as exc:
        return [
            Problem(
                "boundedQueries.runtime",
                f"gvisor probe container failed: {exc}",
                "fix runsc (see docs/architecture.md, Environment facts)",
            )
        ]
    return []


def sbx_problem() -> Problem:
    """The fail-closed sbx block with the structured capability report (spec 14.2)."""
    report: Any
    try:
        from bounded_query.sandbox import sbx_capability_report
    except ImportError:
        report = {"supported": False, "reason": "sbx capability probe not installed"}
    else:
        report = sbx_capability_report()
    if dataclasses.is_dataclass(report) and not isinstance(report, type):
        report = dataclasses.asdict(report)
    return Problem(
        "boundedQueries.runtime",
        "sbx is a fail-closed preview and is blocked: " + json.dumps(report, default=str),
        'use "docker" or "gvisor"; sbx never falls back',
    )


async def runtime_problems(
    config: BoundedQueriesConfig, docker_host: str, image: str, run_id: str
) -> list[Problem]:
    """Prove the configured runtime with the engine (runs in worker threads)."""
    if config.runtime == policy.RUNTIME_SBX:
        return [sbx_problem()]
    problems = await trio.to_thread.run_sync(_engine_problems, docker_host, image, config.runtime)
    if problems or config.runtime != policy.RUNTIME_GVISOR:
        return problems
    settings = RunnerSettings(
        runtime=policy.RUNTIME_GVISOR,
        run_id=run_id,
        image=image,
        timeout_s=config.timeout,
        memory_bytes=parse_memory_limit(config.memory_limit),
        docker_host=docker_host,
    )
    return await _gvisor_probe(settings)
