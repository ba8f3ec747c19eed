"""Core widget logic (demo content)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Widget:
    """A widget with a name and a size."""

    name: str
    size: int


def assemble(names: list[str]) -> list[Widget]:
    """Build one widget per name, sized by the name's length."""
    return [Widget(name, len(name)) for name in names]
