"""The compose document's storage grant follows the quota mount (issue 9 part 1)."""

from __future__ import annotations

from pathlib import Path

from bounded_query.harness.compose.service import BROKER_SERVICE, compose_document
from bounded_query.harness.configuration.config import BoundedQueriesConfig, PrivateRepo
from bounded_query.harness.lifecycle.paths import RunPaths

CONFIG = BoundedQueriesConfig(enabled=True, private_repos=(PrivateRepo("octo/a", "internal"),))
PATHS = RunPaths(Path("/var/tmp/b/awf-bounded-query-private-0-x"), Path("/var/tmp/b/ingress"))


def _broker(isolated: bool) -> dict:
    doc = compose_document(PATHS, CONFIG, "r" * 32, isolated_storage=isolated)
    return doc["services"][BROKER_SERVICE]


def test_with_the_quota_mount_the_broker_may_mount_per_invocation_storage():
    broker = _broker(True)
    assert broker["cap_add"] == ["SYS_ADMIN"]
    shared = [v for v in broker["volumes"] if isinstance(v, dict)]
    assert shared == [
        {
            "type": "bind",
            "source": str(PATHS.workspaces_dir),
            "target": str(PATHS.workspaces_dir),
            "bind": {"propagation": "rshared"},
        }
    ]


def test_without_it_neither_the_capability_nor_the_shared_bind_is_given():
    broker = _broker(False)
    assert "cap_add" not in broker
    assert all(isinstance(v, str) for v in broker["volumes"])
    assert f"{PATHS.private_root}:{PATHS.private_root}:rw" in broker["volumes"]
