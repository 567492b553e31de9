"""One gateway request's facts (Compare's too), turned into its one usage record and, when it failed or was
refused, one log line."""
import asyncio
import logging
import secrets
import time
from decimal import Decimal

from panel.budgets import enforcement as budgets
from panel.channels.rules import input_token_estimate
from panel.core import redis_client
from panel.gateway import admission, metrics, rate_limits, sampling
from panel.gateway.apis import adapted_header, openai_usage
from panel.usage import tags as request_tags
from panel.usage import writer as usage_writer
from panel.usage.models import PLACEMENT_STEPS

log = logging.getLogger("panel.gateway")

# The record's outcome for an upstream error kind; every other failure is "error".
OUTCOME_FOR_KIND = {"stalled": "upstream_stalled", "cut": "upstream_cut", "client_closed": "client_closed",
                    "client_stalled": "client_closed"}


def cost_of(target, prompt, completion, cached, cache_write=0, tool_calls=0):
    return Decimal(0) if target is None else target.channel.cost(prompt, completion, cached, cache_write, tool_calls)


def new_request_id():
    return "req_" + secrets.token_hex(12)


class Exchange:
    """One request's facts, turned into its one usage record."""

    def __init__(self, endpoint, started):
        self.started = started
        self.request_id = new_request_id()
        self.fields = {"endpoint": endpoint, "model": "", "stream": False, "status_code": 200, "outcome": "ok",
                       "error_kind": "", "prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0,
                       "cache_write_tokens": None, "reasoning_tokens": None, "server_tool_calls": None,
                       "ttft_ms": None, "json_requested": False, "json_valid": None}
        self.log = {"attempts": 0, "fell_back": False, "rate_limited": 0, "trail": [], "current": None}
        self.key = None
        self.team_id = None  # for a request made inside the panel (Compare), which has no key
        self.route_id = None
        self.route_name = ""
        self.target = None
        # The model name is one this installation serves (a route the gateway found, a Compare column): only then
        # does it label the metrics, so names a client makes up cannot grow the label set.
        self.model_served = True
        self.recorded = True  # False for what is not a request for an answer (GET /v1/models)
        self.responded = False  # the whole response has been sent
        self.client_stopped_reading = False  # its connection was dropped for it (relay.ClientSend)
        self.settled = False
        # What the request is charged when the upstream reports no usage (a client that left before the usage
        # chunk, a channel that sends none): the prompt's estimate from the body's text (panel/channels/rules.py,
        # worked out only then) and one token per content piece relayed to the client.
        self.body = None
        self.pieces = 0
        self.reservation = None  # what the request holds against its budgets until it is settled
        self.tags = None  # the request's tags as stored ("|a|b|"): their budgets count it too
        # The session lookup of a request admitted without a Redis call (gateway/admission.py), done with its count
        self.session_lookup = None
        self.counting = None  # the count (and that lookup) under way, shielded from a client that leaves
        self.adapted = []  # what the gateway changed in the request for the channel that answered (apis.Passage)
        self.fitted = []  # what admission changed for every channel (max_tokens fitted to a budget)
        self.sampling = None  # the route's SamplePlan when it keeps samples
        self.shadow = None  # the route's ShadowPlan when a shadow test runs on it
        self.answer_parts = []  # the answer's text, collected for a sample or a shadow test only
        self.trace_text = False  # the team lets its prompts and answers into its trace (gateway/tracing.py)
        self.trace_ids = None  # its span's ids, while OpenTelemetry is on (tracing.TraceIds)
        self.spill_watch = False  # the route spills on overload: an engine's answer times its requests
        self.error = None  # what ended the request when it failed (`fail`)
        self.lease = None  # the replica this request counts in flight on (gateway/balancing.py), given back at its end

    @property
    def owner_team_id(self):
        """The team the request is made for: its key's, or the panel's own request's."""
        return self.key.team_id if self.key is not None else self.team_id

    @property
    def headers(self):
        return [(b"x-request-id", self.request_id.encode()), *adapted_header(self.fitted + self.adapted)]

    @property
    def channel(self):
        """The channel that answered or, when none did, the last one called."""
        return self.target or self.log["current"]

    def usage_from(self, data):
        """The usage of a chat or completions chunk, where it carries one."""
        usage_data = data.get("usage") if isinstance(data, dict) else None
        if isinstance(usage_data, dict):
            self.fields.update(openai_usage(usage_data))

    def take_usage(self, usage):
        """The usage fields of an answer in any API (panel/gateway/apis.py turns each into these names)."""
        self.fields.update(usage)

    def fail(self, status, kind, outcome=None, error=None):
        """The request failed: its status, its outcome and error kind on the usage row; `error` (an UpstreamError or
        the gateway's Refusal) is kept for the panel's own requests, whose pages word it (channels/diagnosis.py)."""
        self.fields.update(status_code=status, outcome=outcome or OUTCOME_FOR_KIND.get(kind, "error"),
                           error_kind=kind[:40])
        self.error = error

    @property
    def keeps_answer(self):
        return self.sampling is not None or self.shadow is not None or self.trace_text

    def content_arrived(self, text=""):
        """One content piece of a stream is on its way to the client (its text is kept for a sample or a shadow
        test only)."""
        if text and self.keeps_answer:
            self.answer_parts.append(text)
        self.contents_arrived(1)

    def contents_arrived(self, count):
        """`count` content pieces of a stream, whose text is not kept, are on their way to the client (the first
        one's time is the request's TTFT)."""
        self.pieces += count
        if self.fields["ttft_ms"] is None and count:
            self.fields["ttft_ms"] = (time.perf_counter() - self.started) * 1000

    def estimate_missing_usage(self):
        """Fill in the figures the upstream did not report, and say which ones are estimated. The prompt is charged
        once an upstream has read it: it answered (a stream cut later, a channel without usage), or the client left
        while it was being called; a request every channel refused (or that left during a retry's wait) is not."""
        fields = self.fields
        estimated = []
        upstream_read_it = self.target is not None or (fields["outcome"] == "client_closed"
                                                       and self.attempt_in_flight())
        if not fields["prompt_tokens"] and self.body is not None and upstream_read_it:
            fields["prompt_tokens"] = input_token_estimate(self.body)
            estimated.append("prompt")
        if not fields["completion_tokens"] and self.pieces:
            fields["completion_tokens"] = self.pieces
            estimated.append("completion")
        fields["tokens_estimated"] = "+".join(estimated) or None

    def attempt_in_flight(self):
        """An upstream call was under way (started, not ended) when the request ended: every attempt ended adds a
        step to the trail; a channel skipped as misconfigured adds one without an attempt."""
        ended = sum(1 for step in self.log["trail"]
                    if step["outcome"] != "misconfigured" and step["outcome"] not in PLACEMENT_STEPS)
        return self.log["attempts"] > ended

    def client_left(self):
        """The client went away before the whole answer was sent: nothing more is done for it. A request that had
        already failed (a stream cut, its error event sent) keeps that outcome: the client left because of it."""
        if not self.responded and self.fields["outcome"] == "ok":
            self.fail(499, "client_stalled" if self.client_stopped_reading else "client_closed")

    def client_stalled(self):
        """The client stopped reading, and the gateway dropped its connection (relay.ClientSend)."""
        self.client_stopped_reading = True

    async def settle(self):
        """Price the request and count it against its key's token rate and budgets, once. Called before the last
        byte goes out, so the client's next request is judged with this one counted."""
        if self.settled:
            return
        self.settled = True
        self.estimate_missing_usage()
        fields = self.fields
        fields["cost"] = cost_of(self.channel, fields["prompt_tokens"], fields["completion_tokens"],
                                 fields["cached_tokens"], fields["cache_write_tokens"] or 0,
                                 fields["server_tool_calls"] or 0)
        if self.key is not None or self.team_id is not None:
            # Shielded: a client that leaves mid-count does not undo it (the relay is cancelled, the count is not).
            session, self.session_lookup = self.session_lookup, None
            self.counting = asyncio.ensure_future(count_against_limits(
                self.key, fields["cost"], fields["prompt_tokens"] + fields["completion_tokens"], team_id=self.team_id,
                reservation=self.reservation, tags=self.tags, session=session))
            fields.update(await asyncio.shield(self.counting))
            self.counting = None

    async def finish(self):
        try:
            await self.settle()  # a request that ended without an answer (an error, a client that left)
        finally:
            if self.counting is not None:  # the client left while it was counted: its session fields, when done
                self.fields.update(await admission.session_fields(self.counting))
            self.record()

    def record(self):
        if not self.recorded:
            return
        fields = dict(self.fields)
        fields["latency_ms"] = (time.perf_counter() - self.started) * 1000
        channel = self.channel
        usage_writer.record(team_id=self.owner_team_id,
                            key_id=self.key.id if self.key else None, route_id=self.route_id,
                            channel_id=channel.id if channel else None, attempts=self.log["attempts"],
                            rate_limited_attempts=self.log["rate_limited"], fell_back=self.log["fell_back"],
                            attempt_trail=self.log["trail"], request_id=self.request_id, **fields)
        metrics.gateway_request_observe(fields=fields, fell_back=self.log["fell_back"], refused=not self.model_served,
                                        trail=self.log["trail"])
        if self.sampling is not None and self.responded and fields["outcome"] == "ok" and fields["status_code"] == 200:
            self.sample(channel)
        if fields["outcome"] != "ok" or fields["status_code"] >= 400:
            log.warning("gateway request %s failed: key …%s route %s channel %s status %s outcome %s %s %.0f ms",
                        self.request_id, self.key.last4 if self.key else "-", self.route_name or "-",
                        channel.name if channel else "-", fields["status_code"], fields["outcome"],
                        fields["error_kind"] or "-", fields["latency_ms"])


    def sample(self, channel):
        """Hand the answered request to the usage writer's thread, which keeps it if the route's day has room."""
        endpoint, body = self.fields["endpoint"], self.body
        usage_writer.record_sample(plan=self.sampling, conversation=lambda: sampling.conversation_of(endpoint, body),
                                   answer="".join(self.answer_parts), channel_id=channel.id if channel else None,
                                   request_id=self.request_id, endpoint=endpoint, model=self.fields["model"],
                                   json_requested=self.fields["json_requested"])


async def count_against_limits(key, cost, tokens, *, team_id=None, reservation=None, tags=None, session=None):
    """Add a request's tokens to its key's per-minute window and its cost and tokens to the budget counters (its
    team's, its key's and its tags'; a request made inside the panel, without a key, to its team's), releasing what
    it held against them, and look up its agent session (`session`, admission's SessionLookup, when it was not looked
    up at admission): one round trip to Redis. Returns the usage row's session fields."""
    calls, counted = [], None
    try:
        calls += rate_limits.token_commands(key, tokens, reservation) if key is not None else []
        window = len(calls)
        counted = budgets.counting(key, cost, tokens, team_id=team_id, reservation=reservation,
                                   tags=request_tags.tags_read(tags))
        if counted is not None:
            calls.append(counted.call)
        asked = session.call() if session is not None else None
        if asked is not None:
            calls.append(asked)
        results = await redis_client.together(calls) if calls else []
    except Exception as error:  # a Redis outage must not turn a good answer into an error
        log.warning("request not counted against the limits of key %s / team %s (%s); the budget reconciliation "
                    "catches up", key.id if key else "-", team_id, type(error).__name__)
        if session is not None:
            session.fields(error)  # logged: the row goes without its session
        return {}
    answer = results[window] if counted is not None else None
    if isinstance(answer, Exception):
        counted.failed(answer)
    elif counted is not None:
        try:
            await counted.done(answer)
        except Exception as error:  # noqa: BLE001 - the notices and what the channels learn wait for the next request
            log.warning("budget notices of team %s not raised (%s)", team_id, type(error).__name__)
    return session.fields(results[-1]) if asked is not None else {}
