"""Budgets per team and per key: the gateway refuses a spent budget with HTTP 402 `budget_exceeded`, the banner
warns at 80%, the 80% and 100% notices are audited once a month, the reconciliation rebuilds the Redis counters
from the usage records after a flush, and the budget form writes nothing on bad input."""
from decimal import ROUND_CEILING, Decimal

import httpx
import pytest
import redis
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from panel.accounts.keys import key_issue
from panel.accounts.models import Role
from panel.accounts.services import membership_add
from panel.audit.models import AuditAction, AuditEvent
from panel.budgets.counters import held_keys, money_from_units, month_of
from panel.budgets.models import Budget, BudgetNotice
from panel.budgets.reservations import maximum, prompt_bound
from panel.budgets.services import budget_set, budget_usage, budgets_reconcile
from panel.budgets.tasks import reconcile_budgets
from panel.channels.models import Channel, Route, RouteChannel
from panel.usage.models import RequestLog
from tests.support.fake_upstream import FakeUpstream
from tests.support.gateway import gateway_for
from tests.support.waiting import wait_until

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "one two three four"}], "max_tokens": 20}
# 4 prompt words + 20 completion words at 5000 per million tokens each: 0.12 per request.
PRICE = Decimal("5000")
COST = Decimal("0.12")
# Its answer is most of what it holds, so two of them reach 80% of a budget that has room for the second's most:
# 4 + 400 words, 2.02 per request.
LONG = dict(CHAT, max_tokens=400)
LONG_COST = Decimal("2.02")


@pytest.fixture
def priced(team_setup):
    with FakeUpstream(models=("up-model",)) as fake:
        team = team_setup["team_a"]
        channel = Channel.objects.create(team=team, name="cloud", kind="remote", base_url=fake.base_url,
                                         model_id="up-model", credential_kind="none", timeout_seconds=5,
                                         max_retries=0, price_input_per_million=PRICE,
                                         price_output_per_million=PRICE)
        route = Route.objects.create(team=team, model_name="chat", strategy="local_first")
        RouteChannel.objects.create(route=route, channel=channel, position=1)
        app, raw_app = key_issue(team=team, user=team_setup["alice"], name="app")
        batch, raw_batch = key_issue(team=team, user=team_setup["alice"], name="batch")
        yield {**team_setup, "team": team, "fake": fake, "app": app, "raw_app": raw_app, "batch": batch,
               "raw_batch": raw_batch}


@pytest.fixture
def gateway(transactional_db, request):
    yield from gateway_for(request, TOKENWISE_BUDGET_CACHE_SECONDS="0")


def ask(gateway, raw, body=CHAT):
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {raw}"})


def logged(count):
    return wait_until(lambda: RequestLog.objects.count() >= count, seconds=10, message=f"{count} usage records")


def most_a_request_may_cost(body):
    """What the gateway holds for one request: its prompt's bound plus max_tokens at the route's price."""
    held = maximum(prompt_bound(body).tokens, body, [Channel.objects.get(name="cloud")])
    return money_from_units(held.money_units)


def test_it_refuses_a_spent_team_budget_alerts_once_and_survives_a_redis_flush(gateway, priced, client):
    team, fake = priced["team"], priced["fake"]
    fake.behave("ok", chunks=400)
    assert ask(gateway, priced["raw_app"], LONG).status_code == 200  # before any budget
    logged(1)
    assert RequestLog.objects.get().cost == LONG_COST
    most = most_a_request_may_cost(LONG)
    assert most > LONG_COST  # the prompt's bound and max_tokens bound the real cost from above
    limit = (LONG_COST + most).quantize(Decimal("0.01"), rounding=ROUND_CEILING)  # a budget has cents
    budget_set(team=team, money_per_month=limit, user=priced["alice"])
    assert ask(gateway, priced["raw_app"], LONG).status_code == 200  # 2.02 spent before it, and room for its most
    logged(2)
    # 4.04 spent: the request that crossed 80% raised the notice itself, not the reconciliation a minute later
    notice = wait_until(lambda: BudgetNotice.objects.filter(level=BudgetNotice.Level.ALERT).first(), seconds=5,
                        message="the 80% notice")
    assert budgets_reconcile() == []
    client.force_login(priced["vera"])  # a viewer sees the banner and the page
    banner = client.get(reverse("home")).content.decode()
    assert f"{int(2 * LONG_COST / limit * 100)}% of the monthly money budget spent" in banner
    upstream_seen = len(fake.requests)
    refused = ask(gateway, priced["raw_batch"], LONG)  # 4.04 spent: what is left cannot cover this request's most
    assert refused.status_code == 402
    error = refused.json()["error"]
    assert (error["code"], error["type"]) == ("budget_exceeded", "insufficient_quota")
    assert f"costing up to {most:.6f} USD at the route's highest price" in error["message"]
    assert (f"this team's monthly budget of {limit} USD has {limit - 2 * LONG_COST:.6f} USD left (4.040000 spent, "
            f"0.000000 held for requests in flight): lower max_tokens or raise the budget") in error["message"]
    assert len(fake.requests) == upstream_seen  # nothing went upstream
    logged(3)
    row = RequestLog.objects.order_by("-created_at").first()
    assert (row.status_code, row.error_kind, row.cost) == (402, "budget_exceeded", 0)

    budget_set(team=team, money_per_month=2 * LONG_COST, user=priced["alice"])  # lowered to what is spent
    spent = ask(gateway, priced["raw_app"], LONG)
    assert spent.status_code == 402
    assert "this team's monthly budget of 4.04 USD is spent (4.04 USD this month)" in spent.json()["error"]["message"]
    assert "renews on" in spent.json()["error"]["message"]
    [exhausted] = budgets_reconcile()
    assert exhausted.level == BudgetNotice.Level.EXHAUSTED and exhausted.pk > notice.pk
    assert budgets_reconcile() == []  # once a month
    assert [e.action for e in AuditEvent.objects.filter(team=team).order_by("id")] == [
        AuditAction.BUDGET_ALERT, AuditAction.BUDGET_EXHAUSTED]
    assert "the monthly budget is spent" in client.get(reverse("budgets")).content.decode()

    # A Redis flush forgets the counters; the reconciliation (the beat task's body) brings them back.
    budget_set(team=team, money_per_month=LONG_COST * 3, user=priced["alice"])  # 6.06
    redis.Redis.from_url(settings.REDIS_URL).flushdb()
    assert ask(gateway, priced["raw_app"], LONG).status_code == 200  # the window until the next reconciliation
    logged(5)
    assert reconcile_budgets() == 0  # no new notice
    again = ask(gateway, priced["raw_app"], LONG)
    assert again.status_code == 402 and "6.06 USD is spent (6.06 USD this month)" in again.json()["error"]["message"]
    assert settings.CELERY_BEAT_SCHEDULE["reconcile-budgets"]["task"] == reconcile_budgets.name


def test_it_refuses_a_request_a_key_budget_cannot_cover_and_leaves_the_other_keys_alone(gateway, priced):
    priced["fake"].behave("ok", chunks=400)
    most = prompt_bound(LONG).tokens + LONG["max_tokens"]  # the tokens held for one request
    budget_set(team=priced["team"], key=priced["batch"], tokens_per_month=404 + most, user=priced["alice"])
    assert ask(gateway, priced["raw_batch"], LONG).status_code == 200  # 404 tokens
    assert ask(gateway, priced["raw_batch"], LONG).status_code == 200  # 404 + its most fit exactly
    refused = ask(gateway, priced["raw_batch"], LONG)
    assert refused.status_code == 402
    said = refused.json()["error"]["message"]
    assert (f"this key's monthly budget of {404 + most:,} tokens has {most - 404} left (808 spent, 0 held for "
            f"requests in flight): lower max_tokens or raise the budget") in said
    assert ask(gateway, priced["raw_app"]).status_code == 200  # the team and its other keys go on
    logged(4)
    uses = {use.name: use for use in budget_usage(team=priced["team"])}
    assert uses[f"Key {priced['batch']}"].tokens == 808 and uses[f"Key {priced['batch']}"].level == "alert"
    assert uses[f"Whole team ({priced['team'].name})"].tokens == 832


def test_a_key_that_fits_max_tokens_to_its_budget_is_served_shorter_then_refused_when_nothing_is_left(gateway, priced):
    # Three requests a minute: a fitted request counted twice in its minute would make the third a 429.
    fitting, raw = key_issue(team=priced["team"], user=priced["alice"], name="fits", fit_to_budget=True, rpm_limit=3)
    prompt = prompt_bound(CHAT).tokens
    budget_set(team=priced["team"], key=fitting, tokens_per_month=24 + prompt + 6, user=priced["alice"])
    assert ask(gateway, raw).status_code == 200  # 24 tokens: 4 in the prompt, 20 in the answer
    fitted = ask(gateway, raw)  # its most (the prompt and 20) does not fit; the prompt and 6 do
    assert fitted.status_code == 200, fitted.text
    assert fitted.headers["x-tokenwise-adapted"] == "max_tokens lowered from 20 to 6 (what the budget has left)"
    assert priced["fake"].requests[-1].json["max_tokens"] == 6
    assert fitted.json()["usage"]["completion_tokens"] <= 6
    logged(2)
    refused = ask(gateway, raw)  # nothing left for even one token: refused as before
    assert refused.status_code == 402 and "lower max_tokens or raise the budget" in refused.json()["error"]["message"]


def test_fitting_a_money_budget_finds_the_longest_answer_it_pays_for():
    from panel.budgets.counters import UNIT
    from panel.budgets.enforcement import Limits
    from panel.budgets.reservations import fitting_completion

    channel = Channel(price_input_per_million=PRICE, price_output_per_million=PRICE)
    asked = maximum(4, {"max_tokens": 20}, [channel])  # 0.12
    scopes = [("key", 1, Limits(money=Decimal("1.00"), tokens=None))]
    spent = int(Decimal("0.95") * UNIT)  # 0.05 left: 10 tokens at 0.005, 4 of them the prompt's
    assert fitting_completion(scopes, 0, [str(spent), "0"], (0, 0), asked, [channel]) == 6
    held = (int(Decimal("0.03") * UNIT), 0)  # in flight: 0.02 left, the prompt alone
    assert fitting_completion(scopes, 0, [str(spent), "0"], held, asked, [channel]) is None


@pytest.fixture
def admin_client(client, team_setup, django_user_model):
    adam = django_user_model.objects.create_user("adam", password="pw-adam-123")
    membership_add(team=team_setup["team_a"], user=adam, role=Role.ADMIN)
    client.force_login(adam)
    return client


@pytest.mark.parametrize("data, words", [
    ({"target": "team", "money_per_month": "-1"}, "greater than or equal to 0"),
    ({"target": "team", "money_per_month": "ten"}, "Enter a number"),
    ({"target": "team", "money_per_month": "1.234"}, "no more than 2 decimal places"),
    ({"target": "team", "tokens_per_month": "1.5"}, "Enter a whole number"),
    ({"target": "team", "tokens_per_month": "-5"}, "greater than or equal to 0"),
    ({"target": "999999", "tokens_per_month": "5"}, "Select a valid choice"),
    ({"target": "", "tokens_per_month": "5"}, "This field is required"),
])
def test_it_refuses_a_bad_budget_and_writes_nothing(admin_client, team_setup, data, words):
    response = admin_client.post(reverse("budget_edit"), data)
    assert response.status_code == 400 and words in response.content.decode()
    assert Budget.objects.count() == 0
    assert not AuditEvent.objects.filter(action=AuditAction.BUDGET_CHANGED).exists()


def test_it_saves_changes_and_removes_budgets_with_an_audit_row_each(admin_client, team_setup, client):
    team_b_key, _ = key_issue(team=team_setup["team_b"], user=team_setup["bob"], name="b-app")
    assert admin_client.post(reverse("budget_edit"), {"target": str(team_b_key.pk), "tokens_per_month": "5"}
                             ).status_code == 400  # another team's key is not a choice
    key, _ = key_issue(team=team_setup["team_a"], user=team_setup["alice"], name="app")
    assert admin_client.post(reverse("budget_edit"), {"target": "team", "money_per_month": "25.50"}).status_code == 302
    assert admin_client.post(reverse("budget_edit"), {"target": str(key.pk), "tokens_per_month": "1000000"}
                             ).status_code == 302
    assert admin_client.post(reverse("budget_edit"), {"target": "team", "money_per_month": "",
                                                      "tokens_per_month": ""}).status_code == 302
    assert list(Budget.objects.values_list("key_id", "money_per_month", "tokens_per_month")) == [(key.pk, None,
                                                                                                   1000000)]
    changes = [(e.target, e.detail["before"], e.detail["after"])
               for e in AuditEvent.objects.filter(action=AuditAction.BUDGET_CHANGED).order_by("id")]
    none = {"money_per_month": None, "tokens_per_month": None}
    assert changes == [
        ("team Team A", none, {"money_per_month": "25.50", "tokens_per_month": None}),
        (f"key {key}", none, {"money_per_month": None, "tokens_per_month": 1000000}),
        ("team Team A", {"money_per_month": "25.50", "tokens_per_month": None}, none)]
    client.force_login(team_setup["vera"])  # a viewer sees use against budgets, without the form
    page = client.get(reverse("budgets")).content.decode()
    assert "1.0M" in page or "1,000,000" in page or "1000000" in page
    assert "Save budget" not in page
    assert client.post(reverse("budget_edit"), {"target": "team", "money_per_month": "1"}).status_code == 403


def test_it_warns_on_every_page_from_80_percent(client, team_setup):
    team = team_setup["team_a"]
    budget_set(team=team, money_per_month=Decimal("10"), tokens_per_month=None)
    client.force_login(team_setup["alice"])
    RequestLog.objects.create(team=team, endpoint="chat", model="chat", status_code=200, outcome="ok",
                              latency_ms=5, cost=Decimal("7.90"), created_at=timezone.now())
    budgets_reconcile()
    assert "monthly money budget" not in client.get(reverse("keys")).content.decode()  # 79%
    RequestLog.objects.create(team=team, endpoint="chat", model="chat", status_code=200, outcome="ok",
                              latency_ms=5, cost=Decimal("0.60"), created_at=timezone.now())
    budgets_reconcile()
    page = client.get(reverse("keys")).content.decode()
    assert "85% of the monthly money budget spent" in page
    client.force_login(team_setup["bob"])  # another team sees nothing
    assert "monthly money budget" not in client.get(reverse("keys")).content.decode()



def in_process(priced, monkeypatch, *, stream, count):
    """One request through the gateway's ASGI application in this process, with its round trip to Redis at the end
    (the count among it) replaced by `count` and the usage writer by a list: the steps in the order they happened."""
    import asyncio
    import concurrent.futures
    import json

    from panel.budgets.counters import ADD
    from panel.channels import routing as routes
    from panel.core import redis_client
    from panel.gateway import app, upstream
    from panel.usage import writer as usage

    steps = []

    async def send(message):
        if message["type"] == "http.response.start":
            steps.append(("status", message["status"]))
        elif message["type"] == "http.response.body":
            steps.append(("body", message["body"], message.get("more_body", False)))

    async def receive():
        if not steps or steps[-1] != ("sent request",):
            steps.append(("sent request",))
            return {"type": "http.request", "body": json.dumps({**CHAT, "stream": stream}).encode(),
                    "more_body": False}
        await asyncio.sleep(3600)  # the client never leaves

    async def together(calls):  # the request's one round trip at its end: its count among them
        steps.extend(("counted", money_from_units(args[0]), args[1]) for text, _, args in calls if text == ADD)
        await count()
        return [[b"0"] * 8 if call[0] == ADD else None for call in calls]

    monkeypatch.setattr(redis_client, "together", together)
    monkeypatch.setattr(usage, "record", lambda **fields: steps.append(("recorded", fields["status_code"])))
    monkeypatch.setattr(redis_client, "_client", None)  # clients of this test's event loop
    routes._cache.clear()
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "headers": [(b"authorization", f"Bearer {priced['raw_app']}".encode())]}

    async def scenario():
        try:
            await app.application(scope, receive, send)
        finally:
            await upstream.connections_close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # Playwright may hold this thread's event loop
        pool.submit(asyncio.run, scenario()).result()
    return steps


async def nothing():
    return None


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("stream", [False, True])
def test_a_request_is_counted_before_its_last_byte_reaches_the_client(priced, monkeypatch, stream):
    """The gateway's own steps, in order: the key's next request is judged with this one counted, so the count
    must land before the answer ends (before [DONE] for a stream). Run in-process to see the order."""
    steps = in_process(priced, monkeypatch, stream=stream, count=nothing)
    counted = [index for index, step in enumerate(steps) if step[0] == "counted"]
    assert [steps[index][1:] for index in counted] == [(COST, 24)]
    bodies = [index for index, step in enumerate(steps) if step[0] == "body"]
    last = bodies[-1]
    assert steps[last][2] is False and counted[0] < last and steps[-1] == ("recorded", 200)
    if stream:
        done = next(index for index in bodies if steps[index][1] == b"data: [DONE]\n\n")
        assert counted[0] < done


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("stream", [False, True])
def test_a_counter_outage_neither_breaks_the_answer_nor_loses_its_usage_row(priced, monkeypatch, caplog, stream):
    async def redis_down():
        raise redis.exceptions.ConnectionError("Connection refused")

    steps = in_process(priced, monkeypatch, stream=stream, count=redis_down)
    assert ("status", 200) in steps and steps[-1] == ("recorded", 200)
    text = b"".join(step[1] for step in steps if step[0] == "body")
    assert b"error" not in text and (b"data: [DONE]" in text) is stream
    assert "request not counted against the limits of key" in caplog.text and "ConnectionError" in caplog.text


def test_a_budget_set_after_the_spend_refuses_the_next_request_at_once(gateway, priced):
    """Why the old case kept answering for about 50 s: a team without a budget was not counted in Redis at all, so
    a budget set later read 0 until the once-a-minute reconciliation rebuilt the counters from the usage records.
    Now every request is counted, and setting a budget counts the month's recorded spend at once."""
    for _ in range(2):
        assert ask(gateway, priced["raw_app"]).status_code == 200  # 48 tokens, no budget yet
    logged(2)
    budget_set(team=priced["team"], key=priced["app"], tokens_per_month=40, user=priced["alice"])
    refused = ask(gateway, priced["raw_app"])  # no reconciliation in between
    assert refused.status_code == 402 and "48 tokens this month" in refused.json()["error"]["message"]
    assert ask(gateway, priced["raw_batch"]).status_code == 200  # another key of the team is not affected


@pytest.mark.parametrize("streams", [16, 64])
def test_concurrent_streams_end_at_or_under_the_budget(gateway, priced, streams):
    """Many concurrent streams against a budget that holds five of them: each admitted stream held its most before
    it went, so the spend ends at or under the budget, the rest are refused with 402, and nothing stays held."""
    import concurrent.futures

    priced["fake"].behave("slow_drip", delay=0.02)
    most = prompt_bound(CHAT).tokens + CHAT["max_tokens"]
    budget_set(team=priced["team"], key=priced["app"], tokens_per_month=5 * most, user=priced["alice"])

    def stream():
        with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=dict(CHAT, stream=True), timeout=60,
                          headers={"Authorization": f"Bearer {priced['raw_app']}"}) as response:
            return response.status_code, b"".join(response.iter_bytes())

    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        answers = list(pool.map(lambda _: stream(), range(streams)))
    admitted = sum(1 for status, _ in answers if status == 200)
    assert 1 <= admitted and all(status in (200, 402) for status, _ in answers)
    logged(streams)
    spent = sum(r.prompt_tokens + r.completion_tokens for r in RequestLog.objects.filter(key=priced["app"]))
    assert spent == admitted * 24 <= 5 * most
    held = redis.Redis.from_url(settings.REDIS_URL).mget(held_keys(month_of(), "key", priced["app"].id))
    assert [int(value) for value in held] == [0, 0]  # every hold released at the end
    again = ask(gateway, priced["raw_app"])  # admitted again only if its most fits beside the spend
    assert again.status_code == (200 if spent + most <= 5 * most else 402)


def test_the_budgets_page_shows_what_requests_in_flight_hold(gateway, priced, client):
    import threading

    priced["fake"].behave("slow_drip", delay=0.2)
    most = prompt_bound(CHAT).tokens + CHAT["max_tokens"]
    budget_set(team=priced["team"], key=priced["app"], tokens_per_month=10 * most, user=priced["alice"])
    streaming = threading.Thread(target=lambda: httpx.post(
        f"{gateway.url}/v1/chat/completions", json=dict(CHAT, stream=True), timeout=60,
        headers={"Authorization": f"Bearer {priced['raw_app']}"}))
    streaming.start()
    app = f"Key {priced['app']}"
    held = wait_until(lambda: {use.name: use for use in budget_usage(team=priced["team"])}[app].held_tokens,
                      seconds=20, message="the stream's hold")
    assert held == most
    client.force_login(priced["vera"])
    page = client.get(reverse("budgets")).content.decode()
    assert "Held for requests in flight" in page and f"{most} tokens" in page
    streaming.join(60)
    assert {use.name: use for use in budget_usage(team=priced["team"])}[app].held_tokens == 0
