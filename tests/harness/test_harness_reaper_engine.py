"""The reaper on the real engine (harness/lifecycle/reaper.py; issue 21).

A real ``bounded-query-harness run`` (the real broker on runc, the agent in
its container) is SIGKILLed -- the harness process alone, as an OOM killer
or ``kill -9`` would -- while a query container runs, and while the agent
runs with no query in flight. Within :data:`REAP_LIMIT_S` no container,
volume, root, mount or broker process of that run is left, the reaper
reported what it did, and the next run's sweep finds nothing of it.
The one reconcile (``reconcile.reconcile_containers``) removes the run's
compose broker service too, and never another run's containers or volumes.
"""

from __future__ import annotations

import contextlib
import io
import os
import secrets

import pytest

from bounded_query.broker.protocol.policy import DEFAULT_IMAGE, LABEL_HARNESS_RUN, LABEL_RUN
from bounded_query.harness.lifecycle.reconcile import reconcile_containers
from bounded_query.harness.lifecycle.sweep import SweepResult, sweep_stale_roots
from bounded_query.harness.records.events import EventSink
from tests.harness.reaper_engine import REAP_LIMIT_S, harness_run, kill_and_measure, leftovers

pytestmark = pytest.mark.engine

AGENT_IMAGE = "bounded-query-agent:latest"


@pytest.fixture
def engine(docker_client):
    for image in (AGENT_IMAGE, DEFAULT_IMAGE):
        try:
            docker_client.images.get(image)
        except Exception:
            pytest.fail(f"{image} is missing: run .ci/build-images")
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("the reaper's engine tests need root under CI=true")
        pytest.skip("the reaper's engine tests need root")
    return docker_client


@pytest.mark.parametrize("mode", ["query", "agent"])
def test_a_sigkilled_harness_leaves_nothing_of_its_run(engine, mode):
    with harness_run(engine, mode) as run:
        assert leftovers(engine, run)  # the run is there to be reaped
        measured = kill_and_measure(engine, run)
        assert measured.left == (), measured
        assert measured.seconds is not None
        assert measured.seconds < REAP_LIMIT_S
        reaped = measured.reaped
        assert reaped is not None
        assert reaped["roots"] == "removed"
        assert reaped["engine"] == "reconciled"
        assert reaped["containers"] >= (2 if mode == "query" else 1)  # the agent (, the query)
        sink = EventSink(io.StringIO())
        assert sweep_stale_roots(run.base, os.getuid(), sink) == SweepResult()
        assert sink.events == []


def test_the_engine_reconcile_removes_only_its_run(engine):
    mine, theirs = secrets.token_hex(16), secrets.token_hex(16)
    made = []
    try:
        for run in (mine, theirs):
            for label in (LABEL_RUN, LABEL_HARNESS_RUN):
                container = engine.containers.create(
                    DEFAULT_IMAGE, ["sleep", "300"], labels={label: run}, network_mode="none"
                )
                container.start()
                made.append(container)
            made.append(engine.volumes.create(f"bq-reaper-test-{run}", labels={LABEL_RUN: run}))
        # The compose broker service (its own label) and the run's container.
        assert reconcile_containers("unix:///var/run/docker.sock", mine) == 2
        for label in (LABEL_RUN, LABEL_HARNESS_RUN):
            assert engine.containers.list(all=True, filters={"label": f"{label}={mine}"}) == []
            assert (
                len(engine.containers.list(all=True, filters={"label": f"{label}={theirs}"})) == 1
            )
        assert engine.volumes.list(filters={"label": f"{LABEL_RUN}={mine}"}) == []
        assert len(engine.volumes.list(filters={"label": f"{LABEL_RUN}={theirs}"})) == 1
    finally:
        for thing in made:
            with contextlib.suppress(Exception):
                thing.remove(force=True)
