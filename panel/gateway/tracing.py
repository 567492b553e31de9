"""A gateway request's trace, built after the fact from its Exchange (panel/gateway/exchange.py) once it ended:
one server span for the request, from its first byte in to its end, and one client span per step of its attempt
trail (each call of a channel, a wait for a sleeping engine), with their own times and outcomes. Attributes follow
OpenTelemetry's GenAI semantic conventions (gen_ai.*) plus the panel's own (tokenwise.*: team, key, route, channel,
cost, outcome). The request's text (gen_ai.input.messages, gen_ai.output.messages) is added only for a team whose
owner turned on "prompts in traces" (Team.trace_prompts), and never otherwise.

A client's W3C `traceparent` is continued: the request's span is a child of the client's span, in the client's
trace. The span's ids are chosen when the request arrives (TraceIds), so each call of the team's own engines (a
deployment, a vLLM pool) carries a `traceparent` naming it, and an engine that exports its own spans (vLLM's
--otlp-traces-endpoint) puts them under the gateway's request span. A cloud provider is sent none: it never joins the
team's trace.

The spans are handed to the SDK's batch processor, which exports them on its own thread: the request never waits
on the collector. With TOKENWISE_OTEL_ENDPOINT empty, none of this runs (pipeline.py checks the setting)."""
import json
import logging
import random
import re
import time
from typing import NamedTuple
from urllib.parse import urlsplit

from django.conf import settings

from panel.accounts.models import Team
from panel.gateway.sampling import SAMPLED_ENDPOINTS, conversation_of

# gen_ai.operation.name by the client's API; the panel's own requests (Compare, evaluations, shadows) are chat.
OPERATIONS = {"completions": "text_completion", "embeddings": "embeddings"}
REQUEST_PARAMETERS = {"max_tokens": "gen_ai.request.max_tokens", "max_completion_tokens": "gen_ai.request.max_tokens",
                      "max_output_tokens": "gen_ai.request.max_tokens", "temperature": "gen_ai.request.temperature",
                      "top_p": "gen_ai.request.top_p", "top_k": "gen_ai.request.top_k", "seed": "gen_ai.request.seed"}
USAGE = {"prompt_tokens": "gen_ai.usage.input_tokens", "completion_tokens": "gen_ai.usage.output_tokens",
         "cached_tokens": "gen_ai.usage.cache_read.input_tokens",
         "cache_write_tokens": "gen_ai.usage.cache_creation.input_tokens",
         "reasoning_tokens": "gen_ai.usage.reasoning.output_tokens"}

log = logging.getLogger(__name__)

_shares_text = {}  # team id -> (until, Team.trace_prompts), kept as long as the gateway keeps a key


async def team_shares_text(team_id):
    """Whether the team lets its prompts and answers into its traces (read again after KEY_CACHE_SECONDS)."""
    cached = _shares_text.get(team_id)
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    try:
        shares = bool(await Team.objects.filter(pk=team_id).values_list("trace_prompts", flat=True).afirst())
    except Exception as error:  # the trace goes without text; the request goes on
        log.warning("prompts in traces: team %s not read (%s); its trace has no text", team_id, type(error).__name__)
        return False
    _shares_text[team_id] = (time.monotonic() + settings.KEY_CACHE_SECONDS, shares)
    return shares


# W3C Trace Context: version-trace id-parent id-flags; a later version may add fields after the flags.
TRACEPARENT_RE = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
TRACESTATE_MAX_CHARS = 512  # the spec's limit for what a vendor must pass on


class TraceIds(NamedTuple):
    """The ids of a request's span, chosen as it arrives: in the trace a valid client traceparent named (its span
    the parent) or in a new trace."""

    trace_id: int
    span_id: int
    parent_span_id: int | None
    flags: int
    tracestate: str


def trace_ids(headers):
    """TraceIds for a request's ASGI headers. A traceparent is continued when valid: version 00 with nothing after
    the flags, or a later version (read as 00; never ff), ids not all zeros. Otherwise a new, sampled trace."""
    given, state = "", ""
    for name, value in headers:
        if name == b"traceparent":
            given = value.decode("latin-1").strip().lower()
        elif name == b"tracestate":
            state = value.decode("latin-1").strip()
    span_id = random.getrandbits(64) or 1
    match = TRACEPARENT_RE.match(given)
    if match and match[1] != "ff" and (match[1] != "00" or match[5] is None):
        trace, parent = int(match[2], 16), int(match[3], 16)
        if trace and parent:
            return TraceIds(trace, span_id, parent, int(match[4], 16), state[:TRACESTATE_MAX_CHARS])
    return TraceIds(random.getrandbits(128) or 1, span_id, None, 1, "")


def engine_headers(exchange, target):
    """The trace context for a call of `target`: to the team's own engines only (a deployment, a vLLM pool), and only
    while OpenTelemetry is on."""
    ids = exchange.trace_ids
    if ids is None or not (target.channel.is_local or target.channel.is_pool):
        return {}
    headers = {"traceparent": f"00-{ids.trace_id:032x}-{ids.span_id:016x}-{ids.flags:02x}"}
    if ids.tracestate:
        headers["tracestate"] = ids.tracestate
    return headers


class Span(NamedTuple):
    """What one span says, before the SDK makes it (panel/gateway/otlp.py)."""

    name: str
    start_ns: int
    end_ns: int
    attributes: dict
    error: str | None  # the span's error status, or None when it went well


def request_ended(exchange):
    """Build the ended request's spans and queue them for export. A request that asks for no answer (a model
    listing, a token count) has no usage row and no span either."""
    if not exchange.recorded:
        return
    from panel.gateway import otlp  # the SDK and its exporters are loaded only when OpenTelemetry is on

    try:
        request, attempts = spans_of(exchange)
        otlp.exporters().emit(request, attempts, exchange.trace_ids)
    except Exception:  # a trace that cannot be made is lost, never the request's end (its usage row is written)
        log.exception("request %s: its spans were not made", exchange.request_id)


def spans_of(exchange, now_perf=None, now_ns=None):
    """The request's span and its attempts' spans, with wall-clock times from the perf_counter ones."""
    now_perf, now_ns = now_perf or time.perf_counter(), now_ns or time.time_ns()

    def wall(perf):
        return now_ns - int((now_perf - perf) * 1e9)

    fields = exchange.fields
    operation = OPERATIONS.get(fields["endpoint"], "chat")
    attributes = request_attributes(exchange, operation)
    if exchange.trace_text:
        attributes.update(text_attributes(exchange))
    failed = fields["outcome"] != "ok" or fields["status_code"] >= 400
    request = Span(f"{operation} {fields['model']}".strip(), wall(exchange.started), now_ns, attributes,
                   f"{fields['outcome']} {fields['error_kind']}".strip() if failed else None)
    attempts = [Span(f"{operation} {target.model_id}", wall(began), wall(ended),
                     attempt_attributes(entry, target, operation),
                     entry["outcome"] if entry["outcome"] != "ok" else None)
                for entry, target, began, ended in exchange.log.get("times", ())]
    return request, attempts


def request_attributes(exchange, operation):
    fields, channel, key = exchange.fields, exchange.channel, exchange.key
    attributes = {
        "gen_ai.operation.name": operation, "gen_ai.provider.name": "tokenwise",
        "gen_ai.request.model": fields["model"], "gen_ai.request.stream": bool(fields["stream"]),
        "http.response.status_code": fields["status_code"],
        "tokenwise.request.id": exchange.request_id, "tokenwise.endpoint": fields["endpoint"],
        "tokenwise.outcome": fields["outcome"], "tokenwise.cost": float(fields.get("cost") or 0),
        "tokenwise.attempts": exchange.log["attempts"], "tokenwise.fell_back": exchange.log["fell_back"],
        "tokenwise.route.name": exchange.route_name,
    }
    optional = {"tokenwise.team.id": exchange.owner_team_id, "tokenwise.key.id": key.id if key else None,
                "tokenwise.route.id": exchange.route_id, "tokenwise.route.rule.id": fields.get("route_rule_id"),
                "tokenwise.channel.id": channel.id if channel else None,
                "tokenwise.channel.name": channel.name if channel else None,
                "gen_ai.response.model": exchange.target.model_id if exchange.target else None,
                "gen_ai.conversation.id": fields.get("session_id"),
                "tokenwise.tokens_estimated": fields.get("tokens_estimated"),
                "error.type": fields["error_kind"] or None}
    if fields["ttft_ms"] is not None:
        optional["gen_ai.response.time_to_first_chunk"] = fields["ttft_ms"] / 1000
    for name, attribute in USAGE.items():
        optional[attribute] = fields.get(name)
    body = exchange.body if isinstance(exchange.body, dict) else {}
    for name, attribute in REQUEST_PARAMETERS.items():
        value = body.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            optional[attribute] = value
    attributes.update((name, value) for name, value in optional.items() if value not in (None, ""))
    return attributes


def attempt_attributes(entry, target, operation):
    address = urlsplit(target.base_url)
    attributes = {"gen_ai.operation.name": operation, "gen_ai.request.model": target.model_id,
                  "tokenwise.channel.id": target.id, "tokenwise.channel.name": target.name,
                  "tokenwise.attempt.outcome": entry["outcome"]}
    if target.batch_slots is not None or target.loopback_ok:
        attributes["gen_ai.provider.name"] = "vllm"  # a local engine
    if address.hostname:
        attributes["server.address"] = address.hostname
        attributes["server.port"] = address.port or (443 if address.scheme == "https" else 80)
    if entry["status"] is not None:
        attributes["http.response.status_code"] = entry["status"]
    if entry["outcome"] != "ok":
        attributes["error.type"] = entry["outcome"]
    return attributes


def text_attributes(exchange):
    """The prompt and the answer, as the GenAI conventions write messages (a role and its parts)."""
    endpoint = exchange.fields["endpoint"]
    api = endpoint if endpoint in SAMPLED_ENDPOINTS else "chat"
    attributes = {}
    if isinstance(exchange.body, dict):
        attributes["gen_ai.input.messages"] = json.dumps(
            [{"role": message["role"], "parts": [{"type": "text", "content": message["content"]}]}
             for message in conversation_of(api, exchange.body)])
    answer = "".join(exchange.answer_parts)
    if answer:
        attributes["gen_ai.output.messages"] = json.dumps(
            [{"role": "assistant", "parts": [{"type": "text", "content": answer}]}])
    return attributes
