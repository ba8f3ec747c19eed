"""The broker image's build context, without an engine (spec 14.7; issue 5 item 6)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from bounded_query.harness.compose.service import RECIPE_LABEL, broker_image_context


def fake_wheels(directory: Path) -> Path:
    directory.mkdir()
    (directory / "pip-23.2.1-py3-none-any.whl").write_bytes(b"pip")
    (directory / "trio-0.1.0-py3-none-any.whl").write_bytes(b"an older trio left in the cache")
    return directory


def test_dockerfile_installs_the_hosts_pinned_versions_offline(tmp_path):
    wheels = fake_wheels(tmp_path / "wheels")
    context = tmp_path / "ctx"
    context.mkdir()
    recipe = broker_image_context(context, wheels, "sha256:base")
    dockerfile = (context / "Dockerfile").read_text()
    assert "FROM bounded-query-python:latest" in dockerfile
    assert "--no-index" in dockerfile
    # Pinned: a stale wheel in the cache can never be picked instead.
    assert f"trio=={importlib.metadata.version('trio')}" in dockerfile
    assert f"docker=={importlib.metadata.version('docker')}" in dockerfile
    assert f'LABEL {RECIPE_LABEL}="{recipe}"' in dockerfile
    assert (context / "site" / "bounded_query" / "broker" / "__init__.py").is_file()
    assert not list(context.rglob("__pycache__"))


def test_recipe_changes_with_the_query_image(tmp_path):
    wheels = fake_wheels(tmp_path / "wheels")
    recipes = []
    for index, base in enumerate(("sha256:one", "sha256:one", "sha256:two")):
        context = tmp_path / f"ctx{index}"
        context.mkdir()
        recipes.append(broker_image_context(context, wheels, base))
    assert recipes[0] == recipes[1]
    assert recipes[0] != recipes[2]


def test_a_wheel_cache_missing_a_pinned_wheel_is_refilled(tmp_path, monkeypatch):
    from bounded_query.harness.compose import service as compose

    calls: list[tuple[str, ...]] = []

    def fake_pip(*args: str) -> None:
        calls.append(args)
        dest = Path(args[args.index("--dest") + 1])
        for pin in compose._pins():
            name, _, version = pin.partition("==")
            (dest / f"{name}-{version}-py3-none-any.whl").write_bytes(b"w")

    monkeypatch.setattr(compose, "_pip", fake_pip)
    cache = tmp_path / "cache"
    assert compose.prepare_wheels(cache) == cache
    assert compose.prepare_wheels(cache) == cache
    assert len(calls) == 1  # idempotent: the second call downloads nothing
    next(cache.glob("trio-*.whl")).unlink()  # e.g. a cache cleaned by hand
    compose.prepare_wheels(cache)
    assert len(calls) == 2
    assert list(cache.glob("trio-*.whl"))
