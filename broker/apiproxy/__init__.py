"""The bounded-agent API proxy: the enclave's only peer and its model's only path (spec 15.6).

A separate process that holds the real provider credential, armed by the
broker over a Unix control socket for one invocation at a time with a random
placeholder; it forwards only the engine's one model call, only with that
placeholder, only for the configured model, at most ``maxModelRequests``
times, with the completion tokens clamped to ``maxModelTokens`` and hosted
tools stripped; everything else is a 4xx and never reaches the provider
(docs/architecture.md "Bounded agents: the API proxy"). Not yet wired into
``bounded-query-harness run``.

Module map (pure unless noted):

* ``_routes``   the per-engine route table (claude, copilot BYOK, codex, gemini)
* ``_arming``   the arming state machine, as a table
* ``_decide``   ``decide(head, body, state, config, credential)``: Forward | Refuse
* ``_usage``    usage records (codec) and the token meter of a response stream
* ``_config``   the JSON configuration codec
* ``_control``  the control protocol codec (arm / disarm / status)
* ``_wire``     the response bytes the enclave gets
* ``_limits``   the transport's bounds, each with its reason
* ``credential`` the 0400 credential file (I/O)
* ``usagelog``  the capped usage file (I/O)
* ``server``    the trio layer: listeners, arming, the httpx2 upstream (I/O)
* ``__main__``  ``bounded-query-api-proxy``
"""

from __future__ import annotations

from bounded_query.broker.apiproxy._arming import (
    Arm,
    Armed,
    ArmingState,
    Disarm,
    Disarmed,
    Forwarded,
    Step,
    step,
)
from bounded_query.broker.apiproxy._config import (
    ConfigError,
    ProxyConfig,
    Upstream,
    encode_config,
    load_config,
    parse_config,
)
from bounded_query.broker.apiproxy._control import (
    ArmCommand,
    ControlError,
    DisarmCommand,
    StatusCommand,
    parse_control,
)
from bounded_query.broker.apiproxy._decide import Forward, Refuse, RequestHead, decide, encode_json
from bounded_query.broker.apiproxy._routes import ROUTES, Route, route_for
from bounded_query.broker.apiproxy._usage import (
    USAGE_SCHEMA,
    UsageError,
    UsageMeter,
    UsageRecord,
    decode_record,
    encode_record,
)

__all__ = [
    "ROUTES",
    "USAGE_SCHEMA",
    "Arm",
    "ArmCommand",
    "Armed",
    "ArmingState",
    "ConfigError",
    "ControlError",
    "Disarm",
    "DisarmCommand",
    "Disarmed",
    "Forward",
    "Forwarded",
    "ProxyConfig",
    "Refuse",
    "RequestHead",
    "Route",
    "StatusCommand",
    "Step",
    "Upstream",
    "UsageError",
    "UsageMeter",
    "UsageRecord",
    "decide",
    "decode_record",
    "encode_config",
    "encode_json",
    "encode_record",
    "load_config",
    "parse_config",
    "parse_control",
    "route_for",
    "step",
]
