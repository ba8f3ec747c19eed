"""Fuzz target: the strict JSON parser (spec 14.5).

Allowed outcome: a value or JSONError. Invariant: whatever the strict parser
accepts, the stdlib ``json`` module accepts too, with the same structure
(the strict parser is a subset of JSON).
"""

from __future__ import annotations

import json

from _common import protocol, run


def _same(ours: object, ref: object) -> None:
    if isinstance(ours, protocol.NumberToken):
        assert isinstance(ref, int | float), (ours, ref)
    elif isinstance(ours, dict):
        assert isinstance(ref, dict), (ours, ref)
        assert list(ours) == list(ref), (ours, ref)
        for k in ours:
            _same(ours[k], ref[k])
    elif isinstance(ours, list):
        assert isinstance(ref, list), (ours, ref)
        assert len(ours) == len(ref), (ours, ref)
        for a, b in zip(ours, ref, strict=True):
            _same(a, b)
    else:
        assert type(ours) is type(ref), (ours, ref)
        assert ours == ref, (ours, ref)


def one_input(data: bytes) -> None:
    value = protocol.strict_parse_json(data)
    _same(value, json.loads(data.decode("utf-8")))


if __name__ == "__main__":
    run("strict_json", one_input, (protocol.JSONError,))
