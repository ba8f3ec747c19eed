"""``bounded-query-harness images``: build and verify the images from the installed package.

Theory of operation: nothing can be pulled, so every image
the harness starts is built here from Debian packages by a recipe shipped as
package data -- the query image (``sandbox/image/build.sh``, with the fixed
entrypoint) and the built-in agent image (``sandbox/agent_image/build.sh``).
Each recipe is idempotent (an image whose recipe label matches is kept), so
``images`` is cheap to re-run. :data:`RECIPES` is the one list of what is
built from where; :func:`missing_hint` is the fix hint every "image is
missing" problem gives. The compose broker image is built by ``compose``
itself from the query image, so it needs nothing more here.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bounded_query.broker.protocol.policy import DEFAULT_AGENT_IMAGE, DEFAULT_IMAGE

__all__ = [
    "ENCLAVE_RECIPE_FILES",
    "RECIPES",
    "ImageRecipe",
    "build_images",
    "enclave_hint",
    "enclave_recipe",
    "missing_hint",
    "recipe_script",
]

#: The installed ``bounded_query.sandbox`` package, where the recipes ship.
_SANDBOX = Path(__file__).resolve().parent.parent.parent / "sandbox"


@dataclass(frozen=True, slots=True)
class ImageRecipe:
    """One image and the shipped script that builds it."""

    image: str
    script: str
    what: str


#: Every image the harness needs, in build order.
RECIPES: tuple[ImageRecipe, ...] = (
    ImageRecipe(DEFAULT_IMAGE, "image/build.sh", "query image"),
    ImageRecipe(DEFAULT_AGENT_IMAGE, "agent_image/build.sh", "agent image"),
)


def missing_hint(image: str) -> str:
    """The fix hint for a missing image: the exact command that builds it."""
    return f"build it: bounded-query-harness images (builds {image} from Debian packages)"


#: The files whose digest is an enclave image's recipe label, in the order
#: ``recipe_begin`` (sandbox/image/recipe.sh) hashes them: the build script,
#: the adapter, then recipe.sh itself.
ENCLAVE_RECIPE_FILES: tuple[str, ...] = (
    "enclave_image/build.sh",
    "enclave_adapter.py",
    "image/recipe.sh",
)


def enclave_recipe() -> str:
    """The recipe label an enclave image built from this installation carries (blocking).

    The same digest for every engine (the engine is a build argument and has
    its own label). An image with another value was built from another
    adapter or recipe: it must be rebuilt, never used.

    Raises:
        OSError: a recipe file is missing (a broken installation).
    """
    digest = hashlib.sha256()
    for name in ENCLAVE_RECIPE_FILES:
        digest.update((_SANDBOX / name).read_bytes())
    return digest.hexdigest()


def enclave_hint(engine: str) -> str:
    """The fix hint for a missing or stale enclave image: the command that builds it."""
    script = _SANDBOX / "enclave_image" / "build.sh"
    return f"build it: bash {script} {engine} (or .ci/build-images)"


def recipe_script(recipe: ImageRecipe) -> Path:
    """The installed build script of ``recipe``."""
    return _SANDBOX / recipe.script


def build_images(recipes: Sequence[ImageRecipe] = RECIPES) -> list[tuple[ImageRecipe, int]]:
    """Run each recipe's build script (its progress goes to stderr).

    Returns (recipe, exit status) per recipe, stopping after the first
    failure. A missing script is status 127 (a broken installation).
    """
    results: list[tuple[ImageRecipe, int]] = []
    for recipe in recipes:
        script = recipe_script(recipe)
        if not script.is_file():
            results.append((recipe, 127))
            break
        status = subprocess.run(["bash", str(script), recipe.image], check=False).returncode
        results.append((recipe, status))
        if status != 0:
            break
    return results
