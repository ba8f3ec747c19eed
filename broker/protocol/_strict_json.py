"""A strict, linear-time JSON parser for untrusted bytes (spec 14.5).

Theory of operation: the input is size-checked, then decoded as strict UTF-8
in one step (Python's decoder rejects overlong forms, encoded surrogates and
truncated sequences). A recursive-descent parser over the decoded text then
accepts exactly one RFC 8259 value with optional surrounding JSON whitespace.
Every token is recognized by a regular expression made of single character
classes (no alternation that could backtrack), so the work is linear in the
input; recursion is bounded by ``max_depth``.

Rejected, as :class:`JSONError`: malformed JSON of any kind, leading or
trailing content, duplicate object keys (after unescaping), unknown escapes,
unescaped control characters, lone or mis-ordered UTF-16 surrogate escapes,
``NaN``/``Infinity`` and other non-JSON tokens, nesting deeper than
``max_depth`` and inputs larger than ``max_bytes``.

Numbers: a plain integer token of at most 16 digits (every safe integer has
at most 16) becomes an ``int``; ``-0`` is such a token (RFC 8259's grammar
makes it an integer) and becomes the int 0, as in the reference, so it
canonicalizes to ``0``. Every other number token (a fraction or an exponent,
``-0.0`` and ``-0e0`` included, or more digits) becomes a :class:`NumberToken`
carrying its text. It is well-formed JSON, but it is never an integer of the
finite DSL (docs/architecture.md decision 6), so validators reject it; ``int()`` is
never called on more than 16 digits and no float is ever built.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._constants import MAX_OUTPUT_DEPTH, MAX_RESULT_BYTES
from ._errors import JSONError

__all__ = ["NumberToken", "strict_parse_json"]

#: Digits of the largest safe integer (9007199254740991).
_MAX_INT_DIGITS = 16

_WS_CHARS = " \t\n\r"
_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_STRING_RUN = re.compile(r'[^"\\\x00-\x1f]*')
_HEX4 = re.compile(r"[0-9A-Fa-f]{4}")
_SIMPLE_ESCAPES = {
    '"': '"',
    "\\": "\\",
    "/": "/",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
}


@dataclass(frozen=True)
class NumberToken:
    """A well-formed JSON number that is not a plain safe-range integer token."""

    text: str


class _Parser:
    """One parse over one decoded document.

    The text carries a NUL sentinel after its last character (``n`` is the
    sentinel's index), so ``s[i]`` never runs off the end: NUL is invalid
    everywhere in JSON, so reaching it is an error like any other.
    """

    __slots__ = ("max_depth", "n", "s")

    def __init__(self, text: str, max_depth: int) -> None:
        self.s = text + "\x00"
        self.n = len(text)
        self.max_depth = max_depth

    def fail(self, what: str, i: int) -> JSONError:
        if i >= self.n:
            what = "unexpected end of input"
        return JSONError(f"json: {what} at offset {i}")

    def value(self, i: int, depth: int) -> tuple[object, int]:
        """Parse the value starting at ``i`` (no leading whitespace)."""
        s = self.s
        c = s[i]
        if c == '"':
            return self.string(i + 1)
        if c == "{":
            return self.obj(i + 1, depth + 1)
        if c == "[":
            return self.array(i + 1, depth + 1)
        if c == "-" or "0" <= c <= "9":
            m = _NUMBER.match(s, i)
            if m is None:
                raise self.fail("malformed number", i)
            return _number(m), m.end()
        if c == "t" and s.startswith("true", i):
            return True, i + 4
        if c == "f" and s.startswith("false", i):
            return False, i + 5
        if c == "n" and s.startswith("null", i):
            return None, i + 4
        raise self.fail("unexpected character", i)

    def string(self, i: int) -> tuple[str, int]:
        """Parse a string body starting just after its opening quote."""
        s = self.s
        m = _STRING_RUN.match(s, i)
        assert m is not None  # the pattern matches the empty string
        j = m.end()
        if s[j] == '"':  # fast path: no escapes
            return s[i:j], j + 1
        parts: list[str] = []
        while True:
            if j > i:
                parts.append(s[i:j])
            c = s[j]
            if c == '"':
                return "".join(parts), j + 1
            if c != "\\":
                raise self.fail("unescaped control character in string", j)
            e = s[j + 1]
            simple = _SIMPLE_ESCAPES.get(e)
            if simple is not None:
                parts.append(simple)
                i = j + 2
            elif e != "u":
                raise self.fail("invalid escape", j + 1)
            else:
                cp = self.hex4(j + 2)
                if 0xDC00 <= cp <= 0xDFFF:
                    raise self.fail("lone low surrogate escape", j)
                if 0xD800 <= cp <= 0xDBFF:
                    if not s.startswith("\\u", j + 6):
                        raise self.fail("lone high surrogate escape", j)
                    low = self.hex4(j + 8)
                    if not 0xDC00 <= low <= 0xDFFF:
                        raise self.fail("lone high surrogate escape", j)
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00)
                    i = j + 12
                else:
                    i = j + 6
                parts.append(chr(cp))
            m = _STRING_RUN.match(s, i)
            assert m is not None
            j = m.end()

    def hex4(self, i: int) -> int:
        if _HEX4.fullmatch(self.s, i, i + 4) is None:
            raise self.fail("invalid \\u escape", i)
        return int(self.s[i : i + 4], 16)

    def ws(self, i: int) -> int:
        """Skip JSON whitespace (only space, tab, LF, CR) from ``i``."""
        if self.s[i] in _WS_CHARS:
            m = _WS.match(self.s, i)
            assert m is not None  # the pattern matches the empty string
            return m.end()
        return i

    def obj(self, i: int, depth: int) -> tuple[dict[str, object], int]:
        if depth > self.max_depth:
            raise self.fail("nesting too deep", i)
        s = self.s
        ws = self.ws
        result: dict[str, object] = {}
        i = ws(i)
        if s[i] == "}":
            return result, i + 1
        while True:
            if s[i] != '"':
                raise self.fail("expected a string key", i)
            key, i = self.string(i + 1)
            if key in result:
                raise self.fail("duplicate object key", i)
            i = ws(i)
            if s[i] != ":":
                raise self.fail("expected ':'", i)
            i = ws(i + 1)
            result[key], i = self.value(i, depth)
            i = ws(i)
            c = s[i]
            if c == ",":
                i = ws(i + 1)
            elif c == "}":
                return result, i + 1
            else:
                raise self.fail("expected ',' or '}'", i)

    def array(self, i: int, depth: int) -> tuple[list[object], int]:
        if depth > self.max_depth:
            raise self.fail("nesting too deep", i)
        s = self.s
        ws = self.ws
        value = self.value
        result: list[object] = []
        append = result.append
        i = ws(i)
        if s[i] == "]":
            return result, i + 1
        while True:
            item, i = value(i, depth)
            append(item)
            c = s[i]
            if c in _WS_CHARS:
                i = ws(i)
                c = s[i]
            if c == ",":
                i = ws(i + 1)
            elif c == "]":
                return result, i + 1
            else:
                raise self.fail("expected ',' or ']'", i)


def _number(m: re.Match[str]) -> object:
    """An ``int`` for a plain integer token of at most 16 digits (``-0`` is 0), else a token."""
    text = m.group()
    if m.lastindex is not None:  # a fraction or an exponent
        return NumberToken(text)
    if len(text) - (text[0] == "-") > _MAX_INT_DIGITS:
        return NumberToken(text)
    return int(text)


def strict_parse_json(
    raw: bytes, *, max_bytes: int = MAX_RESULT_BYTES, max_depth: int = MAX_OUTPUT_DEPTH
) -> object:
    """Parse one strict JSON document from untrusted bytes (spec 14.5).

    Returns the value as plain Python data: ``dict`` (keys unique, in
    document order), ``list``, ``str``, ``int`` (plain integer tokens of at
    most 16 digits), :class:`NumberToken` (every other number), ``bool`` or
    ``None``.

    Raises:
        JSONError: ``raw`` is not bytes, is larger than ``max_bytes``, is not
            valid UTF-8, or is not exactly one strict JSON value (see the
            module docstring).
    """
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise JSONError("json: input must be bytes")
    if len(raw) > max_bytes:
        raise JSONError(f"json: input larger than {max_bytes} bytes")
    try:
        text = bytes(raw).decode("utf-8", "strict")
    except UnicodeDecodeError as exc:
        raise JSONError(f"json: invalid UTF-8 at offset {exc.start}") from None
    parser = _Parser(text, max_depth)
    value, i = parser.value(parser.ws(0), 0)
    i = parser.ws(i)
    if i != parser.n:
        raise JSONError(f"json: trailing content at offset {i}")
    return value
