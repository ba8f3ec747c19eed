"""The run's one engine reconcile: its compose service, containers, volumes and networks, by label.

Teardown, the reaper (when the harness was killed), the sweep of a dead run
and ``compose-down`` all remove a run's engine objects the same way, through
here; the remove-by-label mechanics are ``sandbox/reconcile.py``'s.

With bounded agents (spec 15.4-15.6) the run also has enclaves (labelled
``LABEL_AGENT_RUN``), the API-proxy container and the enclave and egress
networks (labelled ``LABEL_AGENT_HARNESS``, the harness's own objects): the
same reconcile removes them, the networks last, once nothing is attached.
"""

from __future__ import annotations

import contextlib
from typing import Any

from bounded_query.broker.protocol.policy import (
    LABEL_AGENT_HARNESS,
    LABEL_AGENT_RUN,
    LABEL_HARNESS_RUN,
    LABEL_RUN,
)
from bounded_query.sandbox import engine
from bounded_query.sandbox.reconcile import (
    RECONCILE_TIMEOUT_S,
    remove_labelled,
    remove_labelled_volumes,
)

__all__ = ["reconcile_containers", "remove_labelled_networks"]


def remove_labelled_networks(api: Any, label: str) -> tuple[str, ...]:
    """Remove every network matching the ``label`` filter; the names of those left (blocking).

    A network the engine no longer knows counts as removed. One that still
    has endpoints (a container someone attached by hand) has them
    disconnected by force, then is removed again.

    Raises:
        Exception: whatever the engine raised listing the networks.
    """
    import docker.errors

    left: list[str] = []
    for entry in api.networks(filters={"label": label}) or ():
        ident, name = str(entry["Id"]), str(entry.get("Name", entry["Id"]))
        for attempt in range(2):
            try:
                api.remove_network(ident)
            except docker.errors.NotFound:
                break
            except Exception:  # in use: disconnect what is attached, then once more
                if attempt:
                    left.append(name)
                    break
                try:
                    attached = api.inspect_network(ident).get("Containers") or {}
                except Exception:
                    attached = {}
                for container in attached:
                    # Gone meanwhile, or the engine's reason: the retry tells.
                    with contextlib.suppress(Exception):
                        api.disconnect_container_from_network(container, ident, force=True)
                continue
            break
    return tuple(left)


def reconcile_containers(docker_host: str, run_id: str) -> int:
    """Force-remove every container, then every volume and network, labelled with ``run_id``.

    The one label reconcile (``sandbox/reconcile.py``), as the broker runs it,
    plus the volumes a killed broker left (mounted under the private root).
    The compose broker service of a ``run --compose`` goes first: it carries
    its own label (``policy.LABEL_HARNESS_RUN``, never the run
    label, so a broker's reconcile cannot catch itself), and a broker still running could
    start a query after the listing. Then the query containers and the
    agent container (``LABEL_RUN``), the enclaves (``LABEL_AGENT_RUN``) and
    the API proxy (``LABEL_AGENT_HARNESS``), the volumes, and last the
    bounded-agent networks. Returns the number of containers removed
    (blocking).

    Raises:
        Exception: the engine could not be reached or could not list containers.
    """
    api = engine.api_client(docker_host, RECONCILE_TIMEOUT_S)
    try:
        removed = len(remove_labelled(api, f"{LABEL_HARNESS_RUN}={run_id}").removed)
        for label in (LABEL_RUN, LABEL_AGENT_RUN, LABEL_AGENT_HARNESS):
            removed += len(remove_labelled(api, f"{label}={run_id}").removed)
        remove_labelled_volumes(api, f"{LABEL_RUN}={run_id}")
        remove_labelled_networks(api, f"{LABEL_AGENT_HARNESS}={run_id}")
        return removed
    finally:
        api.close()
