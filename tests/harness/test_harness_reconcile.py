"""The one container reconcile (sandbox/reconcile.py) and the harness's use of it.

* ``remove_labelled`` against a fake Engine API with the docker SDK's real
  error classes: a vanished container counts as removed, one failed attempt
  is retried, two are reported, ``select`` filters, a listing failure
  propagates before anything is removed.
* ``remove_labelled_volumes`` against a fake: exactly the labelled volumes
  go, failed attempts are retried (the runner's remove_volume), three are reported.
* ``reconcile.reconcile_containers`` on the real engine: exactly the
  containers of its run id go, running or not, then the volumes of its run
  id (what a killed broker leaves); another run's stay.
"""

from __future__ import annotations

import contextlib
import os

import docker.errors
import pytest

from bounded_query.broker.protocol.policy import LABEL_RUN
from bounded_query.harness.lifecycle.reconcile import reconcile_containers
from bounded_query.sandbox.reconcile import (
    Removal,
    remove_container,
    remove_labelled,
    remove_labelled_volumes,
)

QUERY_IMAGE = "bounded-query-python:latest"


class FakeEngine:
    """The two Engine API calls the reconcile makes, over an in-memory container table."""

    def __init__(self, containers: dict[str, dict[str, str]], failures: dict[str, int]) -> None:
        self.containers_by_id = containers
        self.failures = failures
        self.removals: list[tuple[str, bool, bool]] = []
        self.listing_error: Exception | None = None

    def containers(self, all: bool = False, filters: dict[str, str] | None = None):
        assert all, "stopped containers must be listed too"
        if self.listing_error is not None:
            raise self.listing_error
        key, _, value = (filters or {})["label"].partition("=")
        return [
            {"Id": ident, "Labels": dict(labels)}
            for ident, labels in self.containers_by_id.items()
            if key in labels and (not value or labels[key] == value)
        ]

    def remove_container(self, ident: str, v: bool = False, force: bool = False) -> None:
        self.removals.append((ident, v, force))
        if self.failures.get(ident, 0) > 0:
            self.failures[ident] -= 1
            raise docker.errors.APIError("removal of container is already in progress")
        if ident not in self.containers_by_id:
            raise docker.errors.NotFound("no such container")
        del self.containers_by_id[ident]


def run_labels(run: str, **extra: str) -> dict[str, str]:
    return {LABEL_RUN: run, **extra}


def test_removes_exactly_the_labelled_containers_with_their_volumes():
    engine = FakeEngine(
        {"a1": run_labels("A"), "a2": run_labels("A"), "b1": run_labels("B"), "x": {}}, {}
    )
    removal = remove_labelled(engine, f"{LABEL_RUN}=A")
    assert removal == Removal(removed=("a1", "a2"))
    assert set(engine.containers_by_id) == {"b1", "x"}
    assert all(v and force for _, v, force in engine.removals)


def test_one_failed_attempt_is_retried_two_are_reported():
    engine = FakeEngine({"a1": run_labels("A"), "a2": run_labels("A")}, {"a1": 1, "a2": 2})
    removal = remove_labelled(engine, f"{LABEL_RUN}=A")
    assert removal == Removal(removed=("a1",), failed=("a2",))
    assert [ident for ident, _, _ in engine.removals] == ["a1", "a1", "a2", "a2"]
    assert set(engine.containers_by_id) == {"a2"}


def test_a_container_that_vanished_counts_as_removed():
    engine = FakeEngine({}, {})
    assert remove_container(engine, "gone") is True
    # ... also when it vanished between a failed attempt and the retry.
    engine.failures["racing"] = 1
    assert remove_container(engine, "racing") is True
    assert len(engine.removals) == 3


def test_select_keeps_what_it_refuses():
    engine = FakeEngine(
        {
            "dead": run_labels("A", owner="gone"),
            "alive": run_labels("A", owner="here"),
            "none": run_labels("A"),
        },
        {},
    )
    removal = remove_labelled(
        engine, LABEL_RUN, select=lambda labels: labels.get("owner") == "gone"
    )
    assert removal.removed == ("dead",)
    assert set(engine.containers_by_id) == {"alive", "none"}


def test_a_listing_failure_propagates_and_removes_nothing():
    engine = FakeEngine({"a1": run_labels("A")}, {})
    engine.listing_error = docker.errors.APIError("engine restarting")
    with pytest.raises(docker.errors.APIError):
        remove_labelled(engine, f"{LABEL_RUN}=A")
    assert engine.removals == []


class FakeVolumes:
    """The two Engine API volume calls, over an in-memory table."""

    def __init__(self, volumes: dict[str, dict[str, str]], failures: dict[str, int]) -> None:
        self.table, self.failures = volumes, failures
        self.removals: list[str] = []

    def volumes(self, filters: dict[str, str] | None = None):
        key, _, value = (filters or {})["label"].partition("=")
        found = [
            {"Name": name, "Labels": labels}
            for name, labels in self.table.items()
            if labels.get(key) == value
        ]
        return {"Volumes": found or None, "Warnings": None}

    def remove_volume(self, name: str, force: bool = False) -> None:
        assert force
        self.removals.append(name)
        if self.failures.get(name, 0) > 0:
            self.failures[name] -= 1
            raise docker.errors.APIError("volume is in use")
        if name not in self.table:
            raise docker.errors.NotFound("no such volume")
        del self.table[name]


def test_removes_exactly_the_labelled_volumes_retrying():
    engine = FakeVolumes(
        {
            "a-view": run_labels("A"),
            "a-inv": run_labels("A"),
            "a-busy": run_labels("A"),
            "b-view": run_labels("B"),
            "plain": {},
        },
        {"a-inv": 1, "a-busy": 3},
    )
    removal = remove_labelled_volumes(engine, f"{LABEL_RUN}=A")
    assert removal == Removal(("a-view", "a-inv"), ("a-busy",))
    assert set(engine.table) == {"a-busy", "b-view", "plain"}
    assert remove_labelled_volumes(engine, f"{LABEL_RUN}=none") == Removal()


@pytest.mark.engine
def test_reconcile_removes_the_volumes_of_its_run_only(docker_client):
    mine, other = f"bq-reconcile-vol-{os.getpid()}", f"bq-reconcile-vol-other-{os.getpid()}"
    made = []
    try:
        for name, run in (("view", mine), ("inv", mine), ("other", other)):
            made.append(docker_client.volumes.create(f"{run}-{name}", labels={LABEL_RUN: run}))
        # A stopped container of the run still uses one of them: it goes first.
        container = docker_client.containers.create(
            QUERY_IMAGE,
            ["true"],
            labels={LABEL_RUN: mine},
            network_mode="none",
            volumes={f"{mine}-inv": {"bind": "/v", "mode": "rw"}},
        )
        assert reconcile_containers("unix:///var/run/docker.sock", mine) == 1
        with pytest.raises(docker.errors.NotFound):
            container.reload()
        left = {v.name for v in docker_client.volumes.list(filters={"label": LABEL_RUN})}
        assert f"{mine}-view" not in left
        assert f"{mine}-inv" not in left
        assert f"{other}-other" in left
    finally:
        for volume in made:
            with contextlib.suppress(Exception):
                volume.remove(force=True)


@pytest.mark.engine
def test_reconcile_containers_removes_its_run_only(docker_client):
    try:
        docker_client.images.get(QUERY_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.fail(f"{QUERY_IMAGE} is missing: run .ci/build-images")
    mine, other = f"bq-reconcile-test-{os.getpid()}", f"bq-reconcile-other-{os.getpid()}"
    made = []
    try:
        for name, run in (("running", mine), ("created", mine), ("other", other)):
            container = docker_client.containers.create(
                QUERY_IMAGE,
                ["sleep", "60"],
                name=f"{run}-{name}",
                labels={LABEL_RUN: run},
                network_mode="none",
            )
            made.append(container)
            if name == "running":
                container.start()
        assert reconcile_containers("unix:///var/run/docker.sock", mine) == 2
        left = {
            c.name for c in docker_client.containers.list(all=True, filters={"label": LABEL_RUN})
        }
        assert f"{mine}-running" not in left
        assert f"{mine}-created" not in left
        assert f"{other}-other" in left
        # Nothing left: a second reconcile is a no-op.
        assert reconcile_containers("unix:///var/run/docker.sock", mine) == 0
    finally:
        for container in made:
            with contextlib.suppress(Exception):
                container.remove(force=True)
