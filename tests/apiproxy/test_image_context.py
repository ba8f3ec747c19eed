"""The API proxy image's build context (no engine): what goes in, and the recipe digest."""

from __future__ import annotations

import pytest

from bounded_query.harness.compose.service import ComposeError
from bounded_query.harness.configuration.apiproxy_image import APIPROXY_UID, apiproxy_image_context


def _wheels(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "pip-23.2.1-py3-none-any.whl").write_bytes(b"pip")
    (wheels / "httpx2-2.16.2-py3-none-any.whl").write_bytes(b"httpx2")
    return wheels


def test_the_context_holds_the_broker_package_wheels_and_a_ca_bundle(tmp_path):
    context = tmp_path / "ctx"
    context.mkdir()
    recipe = apiproxy_image_context(context, _wheels(tmp_path), "sha256:base")
    dockerfile = (context / "Dockerfile").read_text()
    assert f"USER {APIPROXY_UID}:{APIPROXY_UID}" in dockerfile
    assert '"-m", "bounded_query.broker.apiproxy"' in dockerfile
    assert "httpx2==" in dockerfile
    assert recipe in dockerfile
    assert (context / "site/bounded_query/broker/apiproxy/server.py").is_file()
    assert not (context / "site/bounded_query/harness").exists()
    assert (context / "ca-certificates.crt").stat().st_size > 0
    assert not list(context.rglob("__pycache__"))


def test_the_recipe_follows_the_base_image(tmp_path):
    recipes = []
    for base in ("sha256:one", "sha256:two"):
        context = tmp_path / base.replace(":", "-")
        context.mkdir()
        (tmp_path / base[-3:]).mkdir()
        recipes.append(apiproxy_image_context(context, _wheels(tmp_path / base[-3:]), base))
    assert recipes[0] != recipes[1]


def test_a_wheel_cache_without_pip_is_refused(tmp_path):
    wheels = _wheels(tmp_path)
    (wheels / "pip-23.2.1-py3-none-any.whl").unlink()
    context = tmp_path / "ctx"
    context.mkdir()
    with pytest.raises(ComposeError, match="pip"):
        apiproxy_image_context(context, wheels)
