"""The harness package's shape: no re-exported name hides a submodule (issue 11 item 1).

``harness/__init__.py`` re-exports ``run`` (the function); a submodule of
the same name would make ``bounded_query.harness.run`` mean one or the
other depending on import order, and tools reading imports would see the
wrong one.
"""

from __future__ import annotations

import importlib.util

import pytest

import bounded_query.harness as harness
from bounded_query.harness.lifecycle.orchestrate import run as orchestrate_run


@pytest.mark.parametrize("name", harness.__all__)
def test_no_exported_name_is_also_a_submodule(name):
    assert importlib.util.find_spec(f"bounded_query.harness.{name}") is None


def test_run_is_the_entry_function():
    assert harness.run is orchestrate_run
    assert callable(harness.run)
