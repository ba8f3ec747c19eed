"""The per-engine route table: the one model call each engine may make (spec 15.2, 15.6).

Theory of operation: a native engine reaches its model through exactly one
provider endpoint, so the API proxy allows exactly one (method, path) per
engine and refuses everything else before any byte leaves. A :class:`Route`
says where that request carries the things the proxy must control:

* the **credential** header and its form (the engine sends the broker's
  placeholder there; the proxy replaces it with the real credential);
* the **model** (a JSON field of the body, or a path segment for gemini);
* the **completion-token fields** (clamped to ``maxModelTokens``; the first
  one is added when the engine sent none);
* the **choice-count field** (several completions per request would multiply
  the token bound: anything but 1 is refused);
* **stateful fields** the provider keeps between requests (a stored response
  another invocation could name later is a cross-invocation channel at the
  provider: refused, and the store flag is pinned off);
* which **tool definitions** run in the enclave (client tools, kept) and
  which run at the provider (hosted tools such as web search or URL fetch:
  an egress path around the enclave's network, so they are stripped, see
  ``_decide.py``);
* the request headers worth forwarding (everything else is dropped).

Facts per engine: /work/shared/ENGINES.md (measured with the pinned
versions). claude and copilot BYOK are the engines the next step wires;
codex and gemini are rows already because the issue after needs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from bounded_query.broker.protocol.policy import AGENT_ENGINES

__all__ = [
    "CREDENTIAL_BEARER",
    "CREDENTIAL_RAW",
    "MODEL_IN_PATH",
    "ROUTES",
    "Route",
    "route_for",
]

#: The credential header carries the key itself (``x-api-key: KEY``).
CREDENTIAL_RAW = "raw"
#: The credential header carries ``Bearer KEY`` (``Authorization``).
CREDENTIAL_BEARER = "bearer"
#: ``Route.model_field`` value: the model is the ``{model}`` path segment.
MODEL_IN_PATH = ""


@dataclass(frozen=True, slots=True)
class Route:
    """One engine's allowed model call and where its controlled fields live.

    ``path`` is matched byte for byte (no decoding, no normalization), with
    ``{model}`` replaced by the configured model when ``model_field`` is
    :data:`MODEL_IN_PATH`. ``queries`` lists every accepted query string
    exactly (``None``: no ``?`` at all). Dotted field names address nested
    objects (``generationConfig.maxOutputTokens``). ``client_tool_kinds``
    are the tool ``type`` values (or, for gemini, the single key of a tool
    object) that the engine itself executes; the key ``""`` stands for a
    tool without a ``type`` (Anthropic's custom tools).
    """

    name: str
    engine: str
    method: bytes
    path: bytes
    queries: frozenset[bytes | None]
    credential_header: bytes
    credential_form: str
    model_field: str
    max_tokens_fields: tuple[str, ...]
    choices_field: str | None
    refused_fields: tuple[str, ...]
    pinned_false_fields: tuple[str, ...]
    stripped_fields: tuple[str, ...]
    tools_field: str
    tool_kind_key: str | None
    client_tool_kinds: frozenset[str]
    tool_choice_field: str | None
    tool_choice_kinds: frozenset[str]
    forward_headers: frozenset[bytes]

    def __post_init__(self) -> None:
        if self.engine not in AGENT_ENGINES:
            raise ValueError(f"route {self.name}: unknown engine {self.engine!r}")
        if self.credential_form not in (CREDENTIAL_RAW, CREDENTIAL_BEARER):
            raise ValueError(f"route {self.name}: unknown credential form")
        if not self.path.startswith(b"/") or not self.max_tokens_fields:
            raise ValueError(f"route {self.name}: malformed")
        if (self.model_field == MODEL_IN_PATH) != (b"{model}" in self.path):
            raise ValueError(f"route {self.name}: the model must be in the path or the body")

    def path_for(self, model: str) -> bytes:
        """The exact path the configured ``model`` is reached at."""
        return self.path.replace(b"{model}", model.encode("ascii"))


#: Headers an engine sends that carry no authority and that providers read.
_COMMON_HEADERS = frozenset({b"accept", b"user-agent"})

ROUTES: Mapping[str, Route] = MappingProxyType(
    {
        # Anthropic Messages; claude sends ?beta=true and streams SSE.
        "claude": Route(
            name="anthropic-messages",
            engine="claude",
            method=b"POST",
            path=b"/v1/messages",
            queries=frozenset({None, b"beta=true"}),
            credential_header=b"x-api-key",
            credential_form=CREDENTIAL_RAW,
            model_field="model",
            max_tokens_fields=("max_tokens",),
            choices_field=None,
            refused_fields=(),
            pinned_false_fields=(),
            # The MCP connector makes the provider call arbitrary servers; a
            # container id reuses provider-side execution state.
            stripped_fields=("mcp_servers", "container"),
            tools_field="tools",
            tool_kind_key="type",
            client_tool_kinds=frozenset({"", "custom"}),
            tool_choice_field="tool_choice",
            tool_choice_kinds=frozenset({"auto", "any", "none", "tool"}),
            forward_headers=_COMMON_HEADERS | {b"anthropic-version", b"anthropic-beta"},
        ),
        # OpenAI chat completions (copilot BYOK, COPILOT_PROVIDER_TYPE=openai).
        "copilot": Route(
            name="openai-chat-completions",
            engine="copilot",
            method=b"POST",
            path=b"/v1/chat/completions",
            queries=frozenset({None}),
            credential_header=b"authorization",
            credential_form=CREDENTIAL_BEARER,
            model_field="model",
            max_tokens_fields=("max_completion_tokens", "max_tokens"),
            choices_field="n",
            refused_fields=(),
            pinned_false_fields=("store",),
            stripped_fields=("web_search_options",),
            tools_field="tools",
            tool_kind_key="type",
            client_tool_kinds=frozenset({"function", "custom"}),
            tool_choice_field="tool_choice",
            tool_choice_kinds=frozenset({"auto", "none", "required", "function", "custom"}),
            forward_headers=_COMMON_HEADERS,
        ),
        # OpenAI Responses (codex, wire_api="responses").
        "codex": Route(
            name="openai-responses",
            engine="codex",
            method=b"POST",
            path=b"/v1/responses",
            queries=frozenset({None}),
            credential_header=b"authorization",
            credential_form=CREDENTIAL_BEARER,
            model_field="model",
            max_tokens_fields=("max_output_tokens",),
            choices_field=None,
            refused_fields=("previous_response_id", "conversation", "prompt"),
            pinned_false_fields=("store", "background"),
            stripped_fields=(),
            tools_field="tools",
            tool_kind_key="type",
            client_tool_kinds=frozenset({"function", "custom", "local_shell"}),
            tool_choice_field="tool_choice",
            tool_choice_kinds=frozenset({"auto", "none", "required", "function", "custom"}),
            forward_headers=_COMMON_HEADERS | {b"openai-beta"},
        ),
        # Gemini streamGenerateContent; the model is a path segment.
        "gemini": Route(
            name="gemini-stream-generate-content",
            engine="gemini",
            method=b"POST",
            path=b"/v1beta/models/{model}:streamGenerateContent",
            queries=frozenset({b"alt=sse"}),
            credential_header=b"x-goog-api-key",
            credential_form=CREDENTIAL_RAW,
            model_field=MODEL_IN_PATH,
            max_tokens_fields=("generationConfig.maxOutputTokens",),
            choices_field="generationConfig.candidateCount",
            refused_fields=("cachedContent",),
            pinned_false_fields=(),
            stripped_fields=(),
            tools_field="tools",
            tool_kind_key=None,
            client_tool_kinds=frozenset({"functionDeclarations"}),
            tool_choice_field=None,
            tool_choice_kinds=frozenset(),
            forward_headers=_COMMON_HEADERS,
        ),
    }
)


def route_for(engine: str) -> Route:
    """The route of ``engine``.

    Raises:
        ValueError: (configuration fault) an engine without a route.
    """
    try:
        return ROUTES[engine]
    except KeyError:
        raise ValueError(f"engine {engine!r} has no API-proxy route") from None
