"""Fuzz target: check_request_line and parse_frame (docs/architecture.md framing).

Input layout (lines separated by LF): ``METHOD TARGET``, then header lines
``name:value`` up to an empty line, then the body. A header named ``S``
becomes ``x-awf-schema-b64`` with its value base64url-encoded canonically,
so the fuzzer reaches the schema parser; every other header is passed as
written (any case). Allowed outcome: a Request or RequestError.
Invariant: an accepted frame round-trips through parse_request.
"""

from __future__ import annotations

import contextlib

from _common import protocol, run


def one_input(data: bytes) -> None:
    head, _, body = data.partition(b"\n\n")
    lines = head.split(b"\n")
    method, _, target = lines[0].partition(b" ")
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        if name == b"S":
            name, value = b"X-AWF-Schema-B64", protocol.encode_schema_header(value)
        headers.append((name, value))
    with contextlib.suppress(protocol.RequestError):
        protocol.check_request_line(method, target)
    request = protocol.parse_frame(headers, body)
    assert protocol.is_valid_slug(request.private_repo)
    assert request.script.encode("utf-8") == body
    again = protocol.parse_request(
        {
            "privateRepo": request.private_repo,
            "schema": protocol.strict_parse_json(
                request.schema.canonical.encode(), max_bytes=protocol.MAX_SCHEMA_BYTES
            ),
            "script": request.script,
        }
    )
    assert again == request


if __name__ == "__main__":
    run("parse_frame", one_input, (protocol.RequestError,))
