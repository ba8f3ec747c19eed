"""Query sandbox backends (spec 14.7).

``create_runner(settings)`` builds the runner for the configured runtime:
``"docker"`` (runc) and ``"gvisor"`` (runsc) share :class:`DockerRunner`;
``"sbx"`` raises :class:`~bounded_query.broker.runner.RunnerUnavailable`
carrying :func:`sbx_capability_report` and never launches anything.
``create_enclave_runner(settings, options)`` builds the bounded-agent
broker's :class:`EnclaveRunner` (spec 15.5) the same way.
"""

from __future__ import annotations

from bounded_query.broker.protocol.policy import (
    ENCLAVE_ENGINES,
    ENCLAVE_OCI_RUNTIMES,
    LAUNCHABLE_RUNTIMES,
    RUNTIME_SBX,
)
from bounded_query.broker.runner import EnclaveOptions, Runner, RunnerSettings, RunnerUnavailable

from .docker_runner import DockerRunner, RunnerOptions, prepare_workspace
from .enclave_runner import EnclaveRunner
from .sbx import sbx_capability_report, sbx_unavailable
from .spec import ContainerSpec, container_spec, probe_spec, translate_host_path

__all__ = [
    "ContainerSpec",
    "DockerRunner",
    "EnclaveRunner",
    "RunnerOptions",
    "container_spec",
    "create_enclave_runner",
    "create_runner",
    "prepare_workspace",
    "probe_spec",
    "sbx_capability_report",
    "translate_host_path",
]


def create_runner(settings: RunnerSettings) -> Runner:
    """Return the runner for ``settings.runtime``.

    Raises:
        RunnerUnavailable: runtime "sbx" (always blocked, with the report).
        ValueError: any other unknown runtime (a configuration bug upstream).
    """
    if settings.runtime == RUNTIME_SBX:
        raise sbx_unavailable()
    if settings.runtime in LAUNCHABLE_RUNTIMES:
        return DockerRunner(settings)
    raise ValueError(f"unknown query runtime {settings.runtime!r}")


def create_enclave_runner(settings: RunnerSettings, options: EnclaveOptions) -> Runner:
    """Return the bounded-agent enclave runner for ``settings.runtime`` (spec 15.5, 15.7).

    Raises:
        RunnerUnavailable: runtime "sbx" (always blocked, with the report), or
            an engine without an enclave adapter (fails closed until it lands).
        ValueError: an unknown runtime or settings an enclave cannot have (a
            configuration bug upstream).
    """
    if settings.runtime == RUNTIME_SBX:
        raise sbx_unavailable()
    if settings.runtime not in ENCLAVE_OCI_RUNTIMES:
        raise ValueError(f"unknown enclave runtime {settings.runtime!r}")
    if options.engine not in ENCLAVE_ENGINES:
        raise RunnerUnavailable(
            f"engine {options.engine!r} has no enclave adapter and image yet "
            f"(available: {', '.join(ENCLAVE_ENGINES)})"
        )
    return EnclaveRunner(settings, options)
