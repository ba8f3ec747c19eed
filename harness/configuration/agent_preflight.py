"""Fail-closed bounded-agent preflight, before anything is staged (spec 15.2, 15.7).

Theory of operation: the mirror of ``preflight.py`` for ``boundedAgents``.
:func:`agent_static_problems` is pure (the Docker host check aside, which
stats a socket as the query preflight does): given an
:class:`AgentPreflightInputs` it returns *every* problem at once --

* the engine has an enclave adapter and image (``policy.ENCLAVE_ENGINES``);
  the others (codex and gemini, and copilot until its adapter lands) fail
  closed with a message that says so;
* repositories and model present (the schema already requires them);
* the API target: plain http only with ``--allow-insecure-api-target``;
* the provider credential in the harness environment (checked for presence
  and shape only; its value is never part of any message);
* the staging credential and server URL for repositories without a
  ``--seed-source``; a unix-socket Docker host;
* ``runtime: "sbx"``: always refused, with the structured per-capability
  report of ``sbx_capability.py`` (``supported`` is never true).

:func:`agent_runtime_problems` is the thin engine layer: the engine answers;
the engine's enclave image is present with its labels (engine, pinned
version, the recipe digest of this installation); the API proxy image is
present; for ``gvisor`` the networked ``runsc-net`` registration exists and a
probe container that needs networking starts and exits 0 on it (never a
fallback to runc: on a host whose runsc cannot network this is a refusal);
the ``--api-proxy-egress-network`` exists and is not internal.
:func:`agent_preflight` runs both, static first (a problem there skips the
engine). Every problem aborts the run with exit 2 before staging.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from bounded_query.broker.protocol import policy
from bounded_query.harness.configuration.agents import (
    AGENTS_SECTION,
    parse_api_target,
    provider_of,
)
from bounded_query.harness.configuration.apiproxy_image import APIPROXY_IMAGE
from bounded_query.harness.configuration.config import ApiTarget, BoundedAgentsConfig, Problem
from bounded_query.harness.configuration.images import enclave_hint, enclave_recipe
from bounded_query.harness.configuration.preflight import (
    _docker_client,
    _docker_host_problems,
    staging_token,
)
from bounded_query.harness.configuration.sbx_capability import (
    SbxObservation,
    enclave_sbx_report,
    observe_sbx,
)
from bounded_query.harness.staging.seeds import StagingError, server_url

__all__ = [
    "AgentPreflightInputs",
    "agent_api_target",
    "agent_preflight",
    "agent_runtime_problems",
    "agent_static_problems",
    "copilot_byok_target",
    "credential_variable",
    "enclave_image_problems",
    "validate_network_name",
]

#: How long the gVisor probe container may take to start and exit.
PROBE_TIMEOUT_S = 60
#: The probe's role label value (beside the run label, so the sweep and the
#: reconcile of ``LABEL_AGENT_RUN`` remove it after a crash).
PROBE_ROLE = "bounded-agent-preflight-probe"
#: The probe's command: the enclave image's interpreter doing nothing.
PROBE_ENTRYPOINT = ("/usr/bin/python3", "-I", "-S", "-c", "pass")
#: The Docker network a probe joins: any networked namespace shows whether
#: the runtime can start with networking; it does nothing on it.
PROBE_NETWORK = "bridge"
_WHERE_ENGINE = f"{AGENTS_SECTION}.engine"
_WHERE_RUNTIME = f"{AGENTS_SECTION}.runtime"


@dataclass(frozen=True, slots=True)
class AgentPreflightInputs:
    """What the bounded-agent preflight looks at; ``seed_sources`` keyed by lowercased slug."""

    config: BoundedAgentsConfig
    env: Mapping[str, str]
    seed_sources: Mapping[str, Path] = field(default_factory=dict)
    #: ``--allow-insecure-server-url``: accept a plain-http GITHUB_SERVER_URL.
    allow_insecure_server: bool = False
    #: ``--allow-insecure-api-target``: accept an ``http://HOST[:PORT]`` target.
    allow_insecure_api_target: bool = False
    #: ``--api-proxy-egress-network NAME`` (None: the harness makes a bridge).
    egress_network: str | None = None
    #: What the host shows of ``sbx`` (``sbx_capability.observe_sbx``), for the report.
    sbx: SbxObservation = field(default_factory=SbxObservation)


def validate_network_name(name: str) -> str:
    """Check a Docker network name (``--api-proxy-egress-network``).

    Raises:
        ValueError: (caller's fault) not dockerd's name shape, or a name that
            is not a network the proxy may join (``host``, ``none``,
            ``container:...``, the enclave network).
    """
    if re.fullmatch(policy.DOCKER_NETWORK_NAME_PATTERN, name) is None:
        raise ValueError(
            f"--api-proxy-egress-network {name!r}: not a Docker network name (letters, digits,"
            " '_', '.', '-'; starting with a letter or digit; at most 63 characters)"
        )
    if name in ("host", "none") or name.startswith(policy.ENCLAVE_NETWORK):
        raise ValueError(
            f"--api-proxy-egress-network {name!r}: the proxy's egress side must be an ordinary"
            " bridge network (not host, none or the enclave network)"
        )
    return name


def credential_variable(engine: str, env: Mapping[str, str]) -> str | None:
    """The harness variable that holds ``engine``'s provider credential, or None.

    copilot: ``COPILOT_PROVIDER_API_KEY`` (BYOK) before ``COPILOT_GITHUB_TOKEN``.
    The value itself is never returned: the caller reads it once, by name.
    """
    for name in policy.AGENT_CREDENTIAL_VARIABLES.get(engine, ()):
        if env.get(name, "").strip():
            return name
    return None


def copilot_byok_target(env: Mapping[str, str]) -> ApiTarget:
    """The copilot BYOK upstream from ``COPILOT_PROVIDER_BASE_URL``.

    The URL must end in ``/v1``: the proxy's copilot route is the OpenAI
    ``/v1/chat/completions`` call, appended to the target's base path.

    Raises:
        ValueError: (operator's fault) missing or malformed; a plain-http URL
            is returned with scheme ``http`` (the caller decides on it).
    """
    raw = env.get(policy.COPILOT_BYOK_BASE_URL, "").strip()
    scheme, sep, rest = raw.partition("://")
    authority, slash, path = rest.partition("/")
    path = slash + path
    # The messages never repeat the value: a URL may carry a pasted key.
    shape = f"{policy.COPILOT_BYOK_BASE_URL} must be an https://HOST[:PORT][/PATH]/v1 URL"
    if not sep or not path.endswith("/v1"):
        raise ValueError(shape)
    try:
        return parse_api_target(f"{scheme}://{authority}", path.removesuffix("/v1"))
    except ValueError:
        raise ValueError(shape + " (lower-case host, no user info, query or fragment)") from None


def agent_api_target(config: BoundedAgentsConfig, env: Mapping[str, str]) -> ApiTarget:
    """Where the API proxy sends the engine's requests: the configured target,
    or for copilot with a BYOK key the BYOK base URL.

    Raises:
        ValueError: the BYOK base URL is malformed (the preflight reports it).
    """
    if (
        config.engine == "copilot"
        and credential_variable("copilot", env) == (policy.AGENT_CREDENTIAL_VARIABLES["copilot"][0])
    ):
        return copilot_byok_target(env)
    if config.target is None:
        raise ValueError("the bounded-agent configuration was not loaded (no target)")
    return config.target


def _engine_problems(config: BoundedAgentsConfig) -> list[Problem]:
    if config.engine in policy.ENCLAVE_ENGINES:
        return []
    ready = ", ".join(f'"{name}"' for name in policy.ENCLAVE_ENGINES)
    return [
        Problem(
            _WHERE_ENGINE,
            f"engine {config.engine!r} has no enclave adapter and image yet; it fails closed"
            " until they land (spec 15.2)",
            f"use {ready}",
        )
    ]


def _credential_problems(inputs: AgentPreflightInputs) -> list[Problem]:
    engine, env = inputs.config.engine, inputs.env
    names = policy.AGENT_CREDENTIAL_VARIABLES.get(engine, ())
    found = credential_variable(engine, env)
    if found is None:
        return [
            Problem(
                " or ".join(names),
                f"no provider credential for engine {engine!r} in the harness environment",
                f"export {' or '.join(names)} (it reaches only the API proxy, as a 0400 file)",
            )
        ]
    if engine != "copilot" or found != names[0]:
        return []
    problems: list[Problem] = []
    kind = env.get(policy.COPILOT_BYOK_TYPE, "").strip()
    if kind not in policy.COPILOT_BYOK_TYPES:
        problems.append(
            Problem(
                policy.COPILOT_BYOK_TYPE,
                # Never the value: a pasted key must not reach an event.
                "the BYOK provider type is missing or not one the API proxy's copilot"
                f" route speaks ({', '.join(policy.COPILOT_BYOK_TYPES)})",
                f"export {policy.COPILOT_BYOK_TYPE}={policy.COPILOT_BYOK_TYPES[0]}",
            )
        )
    try:
        target = copilot_byok_target(env)
    except ValueError as exc:
        problems.append(
            Problem(
                policy.COPILOT_BYOK_BASE_URL,
                str(exc),
                "export it, e.g. https://api.openai.com/v1",
            )
        )
    else:
        problems += _insecure_problems(target, policy.COPILOT_BYOK_BASE_URL, inputs)
    return problems


def _insecure_problems(
    target: ApiTarget, where: str, inputs: AgentPreflightInputs
) -> list[Problem]:
    if target.scheme == "https" or inputs.allow_insecure_api_target:
        return []
    return [
        Problem(
            where,
            f"plain-http API target {target.host}:{target.port}: the provider credential"
            " would cross the network in clear text",
            "use https://, or pass --allow-insecure-api-target (tests and local gateways only)",
        )
    ]


def _staging_problems(inputs: AgentPreflightInputs) -> list[Problem]:
    remote = [
        r.repo for r in inputs.config.private_repos if r.repo.lower() not in inputs.seed_sources
    ]
    if not remote:
        return []
    problems: list[Problem] = []
    try:
        server_url(inputs.env, allow_insecure=inputs.allow_insecure_server)
    except StagingError as exc:
        problems.append(Problem("GITHUB_SERVER_URL", str(exc), "fix GITHUB_SERVER_URL"))
    if staging_token(inputs.env) is None:
        problems.append(
            Problem(
                "GH_TOKEN/GITHUB_TOKEN",
                "no staging credential, but these bounded-agent repositories must be cloned: "
                + ", ".join(remote),
                "export GH_TOKEN (or GITHUB_TOKEN), or stage them with --seed-source",
            )
        )
    return problems


def _sbx_problem(observation: SbxObservation) -> Problem:
    report = enclave_sbx_report(observation)
    return Problem(
        _WHERE_RUNTIME,
        "sbx cannot confine an enclave and is blocked: " + json.dumps(report, sort_keys=True),
        'use "docker" or "gvisor"; sbx never falls back',
    )


def agent_static_problems(inputs: AgentPreflightInputs) -> list[Problem]:
    """Every engine-free bounded-agent problem (empty when disabled or all pass)."""
    config = inputs.config
    if not config.enabled:
        return []
    problems = _engine_problems(config)
    if not config.private_repos:
        problems.append(
            Problem(
                f"{AGENTS_SECTION}.privateRepos",
                "no repository is configured while enabled is true",
                'add at least one {"repo": "owner/repo", "sensitivity": ...} entry',
            )
        )
    if not config.model:
        problems.append(
            Problem(f"{AGENTS_SECTION}.model", "no model is configured", "name the model")
        )
    if config.runtime == policy.RUNTIME_SBX:
        problems.append(_sbx_problem(inputs.sbx))
    elif config.runtime not in policy.ENCLAVE_OCI_RUNTIMES:
        problems.append(Problem(_WHERE_RUNTIME, f"unknown runtime {config.runtime!r}", "see 15.2"))
    if config.target is not None:
        where = f"apiProxy.targets.{provider_of(config.engine)}.host"
        problems += _insecure_problems(config.target, where, inputs)
    problems += _credential_problems(inputs)
    problems += _staging_problems(inputs)
    problems += _docker_host_problems(inputs.env)
    if inputs.egress_network is not None:
        try:
            validate_network_name(inputs.egress_network)
        except ValueError as exc:
            problems.append(Problem("--api-proxy-egress-network", str(exc), "name a bridge"))
    return problems


# ------------------------------------------------------------- the engine layer


def enclave_image_problems(
    engine: str, image: str, labels: Mapping[str, str] | None, recipe: str
) -> list[Problem]:
    """The enclave image's presence and labels against this installation (pure).

    ``labels`` None: the image is absent.
    """
    hint = enclave_hint(engine)
    if labels is None:
        return [Problem("enclave image", f"{image} is not present (nothing can be pulled)", hint)]
    expected = {
        policy.LABEL_IMAGE_ENGINE: engine,
        policy.LABEL_IMAGE_ENGINE_VERSION: policy.ENCLAVE_ENGINE_VERSIONS.get(engine, ""),
        policy.LABEL_IMAGE_RECIPE: recipe,
    }
    wrong = [
        f"{key}={labels.get(key, '')!r} (expected {value!r})"
        for key, value in expected.items()
        if labels.get(key) != value
    ]
    if not wrong:
        return []
    return [
        Problem(
            "enclave image",
            f"{image} was not built by this installation's recipe: " + ", ".join(wrong),
            "re" + hint,
        )
    ]


def _image_labels(client: Any, image: str) -> Mapping[str, str] | None:
    import docker.errors

    try:
        found = client.images.get(image)
    except docker.errors.ImageNotFound:
        return None
    return dict(found.labels or {})


def _probe_body(config: BoundedAgentsConfig, image: str, run_id: str) -> dict[str, Any]:
    """A container that needs networking and does nothing, hardened like an enclave."""
    return {
        "Image": image,
        "Entrypoint": list(PROBE_ENTRYPOINT),
        "Cmd": [],
        "User": f"{policy.QUERY_UID}:{policy.QUERY_GID}",
        "NetworkDisabled": False,
        "Labels": {policy.LABEL_AGENT_RUN: run_id, policy.LABEL_ROLE: PROBE_ROLE},
        "HostConfig": {
            "Runtime": policy.ENCLAVE_OCI_RUNTIMES[config.runtime],
            "NetworkMode": PROBE_NETWORK,
            "ReadonlyRootfs": True,
            "CapDrop": ["ALL"],
            "SecurityOpt": ["no-new-privileges:true"],
            "Memory": config.memory_bytes,
            "MemorySwap": config.memory_bytes,
            "PidsLimit": config.pids_limit,
        },
    }


def _gvisor_probe(client: Any, config: BoundedAgentsConfig, image: str, run_id: str) -> str | None:
    """Run the probe on ``runsc-net``; the reason it failed, or None (blocking)."""
    api = client.api
    name = f"bq-agent-probe-{run_id[:16]}-{secrets.token_hex(4)}"
    try:
        created = api.create_container_from_config(_probe_body(config, image, run_id), name)
        api.start(created["Id"])
        result = api.wait(created["Id"], timeout=PROBE_TIMEOUT_S)
    except Exception as exc:
        return " ".join(str(exc).split())[:500]
    finally:
        with contextlib.suppress(Exception):  # already gone, or never created
            api.remove_container(name, force=True)
    code = result.get("StatusCode") if isinstance(result, dict) else None
    return None if code == 0 else f"the probe exited with {code}"


def _engine_checks(
    config: BoundedAgentsConfig, docker_host: str, run_id: str, egress_network: str | None
) -> list[Problem]:
    unreachable = _docker_host_problems({"DOCKER_HOST": docker_host})
    if unreachable:
        return unreachable
    try:
        recipe = enclave_recipe()
    except OSError as exc:
        return [
            Problem(
                "enclave image",
                f"the enclave recipe cannot be read ({exc.strerror}): a broken installation",
                "reinstall bounded-query",
            )
        ]
    try:
        client = _docker_client(docker_host)
    except Exception as exc:
        return [Problem("DOCKER_HOST", f"cannot connect to {docker_host}: {exc}", "start it")]
    try:
        info = client.info()
        image = policy.ENCLAVE_IMAGES[config.engine]
        problems = enclave_image_problems(
            config.engine, image, _image_labels(client, image), recipe
        )
        if _image_labels(client, APIPROXY_IMAGE) is None:
            problems.append(
                Problem(
                    "API proxy image",
                    f"{APIPROXY_IMAGE} is not present (nothing can be pulled)",
                    "build it: python3 -m bounded_query.harness.configuration.apiproxy_image",
                )
            )
        if egress_network is not None:
            problems += _egress_problems(client, egress_network)
        if config.runtime == policy.RUNTIME_GVISOR:
            oci = policy.ENCLAVE_OCI_RUNTIMES[policy.RUNTIME_GVISOR]
            if oci not in (info.get("Runtimes") or {}):
                problems.append(
                    Problem(
                        _WHERE_RUNTIME,
                        f"gvisor selected but {oci!r} (runsc with networking) is not registered"
                        " with the Docker daemon",
                        "register it in /etc/docker/daemon.json (.ci/provision-engine)",
                    )
                )
            elif not problems:
                failure = _gvisor_probe(client, config, image, run_id)
                if failure is not None:
                    problems.append(
                        Problem(
                            _WHERE_RUNTIME,
                            f"a networked gVisor container cannot start on {oci!r}: {failure};"
                            " an enclave never falls back to runc",
                            'fix runsc networking, or use "docker"',
                        )
                    )
        return problems
    except Exception as exc:
        return [Problem("DOCKER_HOST", f"engine at {docker_host} does not answer: {exc}", "start")]
    finally:
        client.close()


def _egress_problems(client: Any, name: str) -> list[Problem]:
    import docker.errors

    where = "--api-proxy-egress-network"
    try:
        network = client.networks.get(name)
    except docker.errors.NotFound:
        return [Problem(where, f"network {name!r} does not exist", "create it first, or omit it")]
    if network.attrs.get("Internal"):
        return [
            Problem(
                where,
                f"network {name!r} is internal: the API proxy could not reach the provider",
                "name a network with a route to the provider",
            )
        ]
    return []


async def agent_runtime_problems(
    config: BoundedAgentsConfig,
    docker_host: str,
    run_id: str,
    *,
    egress_network: str | None = None,
) -> list[Problem]:
    """Prove the enclave's images and runtime with the engine (in a worker thread)."""
    if not config.enabled or config.runtime not in policy.ENCLAVE_OCI_RUNTIMES:
        return []
    if config.engine not in policy.ENCLAVE_IMAGES:
        return []
    return await trio.to_thread.run_sync(
        _engine_checks, config, docker_host, run_id, egress_network
    )


async def agent_preflight(
    inputs: AgentPreflightInputs, docker_host: str, run_id: str, *, probe_runtime: bool = True
) -> list[Problem]:
    """The whole bounded-agent preflight: static first, then the engine (unless a
    static problem or ``probe_runtime`` False). Empty when disabled or all pass."""
    if not inputs.config.enabled:
        return []
    if inputs.config.runtime == policy.RUNTIME_SBX:
        observation = await trio.to_thread.run_sync(observe_sbx)
        inputs = dataclasses.replace(inputs, sbx=observation)
    problems = agent_static_problems(inputs)
    if problems or not probe_runtime:
        return problems
    return await agent_runtime_problems(
        inputs.config, docker_host, run_id, egress_network=inputs.egress_network
    )
