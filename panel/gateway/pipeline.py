"""The gateway's one pipeline. Every request for an answer goes through these steps, in this order, whether a client
sent it to /v1/ (panel/gateway/app.py) or the panel itself did (Compare, an evaluation run, a shadow copy:
panel/gateway/panel_requests.py); the two front doors differ only in who they are (a team key or the team itself)
and in where the answer goes (`send`: the client's HTTP response, or the panel's reader).

1. route      the route's rules pick this request's channels (channels/rules.py)            -> usage `route_rule_id`
2. admit      the key's limits and the budgets: refused, or the request's most held (admission.py)
3. place      the canary split, the replicas' balance, the spill to the cloud: the order of the channels
4. translate  the API each channel is called in (apis.Passage): the channels this request can go to
5. answer     the first channel that answers within the route's deadline (attempts.first_success), relayed
              (responses.py); every attempt is a step of the request's trail
6. settle     the cost, counted against the limits and budgets once, then the usage row (exchange.py)

"Why did this request go to channel X": steps 1, 3 and 4, and the trail of step 5. "What did it cost": step 6
(`Exchange.settle`), the only place a request's money is set."""
import time
from dataclasses import dataclass, field

from django.conf import settings

from panel.channels import rules
from panel.gateway import admission, messages_api, token_count, tracing
from panel.gateway.apis import Passage
from panel.gateway.balancing import BALANCER
from panel.gateway.responses import error_body, plain_response, send_json, stream_response
from panel.gateway.sampling import SAMPLED_ENDPOINTS
from panel.gateway.spill import SPILL
from panel.gateway.translation import NotTranslatable

ANTHROPIC_ENDPOINTS = ("messages", "count_tokens")  # Anthropic's error shape


class Refusal(Exception):
    """A request the gateway answers itself, with an error in the client's API: `status`, `code` (the usage row's
    error kind), `kind` (OpenAI's error type) and headers (Retry-After)."""

    def __init__(self, status, message, *, code, kind="invalid_request_error", headers=()):
        super().__init__(message)
        self.status, self.code, self.kind, self.headers = status, code, kind, list(headers)


@dataclass(frozen=True)
class PanelKey:
    """Who the panel's own requests are: their team, without a key's limits. The team's and the tags' budgets
    apply to them as to a client's requests."""

    team_id: int
    id: None = None
    rpm_limit: int = 0
    tpm_limit: int = 0
    fit_to_budget: bool = False


@dataclass
class Call:
    """One request for an answer, as a front door hands it to the pipeline: `endpoint` is the client's API (chat,
    completions, messages, responses, embeddings, count_tokens), `body` its parsed body, `route` the route it names
    (channels/routing.RouteTargets; the panel's request to one channel gets a route of that channel), `key` the team
    key or a PanelKey. A client's request is a turn of an agent session and feeds the route's samples and shadow
    test; the panel's own (`client` False) are neither."""

    endpoint: str
    body: dict
    route: object
    key: object
    headers: list = field(default_factory=list)
    tags: list = field(default_factory=list)
    betas: str = ""
    client: bool = True


async def serve(call, exchange, send):
    """Answer `call` through every step, writing what happened into `exchange`; a refusal at any step is sent as
    the client's API's error."""
    try:
        await _steps(call, exchange, send)
    except Refusal as refusal:
        await refuse(send, exchange, refusal, call.endpoint)


async def refuse(send, exchange, refusal, endpoint):
    """Send `refusal` in the client's API and mark the request with it (a client that left gets nothing)."""
    exchange.fail(refusal.status, refusal.code, error=refusal)
    if refusal.status == 499:
        return
    payload = (messages_api.error_body(refusal.status, str(refusal)) if endpoint in ANTHROPIC_ENDPOINTS
               else error_body(str(refusal), kind=refusal.kind, code=refusal.code))
    await send_json(send, refusal.status, payload, headers=[*refusal.headers, *exchange.headers])


async def _steps(call, exchange, send):
    body, counting = call.body, call.endpoint == "count_tokens"
    exchange.route_id, exchange.route_name = call.route.route_id, call.route.model_name
    if counting:
        exchange.recorded = False  # a count, not a request for an answer: no usage record, nothing charged
    route = choose_route(call, exchange) if not counting else call.route
    # A count is admitted like any request (a key at its per-minute limit or with a spent budget cannot call the
    # provider through it), but it holds nothing and is no turn of a session.
    await admit(call, route, exchange, counting)
    if counting:
        await token_count.respond(exchange, route, body, send)
        return
    exchange.body = body  # its prompt is charged by estimate if the upstream reports no usage
    if settings.OTEL_ENDPOINT:
        exchange.trace_ids = tracing.trace_ids(call.headers)  # the client's trace continued, or a new one
        if call.endpoint in SAMPLED_ENDPOINTS:  # the team's text in its trace, if it lets it
            exchange.trace_text = await tracing.team_shares_text(call.key.team_id)
    if call.client and call.endpoint in SAMPLED_ENDPOINTS:
        exchange.sampling, exchange.shadow = route.sampling, route.shadow
    targets = await place(call, route, exchange)
    passage = Passage(call.endpoint, body, betas=call.betas)
    try:
        passage.choose(targets)
    except NotTranslatable as error:
        raise Refusal(400, str(error), code="not_translatable") from None
    respond = stream_response if passage.stream else plain_response
    await respond(exchange, route, passage, send)


def choose_route(call, exchange):
    """Step 1: the route as this request sees it: the first of its rules that matches picks its channels."""
    if not call.route.rules:
        return call.route
    facts = rules.request_facts(api=call.endpoint, body=call.body, headers=call.headers,
                                key_id=call.key.id)
    route, exchange.fields["route_rule_id"] = rules.route_for_request(call.route, facts)
    return route


async def admit(call, route, exchange, counting=False):
    """Step 2: the key's per-minute limits and the budgets; a request that may go holds its most against them."""
    admitted = await admission.admit(call.key, body=call.body, headers=call.headers,
                                     session=call.client and not counting, hold=not counting,
                                     channels=[entry.channel for entry in route.entries], tags=call.tags)
    exchange.reservation = admitted.reservation
    exchange.fitted = admitted.adapted()  # max_tokens set or lowered in the body to what a budget holds
    if admitted.rate_limited is not None:
        which, retry_after = admitted.rate_limited
        raise Refusal(429, f"this key's {which} limit is reached; retry in {retry_after} s",
                      code="rate_limit_exceeded", kind="rate_limit_error",
                      headers=[(b"retry-after", str(retry_after).encode())])
    if admitted.too_large is not None:  # waiting would not help: 400, not 429
        raise Refusal(400, admitted.too_large, code="tokens_per_minute_exceeded")
    if admitted.budget_spent is not None:  # 402: SDKs do not retry it, unlike 429
        raise Refusal(402, admitted.budget_spent, code="budget_exceeded", kind="insufficient_quota")
    if not counting:
        exchange.fields.update(admitted.session)  # a refused request is no turn of a session: it has none
        exchange.session_lookup = admitted.session_lookup


async def place(call, route, exchange):
    """Step 3: the channels in the order to try them: the canary's arm (written into the usage row), then the
    replicas' balance (the lease this request counts in flight on) and the spill past the local engines' wait."""
    targets, exchange.lease = await BALANCER.place(route, route.ordered(exchange.fields), body=call.body,
                                                   headers=call.headers, key_id=call.key.id,
                                                   request_id=exchange.request_id, trail=exchange.log["trail"],
                                                   api=call.endpoint)
    targets, exchange.lease = await SPILL.place(route, targets, lease=exchange.lease, request_id=exchange.request_id,
                                                fields=exchange.fields, trail=exchange.log["trail"])
    exchange.spill_watch = bool(route.spill_wait_ms)
    return targets


async def finish(exchange):
    """After the request ended, however it ended: its usage row, the replica it held given back, a spilling
    route's wait measured, and its spans when OpenTelemetry is on."""
    try:
        await exchange.finish()
    finally:
        await BALANCER.release(exchange.lease)
        if exchange.spill_watch:
            await _spill_observe(exchange)
        if settings.OTEL_ENDPOINT:
            tracing.request_ended(exchange)  # queued for the exporter's thread (tracing.py)


async def _spill_observe(exchange):
    """A spilling route's local engine answered: its time per request feeds the next requests' expected wait. A
    stream's is from its first token to its end (the wait for a batch slot comes before the first token); a whole
    answer's is its latency, a wait included."""
    target, fields = exchange.target, exchange.fields
    if target is None or target.batch_slots is None or fields["outcome"] != "ok" or fields["status_code"] != 200:
        return
    latency_ms = (time.perf_counter() - exchange.started) * 1000
    streamed = fields["stream"] and fields["ttft_ms"] is not None
    await SPILL.observe(target, latency_ms - fields["ttft_ms"] if streamed else latency_ms)
