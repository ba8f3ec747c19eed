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

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bounded_query.broker.protocol.policy import DEFAULT_AGENT_IMAGE, DEFAULT_IMAGE

__all__ = ["RECIPES", "ImageRecipe", "build_images", "missing_hint", "recipe_script"]

#: The installed ``bounded_query.sandbox`` package, where the recipes ship.
_SANDBOX = Path(__file__).resolve().parent.parent / "sandbox"


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
