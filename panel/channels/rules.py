"""Routing rules: conditions on a request, tried in order before a route's own channels; the first rule whose every
set condition holds sends the request to its own ordered channels, and no match leaves the route's list.

The gateway builds one `RequestFacts` per request with `request_facts` (it reads an OpenAI chat or completions body
and an Anthropic Messages body alike) and asks `first_match` over the route's cached rules. The page and the API
change rules through `rule_save`, `rule_delete` and `rules_reorder`, which check everything first and write nothing
on an error."""
import json
import re
from dataclasses import dataclass

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count, Max, Sum
from django.utils import timezone

from panel.channels.models import RouteRule, RouteRuleChannel, RuleApi, RuleTools
from panel.channels.routing import routing_changed
from panel.core.money import money
from panel.usage.models import RequestLog

CHARS_PER_TOKEN = 4  # the usual rule of thumb for English text and code with BPE tokenizers
MESSAGE_OVERHEAD_TOKENS = 4  # the chat template's role markers around each message
TOKEN_LIMIT = 10_000_000
HEADER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,99}$")
# Never matched on: a rule stored in the database must not hold or probe a credential.
SECRET_HEADERS = frozenset({"authorization", "x-api-key", "cookie", "proxy-authorization"})
# Keys whose values are not text the model reads as tokens (images, audio, files as base64; the role and block
# type, which the per-message overhead covers).
_NOT_TEXT = frozenset({"image_url", "source", "data", "input_audio", "file", "cache_control", "role", "type"})


@dataclass(frozen=True)
class RequestFacts:
    """What a rule may look at: the API used, an estimate of the input tokens, whether the request offers tools,
    its headers (lower-case names) and the key's id. Never the prompt."""

    api: str
    input_tokens: int
    has_tools: bool
    headers: dict
    key_id: int | None = None


def _text_chars(value):
    """The characters of every string in a JSON value, image and file payloads left out."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(_text_chars(item) for item in value)
    if isinstance(value, dict):
        return sum(_text_chars(item) for name, item in value.items() if name not in _NOT_TEXT)
    return 0


def input_token_estimate(body):
    """The input tokens of a request, estimated without a tokenizer: the characters of its text (system, messages,
    prompt, tools) / 4, plus a few tokens per message. Within about 20% of a real tokenizer for English and code,
    which is what a threshold such as "under 4,000 tokens" needs, and it costs microseconds."""
    chars = 0
    messages = body.get("messages")
    if isinstance(messages, list):
        chars += _text_chars(messages)
    for name in ("system", "prompt", "input", "instructions", "tools", "functions"):
        chars += _text_chars(body.get(name))
    overhead = MESSAGE_OVERHEAD_TOKENS * len(messages) if isinstance(messages, list) else 0
    return (chars + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN + overhead


def _header_dict(headers):
    if isinstance(headers, dict):
        return {str(name).lower(): str(value) for name, value in headers.items()}
    found = {}
    for name, value in headers or ():
        name = name.decode("latin-1") if isinstance(name, bytes) else str(name)
        value = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        found.setdefault(name.lower(), value.strip())
    return found


def request_facts(*, api, body, headers=(), key_id=None):
    """The facts of one request. `body` is a parsed JSON object: OpenAI chat (`messages`, `tools`), completions
    (`prompt`), Responses (`input`, `tools`) or Anthropic Messages (`system`, `messages`, `tools`); `headers` are the
    ASGI (name, value) byte pairs or a dict."""
    tools = body.get("tools") or body.get("functions")
    return RequestFacts(api=api, input_tokens=input_token_estimate(body), has_tools=bool(tools),
                        headers=_header_dict(headers), key_id=key_id)


def matches(rule, facts):
    """Whether every condition the rule sets holds for these facts. `rule` is a RouteRule or its cached copy."""
    if rule.api and rule.api != facts.api:
        return False
    if rule.tokens_under is not None and not facts.input_tokens < rule.tokens_under:
        return False
    if rule.tokens_over is not None and not facts.input_tokens > rule.tokens_over:
        return False
    if rule.tools == RuleTools.WITH and not facts.has_tools:
        return False
    if rule.tools == RuleTools.WITHOUT and facts.has_tools:
        return False
    if rule.header_name and facts.headers.get(rule.header_name) != rule.header_value:
        return False
    if rule.key_id is not None and rule.key_id != facts.key_id:
        return False
    return True


def first_match(rules, facts):
    """The first rule (in the given order) that matches, or None: the route's own channels."""
    return next((rule for rule in rules if matches(rule, facts)), None)


def route_for_request(route, facts):
    """(the RouteTargets to try, the id of the rule that chose them or None) for one request on a cached route."""
    rule = first_match(route.rules, facts)
    return (route, None) if rule is None else (route.with_rule(rule), rule.id)


# ------------------------------------------------------------------------------------------------- trying

SAMPLE_MAX_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Trial:
    """A rule tried on a sample request: the request's facts, each condition the rule sets with whether it holds,
    the earlier rules of the route that would take the request first, and where the request would go."""

    facts: RequestFacts
    conditions: list  # [(the condition in words, holds, what the request has)]
    matches: bool
    taken_by: list  # names of earlier rules that match the sample first
    goes_to: str


def explain(rule, facts):
    """[(condition, holds, the request's side)] for every condition the rule sets, in the order `matches` checks."""
    rows = []
    if rule.api:
        rows.append((f"API is {RuleApi(rule.api).label}", rule.api == facts.api, RuleApi(facts.api).label))
    estimate = f"about {facts.input_tokens:,} input tokens"
    if rule.tokens_under is not None:
        rows.append((f"under {rule.tokens_under:,} input tokens", facts.input_tokens < rule.tokens_under, estimate))
    if rule.tokens_over is not None:
        rows.append((f"over {rule.tokens_over:,} input tokens", facts.input_tokens > rule.tokens_over, estimate))
    if rule.tools:
        has = "has tools" if facts.has_tools else "has no tools"
        rows.append(("has tools" if rule.tools == RuleTools.WITH else "has no tools",
                     facts.has_tools == (rule.tools == RuleTools.WITH), has))
    if rule.header_name:
        value = facts.headers.get(rule.header_name)
        rows.append((f"header {rule.header_name} = {rule.header_value!r}", value == rule.header_value,
                     f"{rule.header_name}: {value!r}" if value is not None else f"no {rule.header_name} header"))
    if rule.key_id is not None:
        rows.append((f"key {rule.key.name}", rule.key_id == facts.key_id, "that key" if rule.key_id == facts.key_id
                     else "another key" if facts.key_id else "no key chosen"))
    return rows


def sample_parse(*, body_text, headers_text):
    """The sample request's JSON body and its headers ("name: value" per line). Raises ValidationError, by field,
    for a body that is not a JSON object or a header line without a colon."""
    errors = {}
    body = None
    if len(body_text.encode()) > SAMPLE_MAX_BYTES:
        errors["sample"] = [f"The sample is over {SAMPLE_MAX_BYTES // 1024} KiB."]
    else:
        try:
            body = json.loads(body_text)
        except ValueError as error:
            errors["sample"] = [f"The sample is not JSON: {error}."]
        else:
            if not isinstance(body, dict):
                errors["sample"] = ["The sample is a request body: a JSON object, such as {\"messages\": [...]}."]
    headers = {}
    for number, line in enumerate(headers_text.splitlines(), start=1):
        if not line.strip():
            continue
        name, colon, value = line.partition(":")
        if not colon or not HEADER_NAME_RE.match(name.strip()):
            errors["sample_headers"] = [f"Line {number} is not a header: write it as name: value."]
            break
        headers[name.strip().lower()] = value.strip()
    if errors:
        raise ValidationError(errors)
    return body, headers


def rule_try(*, route, rule, facts):
    """How `rule` (saved or not: a RouteRule with its fields set, and its channels in `rule.tried_channels`) treats
    a request with these facts on `route`: its conditions one by one, the earlier rules that would win, and where
    the request would go. Writes nothing."""
    earlier = [other for other in route.rules.all() if rule.pk is None or other.position < rule.position]
    earlier = [other for other in earlier if other.pk != rule.pk]
    taken_by = [other.name for other in earlier if matches(other, facts)]
    hit = matches(rule, facts)
    if taken_by:
        goes_to = f"the rule {taken_by[0]}'s channels (it comes first)"
    elif hit:
        goes_to = "this rule's channels: " + (", ".join(channel.name for channel in rule.tried_channels) or "none")
    else:
        later = next((other.name for other in route.rules.all()
                      if other.pk != rule.pk and rule.pk is not None and other.position > rule.position
                      and matches(other, facts)), None)
        goes_to = f"the rule {later}'s channels" if later else "the route's own channels"
    return Trial(facts=facts, conditions=explain(rule, facts), matches=hit, taken_by=taken_by, goes_to=goes_to)


# ------------------------------------------------------------------------------------------------- changes

def _whole(value):
    return isinstance(value, int) and not isinstance(value, bool)


def rule_check(*, route, name, tokens_under, tokens_over, tools, header_name, header_value, key, api, channels):
    """Every problem with a rule, by field ({} when it can be saved)."""
    errors = {}

    def add(field, message):
        errors.setdefault(field, []).append(message)

    if not isinstance(name, str) or not name.strip() or len(name) > 100:
        add("name", "Give the rule a name (100 characters at most), e.g. \"short tool calls\".")
    for field, value in (("tokens_under", tokens_under), ("tokens_over", tokens_over)):
        if value is not None and not (_whole(value) and 1 <= value <= TOKEN_LIMIT):
            add(field, f"A whole number of tokens from 1 to {TOKEN_LIMIT:,}.")
    if (_whole(tokens_under) and _whole(tokens_over) and "tokens_under" not in errors
            and "tokens_over" not in errors and tokens_under <= tokens_over + 1):
        add("tokens_under", f"No estimate is both over {tokens_over:,} and under {tokens_under:,}: raise the upper "
                            "limit or lower the other.")
    if tools not in RuleTools.values:
        add("tools", "Choose either, has tools or has no tools.")
    if api not in ("", *RuleApi.values):
        add("api", "Choose one of " + ", ".join(RuleApi.values) + ", or any.")
    header_name = header_name or ""
    header_value = header_value or ""
    if header_name:
        if not HEADER_NAME_RE.match(header_name):
            add("header_name", "A header name is letters, digits, - and _ (100 characters at most).")
        elif header_name.lower() in SECRET_HEADERS:
            add("header_name", f"{header_name} carries a credential: a rule cannot match on it.")
        if not header_value:
            add("header_value", "Give the value the header must have.")
        elif len(header_value) > 300 or any(not 32 <= ord(char) < 127 for char in header_value):
            add("header_value", "The value is printable ASCII, 300 characters at most.")
    elif header_value:
        add("header_name", "Name the header whose value this is.")
    if key is not None and key.team_id != route.team_id:
        add("key", "A key of another team cannot be used.")
    if not (tokens_under is not None or tokens_over is not None or tools or header_name or key is not None or api):
        add("__all__", "Set at least one condition: a rule without one would take every request (the route's own "
                       "channels already do).")
    channels = list(channels or ())
    if not channels:
        add("channels", "Pick at least one channel for the rule.")
    elif any(channel.team_id != route.team_id for channel in channels):
        add("channels", "A channel of another team cannot be used.")
    elif len({channel.pk for channel in channels}) != len(channels):
        add("channels", "A channel appears twice.")
    return errors


@transaction.atomic
def rule_save(*, route, rule=None, name, tokens_under=None, tokens_over=None, tools="", header_name="",
              header_value="", key=None, api="", channels=()):
    """Create (rule=None, placed last) or replace a rule of a route. `channels` are Channel rows in the order they
    are tried. ValidationError with every problem, by field, and nothing written when something is wrong."""
    channels = list(channels)
    errors = rule_check(route=route, name=name, tokens_under=tokens_under, tokens_over=tokens_over, tools=tools,
                        header_name=header_name, header_value=header_value, key=key, api=api, channels=channels)
    if rule is not None and rule.route_id != route.pk:
        errors.setdefault("__all__", []).append("This rule belongs to another route.")
    if errors:
        raise ValidationError(errors)
    if rule is None:
        last = route.rules.aggregate(last=Max("position"))["last"]
        rule = RouteRule(route=route, position=0 if last is None else last + 1)
    rule.name, rule.tokens_under, rule.tokens_over, rule.tools = name.strip(), tokens_under, tokens_over, tools
    rule.header_name, rule.header_value = (header_name or "").lower(), header_value or ""
    rule.key, rule.api = key, api
    rule.save()
    rule.routerulechannel_set.all().delete()
    RouteRuleChannel.objects.bulk_create([RouteRuleChannel(rule=rule, channel=channel, position=position)
                                          for position, channel in enumerate(channels)])
    routing_changed(route.team_id)
    return rule


@transaction.atomic
def rule_delete(*, rule):
    team_id = rule.route.team_id
    rule.delete()
    routing_changed(team_id)


@transaction.atomic
def rules_reorder(*, route, rule_ids):
    """Put the route's rules in this order; `rule_ids` must name each of them once."""
    current = {rule.pk: rule for rule in route.rules.select_for_update()}
    if sorted(rule_ids) != sorted(current) or len(set(rule_ids)) != len(rule_ids):
        raise ValidationError({"order": ["Name every rule of this route once."]})
    for position, rule_id in enumerate(rule_ids):
        RouteRule.objects.filter(pk=rule_id).update(position=position)
    routing_changed(route.team_id)


@transaction.atomic
def rule_move(*, rule, offset):
    """Move a rule up (offset -1) or down (+1) one place."""
    ids = list(rule.route.rules.order_by("position", "pk").values_list("pk", flat=True))
    index = ids.index(rule.pk)
    target = min(max(index + offset, 0), len(ids) - 1)
    ids.insert(target, ids.pop(index))
    rules_reorder(route=rule.route, rule_ids=ids)


def rule_traffic(route, *, since=None):
    """This month's requests, tokens and cost of a route by the rule that took them ([] rows, the route's own list
    last as rule None): what the route page's table shows."""
    if since is None:
        since = timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    totals = {row["route_rule"]: row for row in RequestLog.objects.filter(route=route, created_at__gte=since)
              .values("route_rule").annotate(requests=Count("id"), input_tokens=Sum("prompt_tokens"),
                                             output_tokens=Sum("completion_tokens"), cost=Sum("cost"))}
    rows = []
    for rule in [*route.rules.select_related("key").order_by("position", "pk"), None]:
        found = totals.get(rule.pk if rule else None, {})
        rows.append({"rule": rule, "name": rule.name if rule else "No rule matched (the route's own channels)",
                     "requests": found.get("requests", 0), "input_tokens": found.get("input_tokens") or 0,
                     "output_tokens": found.get("output_tokens") or 0, "cost": money(found.get("cost") or 0)})
    return rows
