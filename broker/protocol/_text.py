"""Canonical JSON string escaping (spec 14.5; docs/architecture.md decision 6).

One escaping, compatible with ECMAScript ``JSON.stringify`` for well-formed
strings: ``"`` and ``\\`` are escaped, ``\\b \\f \\n \\r \\t`` use their short
forms, every other C0 control is ``\\u00xx`` with lowercase hex, and every
other character (DEL, C1, U+2028, non-ASCII) is written as raw UTF-8.
Strings reaching this function never contain lone surrogates (the strict
parser and the schema parser refuse them).
"""

from __future__ import annotations

import re

__all__ = ["json_string"]

_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')
_ESCAPES = {chr(c): f"\\u{c:04x}" for c in range(0x20)}
_ESCAPES.update(
    {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
)


def _escape(m: re.Match[str]) -> str:
    return _ESCAPES[m.group()]


def json_string(value: str) -> str:
    """Return the canonical JSON string literal (with quotes) for ``value``."""
    if _NEEDS_ESCAPE.search(value) is None:
        return '"' + value + '"'
    return '"' + _NEEDS_ESCAPE.sub(_escape, value) + '"'
