"""The protocol's own exception types (STYLE.md 4: errors say whose fault it is).

All three are caller faults: the bytes or objects came from the agent or its
query script. Any other exception escaping this package is a local bug.
"""

from __future__ import annotations

__all__ = ["JSONError", "RequestError", "SchemaError"]


class SchemaError(ValueError):
    """The response schema is not a valid finite-DSL document (spec 14.3).

    The message starts with the offending location, e.g.
    ``schema.fields.count: maximum must be >= minimum``.
    """


class RequestError(ValueError):
    """The request (object or HTTP frame) violates spec 14.3 / docs/architecture.md framing."""


class JSONError(ValueError):
    """Bytes are not one strict JSON document (spec 14.5).

    :func:`check_output` turns it into ``None``; request parsing turns it into
    :class:`RequestError`.
    """
