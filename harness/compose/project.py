"""``compose`` and ``compose-down``: the broker as a detached compose project (spec 14.7).

Theory of operation: ``compose`` prepares a run exactly as ``run`` does
(``prepare.prepare``: sweep, preflight, staging, outputs; the roots' owner
record says ``compose``, so no later sweep removes them), mounts the
workspace quota, builds the registry-free broker image, writes
``docker-compose.yml`` (``compose.py`` builds the document) and a small
state file, :data:`COMPOSE_STATE`, into ``--out``, and with ``--up`` starts
the project. It then exits: the project outlives it. ``compose-down``
reads the state file, runs ``docker-compose down``, force-removes whatever
is left with the run label (``reconcile.reconcile_containers``), unmounts
the quota and deletes both roots and the state file.

Both are synchronous commands: the async preparation runs in its own
``trio.run``, the file and engine work before and after it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import trio

from bounded_query.broker.mounts import unmount
from bounded_query.broker.protocol.policy import parse_memory_limit
from bounded_query.harness.compose.service import (
    ComposeError,
    compose_command,
    compose_document,
    ensure_broker_image,
    run_compose,
    write_compose_file,
)
from bounded_query.harness.lifecycle.options import EXIT_HARNESS, RunOptions
from bounded_query.harness.lifecycle.paths import RunPaths
from bounded_query.harness.lifecycle.prepare import prepare
from bounded_query.harness.lifecycle.quota import mount_work_quota
from bounded_query.harness.lifecycle.reconcile import reconcile_containers
from bounded_query.harness.records.events import EventSink
from bounded_query.harness.records.notices import load_reported
from bounded_query.harness.staging.outputs import remove_roots
from bounded_query.harness.staging.tokens import TOKEN_VARIABLES, scrub_process_environment

__all__ = ["COMPOSE_STATE", "compose_down", "compose_up"]

#: The state file ``compose`` leaves in ``--out`` for ``compose-down``.
COMPOSE_STATE = "bounded-query-compose.json"
#: Seconds ``docker-compose down`` gives the services to stop.
DOWN_TIMEOUT_S = 20


def compose_up(
    options: RunOptions, out: Path, sink: EventSink, *, project: str | None, up: bool
) -> int:
    """Stage the run and write the compose project into ``out``; the exit status.

    Prints the state and the commands to start and stop the project as JSON.
    """
    loaded = load_reported(options.config_source, sink)
    if loaded is None:
        return EXIT_HARNESS
    if not loaded.config.enabled:
        sink.emit("bounded_queries_disabled", message="nothing to compose")
        return 0
    env = dict(os.environ)
    scrub_process_environment(TOKEN_VARIABLES)  # staging has the copy (tokens.py)
    prepared = trio.run(prepare, options, loaded, env, sink)
    if prepared is None:
        return EXIT_HARNESS
    work_dir = prepared.paths.workspaces_dir
    trio.run(mount_work_quota, work_dir, parse_memory_limit(prepared.config.memory_limit), sink)
    name = project or f"bq{prepared.paths.private_root.name[-16:]}"
    compose_file = out / "docker-compose.yml"
    try:
        ensure_broker_image(prepared.docker_host)
        out.mkdir(parents=True, exist_ok=True)
        document = compose_document(
            prepared.paths,
            prepared.config,
            prepared.run_id,
            workspace=options.workspace,
            isolated_storage=os.path.ismount(prepared.paths.workspaces_dir),
        )
        write_compose_file(compose_file, document, prepared.paths)
        state = {
            "project": name,
            "composeFile": str(compose_file),
            "runId": prepared.run_id,
            "privateRoot": str(prepared.paths.private_root),
            "ingressRoot": str(prepared.paths.ingress_root),
            "dockerHost": prepared.docker_host,
        }
        (out / COMPOSE_STATE).write_text(json.dumps(state, indent=2) + "\n")
        if up:
            run_compose(name, compose_file, prepared.docker_host, "up", "-d")
    except (ComposeError, OSError) as exc:
        sink.emit("compose_failed", message=str(exc))
        with contextlib.suppress(OSError):
            unmount(work_dir)
        remove_roots(prepared.paths)
        return EXIT_HARNESS
    sink.emit("compose_written", composeFile=str(compose_file), project=name)
    summary = {
        **state,
        "up": " ".join(compose_command(name, compose_file, "up", "-d")),
        "down": f"bounded-query-harness compose-down --out {out}",
    }
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    return 0


def compose_down(out: Path, sink: EventSink) -> int:
    """Stop the project ``compose`` wrote into ``out`` and delete its state; the exit status."""
    state_file = out / COMPOSE_STATE
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError) as exc:
        sink.emit("usage_error", message=f"no compose state in {out}: {exc}")
        return EXIT_HARNESS
    done = run_compose(
        state["project"],
        Path(state["composeFile"]),
        state["dockerHost"],
        "down",
        "--remove-orphans",
        "--timeout",
        str(DOWN_TIMEOUT_S),
        check=False,
    )
    sink.emit("compose_down", status=done.returncode)
    removed = reconcile_containers(state["dockerHost"], state["runId"])
    sink.emit("containers_reconciled", removed=removed)
    paths = RunPaths(Path(state["privateRoot"]), Path(state["ingressRoot"]))
    with contextlib.suppress(OSError):
        sink.emit("work_quota_unmounted", how=unmount(paths.workspaces_dir))
    remove_roots(paths)
    state_file.unlink()
    sink.emit("roots_removed")
    return 0 if done.returncode == 0 else 1
