"""Demo tests (run from the repository root with src/ on sys.path)."""

import importlib


def test_assemble() -> None:
    widgets = importlib.import_module("widgets")
    assert [w.size for w in widgets.assemble(["a", "bcd"])] == [1, 3]
