"""Keeping traffic samples (panel/usage/samples.py): the day's allowance spread over the hours, the built-in and the
team's redactions, encryption, the size bound, Redis down, and deletion after the route's retention; the gateway's
conversion of every API's request into text chat messages (panel/gateway/sampling.py)."""
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone

import pytest
from django.utils import timezone

from panel.channels.models import Route
from panel.gateway.sampling import answer_of, conversation_of
from panel.usage import samples
from panel.usage.models import TrafficSample

pytestmark = pytest.mark.django_db


def at(hour, minute=0):
    return datetime(2026, 12, 3, hour, minute, tzinfo=dt_timezone.utc)


def test_the_allowance_grows_through_the_day_and_never_passes_the_days_number():
    assert samples.allowance(240, at(0)) == 10  # one hour's share at midnight
    assert samples.allowance(240, at(12)) == 130
    assert samples.allowance(240, at(23, 59)) == 240
    assert samples.allowance(1, at(0)) == 1
    assert samples.allowance(1000, at(6)) == 250 + 42


@pytest.mark.parametrize("text, expected", [
    ("mail jane.doe+x@mail.example.co.uk now", "mail [redacted] now"),
    ("key sk-proj-AbCdEfGhIjKlMnOpQrSt and ghp_abcdefghijklmnopqrstuvwx", "key [redacted] and [redacted]"),
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abc.def", "Authorization: [redacted]"),
    ("card 4111-1111-1111-1111, phone +1 415 555 0100", "card [redacted], phone +[redacted]"),
    ("in 2026 order 12345678 of 3 items", "in 2026 order 12345678 of 3 items"),  # short numbers stay
])
def test_the_built_in_redactions(text, expected):
    patterns = samples.patterns_for(samples.SamplePlan(route_id=1, team_id=1, per_day=1))
    assert samples.redact(text, patterns)[0] == expected


def test_a_teams_redaction_patterns_are_checked_like_any_pattern():
    assert samples.redaction_problems("CUST-\\d{6}\n\n(?i)project \\w+\n") == []
    # RE2 runs (a+)+ in linear time, so it is fine; it cannot look behind.
    assert samples.redaction_problems("ok\n(a+)+\n(?<=@)\\w+") == [
        "line 3: the pattern looks ahead or behind (like (?=…), (?!…), (?<=…) or (?<!…)), which patterns here run "
        "without backtracking, so that no text can make them slow: match the surrounding text instead"]
    assert samples.redaction_problems("[unclosed")[0].startswith("line 1: the pattern is not a valid regular")
    assert samples.redaction_problems("\n".join(f"p{i}" for i in range(21))) == ["at most 20 patterns, not 21"]


@pytest.fixture
def route(team_setup):
    return Route.objects.create(team=team_setup["team_a"], model_name="chat", samples_per_day=2,
                                sample_redactions="CUST-\\d{6}", sample_retention_days=3)


def keep(route, ask="Customer CUST-000042 asks", answer="Hello CUST-000042", **extra):
    return samples.sample_keep(plan=samples.plan_for(route), conversation=lambda: [{"role": "user", "content": ask}],
                               answer=answer, channel_id=None, request_id="req_1", endpoint="chat", model="chat",
                               **extra)


def test_a_teams_pattern_is_run_by_re2_on_any_text_and_one_it_cannot_run_keeps_nothing(route):
    route.sample_redactions = "CUST-\\d{6}\n(?i)secret \\w+"
    sample = keep(route, ask="CUST-000042 \ud800 says SECRET sauce", answer="no")  # a lone surrogate, as JSON allows
    content = samples.sample_content(sample)
    assert content["messages"][0]["content"] == "[redacted] \ufffd says [redacted]" and sample.redacted == 2
    route.sample_redactions = "(?<=CUST-)\\d+"  # saved before RE2 refused it: redacting less is no option
    assert keep(route) is None


def test_a_kept_sample_is_redacted_encrypted_and_bounded_by_the_allowance(route, monkeypatch):
    monkeypatch.setattr(samples, "allowance", lambda per_day, now: per_day)  # whatever the hour of the run
    kept = keep(route, json_requested=True)
    assert kept.redacted == 2 and "CUST" not in kept.payload
    assert samples.sample_content(kept) == {"messages": [{"role": "user", "content": "Customer [redacted] asks"}],
                                            "answer": "Hello [redacted]", "json_requested": True}
    assert keep(route) is not None
    assert keep(route) is None  # two a day
    assert TrafficSample.objects.count() == 2


def test_too_large_a_conversation_is_not_kept_and_does_not_use_the_allowance(route, monkeypatch):
    monkeypatch.setattr(samples, "allowance", lambda per_day, now: per_day)
    assert keep(route, ask="x" * samples.MAX_SAMPLE_CHARS) is None
    assert keep(route) is not None and keep(route) is not None  # both of the day's two still there


def test_a_long_conversation_under_the_limit_is_redacted_in_one_pass(route, monkeypatch):
    # A run of 90,000 letters: an address pattern that tried every position of it took about 50 s of CPU here.
    monkeypatch.setattr(samples, "allowance", lambda per_day, now: per_day)
    kept = keep(route, ask="x" * 90_000 + " write to jane.doe@example.com or call 0151 2345 6789")
    text = samples.sample_content(kept)["messages"][0]["content"]
    assert kept.redacted == 3 and text.endswith(" write to [redacted] or call [redacted]")  # and the answer's


def test_nothing_is_kept_while_redis_is_down(route, monkeypatch):
    class Down:
        def incr(self, key):
            raise ConnectionError("redis down")

    monkeypatch.setattr(samples, "sync_redis", lambda: Down())
    assert keep(route) is None and not TrafficSample.objects.exists()


def test_samples_go_after_their_routes_retention(route, team_setup):
    other = Route.objects.create(team=team_setup["team_a"], model_name="other", sample_retention_days=30)
    now = timezone.now()
    for days, owner in ((2, route), (4, route), (4, other), (400, other)):
        TrafficSample.objects.create(team=owner.team, route=owner, endpoint="chat", model="m", payload="x",
                                     created_at=now - timedelta(days=days))
    assert samples.samples_expire(now) == 2  # 4 days on a 3-day route; 400 days on any
    assert sorted(TrafficSample.objects.values_list("route__model_name", flat=True)) == ["chat", "other"]
    Route.objects.filter(pk=route.pk).update(sample_retention_days=1)  # shortened: applies at the next run
    assert samples.samples_expire(now) == 1


def test_every_api_becomes_text_chat_messages():
    chat = {"messages": [{"role": "developer", "content": "Rules."},
                         {"role": "user", "content": [{"type": "text", "text": "Look:"},
                                                      {"type": "image_url", "image_url": {"url": "data:..."}}]},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}]},
                         {"role": "tool", "tool_call_id": "c1", "content": "a.py"}]}
    assert conversation_of("chat", chat) == [
        {"role": "system", "content": "Rules."}, {"role": "user", "content": "Look:\n[image url]"},
        {"role": "assistant", "content": "[tool call ls {}]"}, {"role": "user", "content": "[tool result] a.py"}]
    assert conversation_of("completions", {"prompt": "Once upon"}) == [{"role": "user", "content": "Once upon"}]
    responses = {"instructions": "Be short.", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "List files"}]},
        {"type": "function_call", "name": "ls", "arguments": "{}", "call_id": "c1"},
        {"type": "function_call_output", "call_id": "c1", "output": "a.py"}]}
    assert conversation_of("responses", responses) == [
        {"role": "system", "content": "Be short."}, {"role": "user", "content": "List files"},
        {"role": "assistant", "content": "[tool call ls {}]"}, {"role": "user", "content": "[tool result] a.py"}]
    blocks = [{"type": "text", "text": "Hi"}, {"type": "tool_use", "name": "ls", "input": {}}]
    assert answer_of("messages", {"content": blocks}) == "Hi\n[tool call ls {}]"
    assert answer_of("responses", {"output": [{"type": "reasoning"}, {"type": "message", "content": [
        {"type": "output_text", "text": "Done."}]}]}) == "Done."
    assert answer_of("completions", {"choices": [{"text": " there"}]}) == " there"
    assert answer_of("chat", {"choices": []}) == ""
