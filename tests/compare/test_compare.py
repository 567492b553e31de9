"""Compare: bad input is refused with a clear message and nothing saved; columns stream side by side through the
gateway path (a RequestLog row each) against fake providers; a failing or hanging column is diagnosed in words
without holding up the others; follow-ups keep each column's own history; leaving the page cancels the upstream
request; the JSON and prefix-cache checks count right; conversations are shared with the team and diffed."""
import json
import threading
import time
from decimal import Decimal

import pytest
from django.test import Client

from panel.accounts.models import Role
from panel.accounts.services import membership_add
from panel.channels.models import Route, RouteChannel
from panel.compare.models import Conversation, Message
from panel.compare.services import conversation_send, texts_diff
from panel.serving.models import Deployment
from panel.usage.models import RequestLog
from tests.support.compare import Panel, channel
from tests.support.fake_upstream import FakeUpstream, closed_port, content_text
from tests.support.waiting import wait_until


def test_it_refuses_bad_input_and_saves_nothing(team_setup, settings):
    team_a, team_b = team_setup["team_a"], team_setup["team_b"]
    mine = channel(team_a, "one", "http://127.0.0.1:9/v1")
    other = channel(team_a, "two", "http://127.0.0.1:9/v1")
    theirs = channel(team_b, "theirs", "http://127.0.0.1:9/v1")
    client = Client()
    client.force_login(team_setup["alice"])
    good = {"columns": [f"channel:{mine.pk}", f"channel:{other.pk}"], "message": "hello", "max_tokens": 16}

    def send(**changes):
        return client.post("/compare/send/", json.dumps({**good, **changes}), content_type="application/json")

    cases = [
        ({"message": "   "}, 400, "empty message"),
        ({"max_tokens": settings.GATEWAY_MAX_TOKENS + 1}, 400, f"from 1 to {settings.GATEWAY_MAX_TOKENS}"),
        ({"max_tokens": 2.5}, 400, "whole number"),
        ({"temperature": "hot"}, 400, "temperature must be a number"),
        ({"top_p": 0}, 400, "top_p must be from"),
        ({"columns": [f"channel:{mine.pk}"]}, 400, "pick 2 to 4 columns"),
        ({"columns": [f"channel:{mine.pk}"] * 2}, 400, "picked twice"),
        ({"columns": [f"channel:{mine.pk}", "shell:1"]}, 400, "is not a column"),
        ({"columns": [f"channel:{mine.pk}", f"channel:{theirs.pk}"]}, 404, "does not exist in team Team A"),
    ]
    for changes, status, words in cases:
        response = send(**changes)
        assert response.status_code == status, (changes, response.content)
        assert words in response.json()["error"], (changes, response.json())
    response = client.post("/compare/send/", "{not json", content_type="application/json")
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]
    response = client.post("/compare/checks/json/", json.dumps({"column": f"channel:{theirs.pk}", "message": "x"}),
                           content_type="application/json")
    assert response.status_code == 404 and "does not exist in team Team A" in response.json()["error"]
    other.enabled = False
    other.save()
    assert "is disabled" in send().json()["error"]
    assert not Conversation.objects.exists() and not Message.objects.exists()

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(team_setup["alice"])
    assert strict.post("/compare/send/", json.dumps(good), content_type="application/json").status_code == 403
    viewer = Client()
    viewer.force_login(team_setup["vera"])
    assert viewer.post("/compare/send/", json.dumps(good), content_type="application/json").status_code == 403
    assert not Conversation.objects.exists()


def test_it_shares_conversations_with_the_team_and_diffs_two_answers(team_setup, django_user_model):
    team_a = team_setup["team_a"]
    one, two = channel(team_a, "one", "http://127.0.0.1:9/v1"), channel(team_a, "two", "http://127.0.0.1:9/v1")
    conversation = conversation_send(team=team_a, user=team_setup["alice"],
                                     column_keys=[f"channel:{one.pk}", f"channel:{two.pk}"], message="capital?",
                                     temperature=0, top_p=1, max_tokens=8)
    Message.objects.create(conversation=conversation, column=0, role="assistant", content="Paris is the capital.")
    Message.objects.create(conversation=conversation, column=1, role="assistant", content="The capital is Paris.")
    mallory = django_user_model.objects.create_user("mallory", password="pw-mallory-1")
    membership_add(team=team_a, user=mallory, role=Role.MEMBER)
    reader = Client()
    reader.force_login(team_setup["vera"])
    url = f"/compare/{conversation.pk}/"
    assert reader.get(url).status_code == 404  # not shared yet

    owner = Client()
    owner.force_login(team_setup["alice"])
    other_member = Client()
    other_member.force_login(mallory)
    refused = other_member.post(url + "share/", json.dumps({"shared": True}), content_type="application/json")
    assert refused.status_code == 404
    shared = owner.post(url + "share/", json.dumps({"shared": True}), content_type="application/json")
    assert shared.json() == {"conversation": conversation.pk, "shared": True}
    page = reader.get(url)
    assert page.status_code == 200
    assert b"Paris is the capital." in page.content and b"Sending prompts needs the member role" in page.content
    refused = other_member.post(url + "share/", json.dumps({"shared": False}), content_type="application/json")
    assert refused.status_code == 403 and "only its owner" in refused.json()["error"]
    # Another member may read a shared conversation but not write into its owner's copy.
    assert other_member.post(f"{url}columns/0/stream/").status_code == 404

    diff = reader.get(url + "diff/?a=0&b=1").json()
    assert "".join(text for op, text in diff["pieces"] if op != "insert") == "Paris is the capital."
    assert "".join(text for op, text in diff["pieces"] if op != "delete") == "The capital is Paris."
    assert ["equal", " capital"] in diff["pieces"] or any(op == "equal" for op, _ in diff["pieces"])
    assert reader.get(url + "diff/?a=0&b=0").status_code == 400
    assert reader.get(url + "diff/?a=x").status_code == 400
    assert "no answer number 5" in reader.get(url + "diff/?turn=5").json()["error"]
    assert texts_diff("a b c", "a x c") == [["equal", "a"], ["delete", " b"], ["insert", " x"], ["equal", " c"]]


def test_it_streams_columns_side_by_side_and_diagnoses_the_failing_ones(team_setup, transactional_db):
    team_a, alice = team_setup["team_a"], team_setup["alice"]
    with FakeUpstream(chunks=12, chunk_delay=0.02) as cloud, FakeUpstream(api_key="sk-right") as locked, \
            FakeUpstream() as stuck:
        stuck.behave("hang_before_headers")
        priced = channel(team_a, "taotoken", cloud.base_url, price_input_per_million=Decimal("1"),
                         price_output_per_million=Decimal("2"))
        refused_key = channel(team_a, "locked", locked.base_url)
        nothing_there = channel(team_a, "down", f"http://127.0.0.1:{closed_port()}/v1")
        hanging = channel(team_a, "hanging", stuck.base_url, timeout=2)
        keys = [f"channel:{c.pk}" for c in (priced, refused_key, nothing_there, hanging)]
        panel = Panel(alice)
        try:
            sent = panel.post("/compare/send/", {"columns": keys, "system_prompt": "Be brief.", "message": "hello",
                                                 "max_tokens": 50, "temperature": 0.2})
            assert sent.status_code == 200, sent.text
            urls = [column["stream_url"] for column in sent.json()["columns"]]
            results, finished = {}, {}
            started = time.monotonic()

            def read(index):
                results[index] = panel.events(urls[index])
                finished[index] = time.monotonic() - started

            threads = [threading.Thread(target=read, args=(index,)) for index in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=30)
            ok = results[0]
            assert [e["text"] for e in ok if e["type"] == "delta"] and ok[-1]["ok"] is True
            assert ok[-1]["text"] == content_text(12)
            metrics = ok[-1]["metrics"]
            assert metrics["ttft_ms"] > 0 and metrics["tokens_per_second"] > 0 and metrics["latency_ms"] > 0
            assert (metrics["prompt_tokens"], metrics["completion_tokens"]) == (3, 12)
            assert Decimal(metrics["cost"]) == Decimal(3 * 1 + 12 * 2) / 1_000_000
            # The working column did not wait for the hanging one (2 s timeout).
            assert finished[3] >= 2 and finished[0] + 0.5 < finished[3], finished
            assert "401 Unauthorized" in results[1][-1]["diagnosis"] and results[1][-1]["ok"] is False
            assert "Connection refused" in results[2][-1]["diagnosis"]
            assert "within 2 s" in results[3][-1]["diagnosis"]
            assert "Traceback" not in json.dumps(results)
            assert stuck.request_count == 1  # a channel column is tried once: a retry would hide its TTFT

            wait_until(lambda: RequestLog.objects.filter(endpoint="compare").count() == 4, message="usage rows")
            rows = {row.channel_id: row for row in RequestLog.objects.filter(endpoint="compare")}
            assert {row.team_id for row in rows.values()} == {team_a.pk}
            assert rows[priced.pk].outcome == "ok" and rows[priced.pk].completion_tokens == 12
            assert rows[priced.pk].cost == Decimal("0.000027") and rows[priced.pk].stream is True
            assert rows[hanging.pk].error_kind == "stalled" and rows[hanging.pk].status_code == 504
            assert rows[refused_key.pk].error_kind == "upstream_auth"

            # A follow-up: each column sends its own history; a failed turn is left out of it.
            conversation = sent.json()["conversation"]
            follow = panel.post("/compare/send/", {"conversation": conversation, "message": "and more?",
                                                   "max_tokens": 5})
            assert follow.status_code == 200
            panel.events(follow.json()["columns"][0]["stream_url"])
            panel.events(follow.json()["columns"][1]["stream_url"])
            assert cloud.requests[-1].json["messages"] == [
                {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"},
                {"role": "assistant", "content": content_text(12)}, {"role": "user", "content": "and more?"}]
            assert locked.requests[-1].json["messages"][1:] == [{"role": "user", "content": "and more?"}]
            assert cloud.requests[-1].json["max_tokens"] == 5
            saved = Message.objects.filter(conversation_id=conversation, role="assistant")
            assert saved.count() == 6 and "within 2 s" in saved.get(column=3).metrics["error"]
            page = panel.http.get(f"/compare/{conversation}/")
            assert page.status_code == 200 and content_text(12).encode() in page.content
        finally:
            panel.close()


def test_a_deployments_column_shows_its_gpu_price_shared_by_the_minute_instead_of_a_cost_of_0(team_setup,
                                                                                                transactional_db):
    """A deployment's engine has no price per token: the column says what its GPU costs an hour (its share is
    written to the usage row by the minute), or that its host has no GPU price; a cloud column keeps its cost."""
    from panel.hosts.models import WorkerHost
    from tests.support.dashboards import make_deployment

    team_a = team_setup["team_a"]
    with FakeUpstream(("tiny-chat",), chunks=4) as engine, FakeUpstream(chunks=4) as cloud:
        deployment = make_deployment(team_a, price=Decimal("2.50"), gpu_count=2)
        Deployment.objects.filter(pk=deployment.pk).update(base_url=engine.base_url)
        local = channel(team_a, "local-tiny", engine.base_url, model="tiny-chat", kind="local",
                        deployment=deployment)
        priced = channel(team_a, "taotoken", cloud.base_url, price_output_per_million=Decimal("2"))
        panel = Panel(team_setup["alice"])
        try:
            def ask():
                sent = panel.post("/compare/send/", {"columns": [f"channel:{local.pk}", f"channel:{priced.pk}"],
                                                     "message": "hello", "max_tokens": 8})
                assert sent.status_code == 200, sent.text
                return [panel.events(column["stream_url"])[-1] for column in sent.json()["columns"]]

            mine, theirs = ask()
            assert mine["ok"] and mine["metrics"]["local_gpu"] is True and mine["metrics"]["cost"] is None
            assert mine["metrics"]["gpu_hourly"] == "5"  # 2.50 an hour, two GPUs
            assert theirs["metrics"]["cost"] == "0.000008" and "local_gpu" not in theirs["metrics"]
            WorkerHost.objects.filter(pk=deployment.host_id).update(gpu_price_per_hour=None)
            mine, _ = ask()
            assert mine["metrics"]["local_gpu"] is True and mine["metrics"]["gpu_hourly"] is None
        finally:
            panel.close()


def test_it_cancels_the_upstream_request_when_the_page_goes_away(team_setup, transactional_db):
    team_a = team_setup["team_a"]
    with FakeUpstream(chunks=400, chunk_delay=0.05) as slow, FakeUpstream() as stuck:
        stuck.behave("hang_before_headers")
        streaming = channel(team_a, "slow", slow.base_url, timeout=30)
        waiting = channel(team_a, "stuck", stuck.base_url, timeout=30)
        conversation = conversation_send(team=team_a, user=team_setup["alice"], message="tell me",
                                         column_keys=[f"channel:{streaming.pk}", f"channel:{waiting.pk}"],
                                         temperature=0, top_p=1, max_tokens=400)
        panel = Panel(team_setup["alice"])
        try:
            for index, fake in ((0, slow), (1, stuck)):
                with panel.http.stream("POST", f"/compare/{conversation.pk}/columns/{index}/stream/") as response:
                    lines = response.iter_lines()
                    if index == 0:
                        assert json.loads(next(lines))["type"] == "delta"  # mid-stream
                    else:
                        fake.wait_for_requests(1)  # still before the upstream's first byte
                # Leaving the `with` closes the connection, as a closed tab does.
                fake.wait_for_disconnects(1, timeout=5)
            wait_until(lambda: RequestLog.objects.filter(outcome="client_closed").count() == 2, message="rows")
            assert slow.requests[0].disconnected and stuck.requests[0].disconnected
            wait_until(lambda: Message.objects.filter(role="assistant").count() == 2, message="saved replies")
            partial = Message.objects.get(role="assistant", column=0)
            assert partial.content and "page was closed" in partial.metrics["error"]
        finally:
            panel.close()


def test_it_counts_json_failures_and_says_what_to_check_without_a_cache_drop(team_setup, transactional_db):
    team_a = team_setup["team_a"]
    with FakeUpstream() as cloud:
        cloud.behave("json_content")
        cloud.behave("broken_json_content", times=2)
        priced = channel(team_a, "cloud", cloud.base_url)
        route = Route.objects.create(team=team_a, model_name="assistant")
        RouteChannel.objects.create(route=route, channel=priced)
        panel = Panel(team_setup["alice"])
        try:
            events = panel.events("/compare/checks/json/", {"column": f"route:{route.pk}", "message": "three colours",
                                                            "repeats": 5, "max_tokens": 64})
            attempts = [e for e in events if e["type"] == "attempt"]
            assert [a["json_valid"] for a in attempts] == [False, False, True, True, True]
            summary = events[-1]
            assert (summary["failures"], summary["answered"], summary["errors"]) == (2, 5, 0)
            assert summary["failure_rate"] == 0.4 and summary["alarm"] is True
            assert all(r.json["response_format"] == {"type": "json_object"} for r in cloud.requests)
            assert cloud.requests[0].json["messages"][0] == {"role": "system",
                                                             "content": "Answer with one JSON object and nothing else."}
            wait_until(lambda: RequestLog.objects.filter(json_requested=True).count() == 5, message="rows")
            assert RequestLog.objects.filter(json_valid=False, route=route).count() == 2

            # The same 0.3 s before each answer: the fake has no cache, so TTFT must not drop (without the delay,
            # a first request that opens a connection is a few ms slower than the second, which is noise).
            cloud.behave("hang_before_headers", delay=0.3)
            events = panel.events("/compare/checks/prefix-cache/", {"column": f"channel:{priced.pk}"})
            first, second = (r.json["messages"][0]["content"] for r in cloud.requests[-2:])
            assert first == second and len(first) > 2000 and first.startswith("Check run ")
            assert cloud.requests[-2].json["messages"][1] != cloud.requests[-1].json["messages"][1]
            summary = events[-1]
            assert summary["ok"] is True and summary["first_ttft_ms"] >= 300 and summary["second_ttft_ms"] >= 300
            assert summary["dropped"] is False and any("minimum length" in line for line in summary["advice"])
            assert any("Dynamic content" in line for line in summary["advice"])
        finally:
            panel.close()


@pytest.mark.parametrize("path", ["/compare/", "/compare/checks/json/"])
def test_it_answers_get_and_post_only_where_it_should(team_setup, path):
    client = Client()
    client.force_login(team_setup["alice"])
    response = client.get(path)
    assert response.status_code == (200 if path == "/compare/" else 405)


def test_a_reply_is_saved_before_its_done_event_goes_out(monkeypatch):
    """The page asks for the diff as soon as both columns say done: by then both replies must be saved. A page
    that goes away mid-answer still saves what had arrived, marked cancelled."""
    import asyncio
    import concurrent.futures
    from types import SimpleNamespace

    from panel.compare import services, views

    steps = []

    async def stream_chat(column, payload, team_id):
        yield {"type": "delta", "text": "Hel"}
        yield {"type": "delta", "text": "lo"}
        yield {"type": "done", "ok": True, "text": "Hello", "metrics": {"ttft_ms": 5}, "diagnosis": ""}

    monkeypatch.setattr(views, "stream_chat", stream_chat)
    monkeypatch.setattr(services, "reply_record", lambda **saved: steps.append(("saved", saved["text"],
                                                                               saved["metrics"])))

    async def read(limit):
        events = views._reply_events(7, SimpleNamespace(index=1), {}, team_id=1)
        async for event in events:
            steps.append(("sent", event["type"]))
            if len([step for step in steps if step[0] == "sent"]) == limit:
                await events.aclose()  # the page went away
                return

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # Playwright may hold this thread's event loop
        pool.submit(asyncio.run, read(limit=99)).result()
        assert steps == [("sent", "delta"), ("sent", "delta"), ("saved", "Hello", {"ttft_ms": 5}), ("sent", "done")]
        steps.clear()
        pool.submit(asyncio.run, read(limit=1)).result()
    assert steps == [("sent", "delta"), ("saved", "Hel", {
        "error": "cancelled: the page was closed before the answer ended"})]
