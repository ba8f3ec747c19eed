"""widgets: the demo's private example library."""

from .core import Widget, assemble

__all__ = ["Widget", "assemble"]
