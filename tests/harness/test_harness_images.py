"""The installed package is enough (issue 14 item 5): images, and a demo from a wheel.

``bounded-query-harness images`` builds every image from the recipes shipped
as package data; a missing image names that command as the fix. The engine
test builds a wheel of the project, installs it into a fresh virtual
environment in another directory, and runs ``bounded-query-harness images``
and ``demo`` from there, so nothing of the checkout is needed at run time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from bounded_query.broker.protocol.policy import DEFAULT_IMAGE
from bounded_query.harness.__main__ import main
from bounded_query.harness.configuration.images import (
    RECIPES,
    build_images,
    missing_hint,
    recipe_script,
)
from tests.conftest import require_engine

ROOT = Path(__file__).resolve().parents[2]


def test_every_recipe_ships_with_the_package():
    assert RECIPES[0].image == DEFAULT_IMAGE
    for recipe in RECIPES:
        script = recipe_script(recipe)
        assert script.is_file(), script
        assert script.read_text(encoding="utf-8").startswith("#!/usr/bin/env bash")


def test_a_missing_recipe_is_a_broken_installation(tmp_path):
    from bounded_query.harness.configuration.images import ImageRecipe

    ghost = ImageRecipe("ghost:latest", "no-such-dir/build.sh", "ghost image")
    assert build_images([ghost, *RECIPES]) == [(ghost, 127)], "stops at the first failure"


def test_the_missing_image_hint_names_the_command():
    assert "bounded-query-harness images" in missing_hint("x:latest")
    assert "x:latest" in missing_hint("x:latest")


@pytest.mark.engine
def test_images_subcommand_builds_and_verifies_every_image(docker_client, capsys):
    result = main(["images"])
    assert result == 0
    events = [
        json.loads(line) for line in capsys.readouterr().err.splitlines() if line.startswith("{")
    ]
    ready = [e["image"] for e in events if e.get("event") == "image_ready"]
    assert ready == [r.image for r in RECIPES]
    for recipe in RECIPES:
        assert docker_client.images.get(recipe.image).labels.get("bounded-query.recipe")


@pytest.mark.engine
@pytest.mark.slow
def test_a_wheel_in_a_fresh_venv_runs_the_demo(tmp_path):
    require_engine()
    # Build from a copy: setuptools writes build/ next to the sources.
    source = tmp_path / "src"
    shutil.copytree(
        ROOT,
        source,
        ignore=shutil.ignore_patterns(
            ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis"
        ),
    )
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(source)],
        check=True,
        cwd=tmp_path,
    )
    wheels = list(dist.glob("bounded_query-*.whl"))
    assert len(wheels) == 1
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    clean_env = {
        "PATH": f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(tmp_path),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONFIG_FILE"):
        if name in os.environ:
            clean_env[name] = os.environ[name]
    subprocess.run(
        [str(bin_dir / "pip"), "install", "-q", str(wheels[0])],
        check=True,
        cwd=tmp_path,
        env=clean_env,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o777)
    elsewhere.chmod(0o777)
    harness = str(bin_dir / "bounded-query-harness")
    images = subprocess.run(
        [harness, "images"], cwd=elsewhere, env=clean_env, capture_output=True, text=True
    )
    assert images.returncode == 0, images.stderr[-3000:]
    demo = subprocess.run(
        [harness, "demo"],
        cwd=elsewhere,
        env=clean_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert demo.returncode == 0, demo.stderr[-4000:]
    assert '{"status":"ok"' in demo.stdout
    for place in (str(ROOT), str(source)):
        assert place not in demo.stdout + demo.stderr, "nothing came from the sources"
