"""Samples of a route's real traffic, kept as evaluation material when the route opts in (off by default).

A route that keeps samples (`Route.samples_per_day` > 0) gives the gateway a SamplePlan with its routing. The gateway
collects the answer's text of each answered request on that route and hands the draft to the usage writer's thread
(`usage.writer.record_sample`), off the request's path. There `sample_keep` decides, redacts, encrypts and stores:

- Spread over the day: at most `per_day` samples a UTC day, and never more than the day's share so far plus one
  hour's share (a Redis counter per route and day), so a busy morning cannot use up the day and a quiet morning's
  share carries over to the afternoon. Redis unreachable: nothing is kept (a sample is never worth a request).
- Redacted before anything is stored: the built-in patterns below (e-mail addresses, secrets that look like API keys
  or bearer tokens, long digit runs such as card or phone numbers), then the team's own regular expressions (run by
  RE2, without backtracking, through panel/core/regexes.py), each match replaced by "[redacted]" in every message
  and in the answer. A team's pattern that no longer compiles (saved before RE2 refused it) keeps nothing.
- Encrypted with the panel's key (panel/core/crypto.py), conversation and answer together; only the team's pages
  decrypt it. Deleted after the route's retention (`samples_expire`, hourly on beat; a shorter retention applies at
  the next run).

A conversation longer than MAX_SAMPLE_CHARS (an agent's whole context) is not kept."""
import json
import logging
import math
import re
from dataclasses import dataclass
from datetime import timedelta

from django.utils import timezone

from panel.core import crypto
from panel.core.redis_client import sync_redis
from panel.core.regexes import PatternError, pattern_problems, regex_redact, user_regex
from panel.usage.models import TrafficSample

log = logging.getLogger(__name__)

MAX_PER_DAY = 1000
MAX_RETENTION_DAYS = 365
MAX_REDACTIONS = 20
MAX_SAMPLE_CHARS = 100_000  # the conversation and the answer as JSON text
REDACTED = "[redacted]"
# What every route's samples lose, whatever the team adds: (what it is, the pattern).
BUILT_IN_REDACTIONS = (
    # Only from the start of a run of address characters, and at most 64 of them (an address's local part): a
    # plain [\w.+-]+@ tries every position of a long run of letters, seconds of CPU for a 100 kB conversation.
    ("e-mail addresses", r"(?<![\w.+-])[\w.+-]{1,64}@[\w-]+(?:\.[\w-]+)+"),
    ("API keys and tokens", r"\b(?:sk|pk|rk|tw|key|ghp|gho|xox[abp])[-_][A-Za-z0-9_-]{16,}"),
    ("bearer tokens", r"(?i)\bbearer\s+[A-Za-z0-9._~+/=-]{16,}"),
    ("long numbers (cards, phones, accounts)", r"\b\d(?:[ -]?\d){8,}\b"),
)


@dataclass(frozen=True)
class SamplePlan:
    """What the gateway needs of a route that keeps samples (read with the route, cached with it)."""

    route_id: int
    team_id: int
    per_day: int
    redactions: tuple = ()  # the team's own patterns


def plan_for(route):
    """The route's SamplePlan, or None when it keeps no samples."""
    if not route.samples_per_day:
        return None
    return SamplePlan(route_id=route.pk, team_id=route.team_id, per_day=route.samples_per_day,
                      redactions=tuple(redaction_lines(route.sample_redactions)))


def redaction_lines(text):
    return [line.strip() for line in (text or "").splitlines() if line.strip()]


def redaction_problems(text):
    """What is wrong with a team's redaction patterns (one regular expression per line), in words; [] when fine."""
    lines = redaction_lines(text)
    if len(lines) > MAX_REDACTIONS:
        return [f"at most {MAX_REDACTIONS} patterns, not {len(lines)}"]
    problems = []
    for number, line in enumerate(lines, start=1):
        problems += [f"line {number}: {problem}" for problem in pattern_problems(line, name="the pattern")]
    return problems


def redact(text, patterns):
    """(`text` with every match of `patterns` (of patterns_for) replaced, how many were)."""
    total = 0
    for pattern in patterns:
        if isinstance(pattern, str):  # a team's: RE2
            text, count = regex_redact(pattern, text, REDACTED)
        else:
            text, count = pattern.subn(REDACTED, text)
        total += count
    return text, total


# Ours, written for Python's re (the e-mail pattern looks behind, which RE2 cannot), and reviewed for backtracking.
_BUILT_IN = [re.compile(pattern) for _, pattern in BUILT_IN_REDACTIONS]


def patterns_for(plan):
    """The built-in patterns (compiled) and the team's (as written: panel/core/regexes.py runs them). PatternError
    when a team's pattern cannot be run."""
    for line in plan.redactions:
        user_regex(line)
    return _BUILT_IN + list(plan.redactions)


def _redacted_messages(messages, patterns):
    """The messages with every text redacted (a string content, or the text parts of a list), and the count."""
    total = 0
    cleaned = []
    for message in messages:
        message = dict(message)
        content = message.get("content")
        if isinstance(content, str):
            message["content"], count = redact(content, patterns)
            total += count
        elif isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    part = dict(part)
                    part["text"], count = redact(part["text"], patterns)
                    total += count
                parts.append(part)
            message["content"] = parts
        cleaned.append(message)
    return cleaned, total


def allowance(per_day, now):
    """How many samples the day may hold by `now`: its share so far plus one hour's share, at most `per_day`."""
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)
    fraction = (now - midnight).total_seconds() / 86_400
    return min(per_day, math.ceil(per_day * fraction) + math.ceil(per_day / 24))


def _admit(plan, now):
    """Whether this request may be kept: one more in the route's count for the day, within the allowance."""
    key = f"tw:samples:{plan.route_id}:{now:%Y%m%d}"
    client = sync_redis()
    try:
        count = client.incr(key)
        if count == 1:
            client.expire(key, 2 * 86_400)
        if count > allowance(plan.per_day, now):
            client.decr(key)
            return False
        return True
    except Exception as error:  # Redis down: keep nothing rather than more than the team allowed
        log.warning("traffic sample of route %s not kept: %s", plan.route_id, type(error).__name__)
        return False


def sample_keep(*, plan, conversation, answer, channel_id, request_id, endpoint, model, json_requested=False):
    """Keep one answered request of a sampling route, when the day's allowance has room (see the module's words).
    `conversation` is a callable giving the request's chat messages (worked out only for a request that is kept).
    Returns the TrafficSample, or None."""
    now = timezone.now()
    if not _admit(plan, now):
        return None
    messages = conversation()
    if sum(len(str(message.get("content") or "")) for message in messages) + len(answer or "") > MAX_SAMPLE_CHARS:
        _give_back(plan, now)  # too large to keep: no redaction run over it
        return None
    try:
        patterns = patterns_for(plan)
    except PatternError as error:  # saved before it was refused: redacting less than the team asked is no option
        log.warning("traffic sample of route %s not kept: %s", plan.route_id, error)
        _give_back(plan, now)
        return None
    messages, in_messages = _redacted_messages(messages, patterns)
    answer, in_answer = redact(answer or "", patterns)
    payload = json.dumps({"messages": messages, "answer": answer, "json_requested": bool(json_requested)},
                         ensure_ascii=False)
    if len(payload) > MAX_SAMPLE_CHARS:
        _give_back(plan, now)
        return None
    return TrafficSample.objects.create(team_id=plan.team_id, route_id=plan.route_id, channel_id=channel_id,
                                        created_at=now, request_id=request_id, endpoint=endpoint, model=model[:200],
                                        redacted=in_messages + in_answer, payload=crypto.encrypt(payload))


def _give_back(plan, now):
    try:
        sync_redis().decr(f"tw:samples:{plan.route_id}:{now:%Y%m%d}")
    except Exception:
        pass


def sample_content(sample):
    """The sample's decrypted {"messages", "answer", "json_requested"}."""
    return json.loads(crypto.decrypt(sample.payload))


def samples_expire(now=None):
    """Delete the samples older than their route's retention; how many went."""
    now = now or timezone.now()
    deleted = 0
    routes = (TrafficSample.objects.values_list("route_id", "route__sample_retention_days").distinct())
    for route_id, days in routes:
        days = min(days or 0, MAX_RETENTION_DAYS)
        gone, _ = TrafficSample.objects.filter(route_id=route_id, created_at__lt=now - timedelta(days=days)).delete()
        deleted += gone
    return deleted
