"""Outgoing notifications: events recorded in the transaction of their cause, signed deliveries sent by a real
worker, retried with backoff and logged when the receiver is down, slow or answering 500 (and delivered once it
answers: nothing lost), and a gateway that never waits for any of it."""
import hashlib
import hmac
import threading
import time
from decimal import Decimal

import httpx
import pytest
from django.db import transaction

from panel.accounts.keys import key_issue
from panel.budgets.services import budget_set, budgets_reconcile
from panel.channels.canary import canary_rollback, canary_start
from panel.channels.models import Route
from panel.channels.services import channel_create, route_save
from panel.jobs.services import job_fail
from panel.notifications.cooldown import channel_cooled_down
from panel.notifications.delivery import signature
from panel.notifications.models import Delivery, DeliveryState, Notification
from panel.notifications.services import webhook_create
from panel.registry.models import QuantizationJob
from panel.usage.models import RequestLog
from tests.support.fake_upstream import FakeUpstream, closed_port
from tests.support.waiting import wait_until
from tests.support.webhook_receiver import Receiver

FAST_RETRIES = {"TOKENWISE_WEBHOOK_BACKOFF_SECONDS": "1", "TOKENWISE_WEBHOOK_TIMEOUT_SECONDS": "1"}


def quantization_job(team):
    from panel.registry.models import RegisteredModel

    model = RegisteredModel.objects.create(
        team=team, name="m", path="/nonexistent", architecture="Qwen2ForCausalLM", model_type="qwen2",
        parameter_count=1, linear_parameter_count=1, num_layers=1, num_attention_heads=1, num_kv_heads=1,
        hidden_size=1, head_dim=1, max_position_embeddings=1, dtype="bfloat16", size_bytes=1)
    return QuantizationJob.objects.create(team=team, source=model, state="running")


def test_a_failed_job_is_an_event_in_the_same_transaction(team_setup):
    team = team_setup["team_a"]
    hook, _ = webhook_create(team=team, name="ops", url="http://127.0.0.1:9/hook")
    job = quantization_job(team)
    with pytest.raises(RuntimeError), transaction.atomic():
        job_fail(job, kind="oom", reason="out of memory")
        assert Notification.objects.filter(kind="job.failed").count() == 1  # seen together with the state
        raise RuntimeError("the caller's transaction fails after the state change")
    assert not Notification.objects.exists() and not Delivery.objects.exists()
    job.refresh_from_db()
    assert job.state == "running"
    assert job_fail(job, kind="oom", reason="out of memory")
    note = Notification.objects.get()
    assert note.kind == "job.failed" and "out of memory" in note.title and note.facts["failure_kind"] == "oom"
    assert Delivery.objects.get().webhook == hook


def test_canary_rollbacks_and_budget_notices_are_events(team_setup):
    team = team_setup["team_a"]
    stable = channel_create(team=team, name="stable", kind="remote", base_url="http://127.0.0.1:9/v1",
                            model_id="m", credential_kind="none")
    candidate = channel_create(team=team, name="awq", kind="remote", base_url="http://127.0.0.1:9/v1",
                               model_id="m", credential_kind="none")
    route = route_save(team=team, model_name="chat", entries=[(stable, 0, 1)])
    canary_start(route=route, channel=candidate)
    assert canary_rollback(route=Route.objects.get(pk=route.pk), reason="JSON failures 12%")
    assert Notification.objects.get(kind="canary.rolled_back").facts["candidate"] == "awq"
    key, _ = key_issue(team=team, user=team_setup["alice"], name="svc")
    budget_set(team=team, money_per_month=Decimal("1.00"))
    RequestLog.objects.create(team=team, key=key, endpoint="chat", model="chat", status_code=200, outcome="ok",
                              latency_ms=1, cost=Decimal("1.20"))
    budgets_reconcile()
    assert sorted(Notification.objects.filter(kind__startswith="budget.").values_list("kind", flat=True)) == [
        "budget.alert", "budget.exhausted"]
    budgets_reconcile()  # once a month: no second event
    assert Notification.objects.filter(kind__startswith="budget.").count() == 2


def test_a_delivery_is_signed_and_slack_gets_text(team_setup, start_worker):
    team = team_setup["team_a"]
    with Receiver() as plain, Receiver() as slack:
        hook, secret = webhook_create(team=team, name="ops", url=plain.url)
        webhook_create(team=team, name="slack", url=slack.url, format="slack", events=["job.failed"])
        start_worker("default", **FAST_RETRIES)
        job = quantization_job(team)
        job_fail(job, kind="oom", reason="CUDA out of memory")
        wait_until(lambda: len(plain.received) == 1 and len(slack.received) == 1, seconds=30,
                   message="both receivers to get the event")
    sent = plain.received[0]
    timestamp, body = sent["headers"]["X-Tokenwise-Timestamp"], sent["body"]
    expected = "sha256=" + hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    assert sent["headers"]["X-Tokenwise-Signature"] == expected == signature(secret, timestamp, body)
    assert abs(int(timestamp) - time.time()) < 60 and sent["headers"]["X-Tokenwise-Event"] == "job.failed"
    assert plain.bodies()[0]["facts"]["failure_reason"] == "CUDA out of memory"
    assert plain.bodies()[0]["team"] == {"id": team.pk, "name": "Team A"}
    text = slack.bodies()[0]["text"]
    assert text.startswith("*Tokenwise · Team A*: Quantization job") and "CUDA out of memory" in text
    assert set(Delivery.objects.values_list("state", flat=True)) == {DeliveryState.DELIVERED}


def test_down_slow_and_failing_receivers_are_retried_logged_and_nothing_is_lost(team_setup, start_worker):
    team = team_setup["team_a"]
    down_port = closed_port()
    with Receiver() as slow, Receiver() as failing:
        slow.plan = [("sleep", 3), ("sleep", 3)]  # longer than the 1 s timeout, twice
        failing.plan = [("status", 500), ("status", 503)]
        hooks = {"down": webhook_create(team=team, name="down", url=f"http://127.0.0.1:{down_port}/hook")[0],
                 "slow": webhook_create(team=team, name="slow", url=slow.url)[0],
                 "failing": webhook_create(team=team, name="failing", url=failing.url)[0]}
        start_worker("default", **FAST_RETRIES)
        job_fail(quantization_job(team), kind="oom", reason="out of memory")
        deliveries = {name: Delivery.objects.get(webhook=hook) for name, hook in hooks.items()}
        wait_until(lambda: Delivery.objects.get(pk=deliveries["down"].pk).attempts >= 2, seconds=60,
                   message="two failed attempts at the receiver that is down")
        with Receiver(port=down_port) as back_up:
            wait_until(lambda: not Delivery.objects.exclude(state=DeliveryState.DELIVERED).exists(), seconds=90,
                       message="every delivery to arrive")
            assert len(back_up.received) == 1
        assert len(slow.received) == 3 and len(failing.received) == 3
    ids = {item["headers"]["X-Tokenwise-Delivery"] for item in slow.received}
    assert ids == {str(deliveries["slow"].pk)}  # the same delivery, retried: a receiver can de-duplicate
    log = {name: list(Delivery.objects.get(pk=d.pk).attempt_log.order_by("at").values_list("status", "error"))
           for name, d in deliveries.items()}
    assert log["failing"] == [(500, "the receiver answered HTTP 500"), (503, "the receiver answered HTTP 503"),
                              (200, "")]
    assert log["slow"][:2] == [(None, "no answer within 1 s")] * 2 and log["slow"][2] == (200, "")
    assert all(status is None and "could not reach" in error for status, error in log["down"][:-1])
    assert log["down"][-1] == (200, "")


def test_the_gateway_never_waits_on_a_cooldown_notice_or_its_delivery(team_setup, start_worker):
    """A channel that keeps failing cools down while the only webhook's receiver takes 5 s per answer: the gateway's
    requests are answered as fast as before, and the event is recorded and delivered on the side."""
    from django.db import connection

    from tests.support.gateway_server import GatewayServer

    team = team_setup["team_a"]
    with Receiver() as slow, FakeUpstream(models=("m",)) as fake:
        slow.plan = [("sleep", 5)] * 5
        webhook_create(team=team, name="slow", url=slow.url, events=["channel.cooled_down"])
        channel = channel_create(team=team, name="flaky", kind="remote", base_url=fake.base_url, model_id="m",
                                 credential_kind="none", max_retries=0)
        route_save(team=team, model_name="chat", entries=[(channel, 0, 1)])
        _, raw = key_issue(team=team, user=team_setup["alice"], name="svc")
        start_worker("default", TOKENWISE_WEBHOOK_TIMEOUT_SECONDS="10")
        gateway = GatewayServer(connection.settings_dict["NAME"])
        try:
            fake.behave("status_500", times=6)
            timings = []
            for _ in range(6):
                started = time.perf_counter()
                answer = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=30,
                                    headers={"Authorization": f"Bearer {raw}"},
                                    json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]})
                timings.append(time.perf_counter() - started)
                assert answer.status_code >= 500
            wait_until(lambda: len(slow.received) >= 1, seconds=30, message="the cooldown notice to be delivered")
        finally:
            gateway.stop()
    assert max(timings) < 1.0, timings  # the 5 s receiver never shows in a request
    note = Notification.objects.get(kind="channel.cooled_down")
    assert note.facts["channel"] == "flaky" and note.facts["failures"] == 3
    assert slow.bodies()[0]["event"] == "channel.cooled_down"


def test_announcing_a_cooldown_costs_the_gateway_no_waiting(team_setup, transactional_db, monkeypatch):
    """The gateway's call only queues the notice: with the recording held up, a thousand announcements return all
    the same (no database, no Redis, no HTTP on the caller's thread), and one notification follows."""
    from panel.notifications import cooldown

    team, release, recorded = team_setup["team_a"], threading.Event(), []
    original = cooldown.cooldown_record

    def held(*args):
        release.wait(60)
        recorded.append(args)
        return original(*args)

    monkeypatch.setattr(cooldown, "cooldown_record", held)
    caller = threading.Thread(target=lambda: [
        channel_cooled_down(team_id=team.pk, channel_id=12345, channel_name="flaky", failures=3, seconds=30)
        for _ in range(1000)])
    caller.start()
    caller.join(timeout=30)
    assert not caller.is_alive() and recorded == []  # all made while nothing was recorded yet
    assert not Notification.objects.filter(kind="channel.cooled_down").exists()
    release.set()
    wait_until(lambda: len(recorded) == 1000, seconds=60, message="the background thread to take every notice")
    assert Notification.objects.filter(kind="channel.cooled_down").count() == 1  # announced once, not 1000 times


def test_beat_finds_what_is_due_and_what_a_lost_worker_held(team_setup):
    from datetime import timedelta

    from django.utils import timezone

    from panel.notifications.delivery import delivery_attempt
    from panel.notifications.services import deliveries_due

    team = team_setup["team_a"]
    hook, _ = webhook_create(team=team, name="ops", url="http://127.0.0.1:9/hook")
    note = Notification.objects.create(team=team, kind="job.failed", title="x")
    now = timezone.now()
    due = Delivery.objects.create(webhook=hook, notification=note, next_attempt_at=now - timedelta(seconds=1))
    later = Delivery.objects.create(webhook=hook, notification=note, next_attempt_at=now + timedelta(minutes=5))
    held = Delivery.objects.create(webhook=hook, notification=note, next_attempt_at=now, state=DeliveryState.SENDING,
                                   claimed_until=now + timedelta(minutes=1))
    lost = Delivery.objects.create(webhook=hook, notification=note, next_attempt_at=now, state=DeliveryState.SENDING,
                                   claimed_until=now - timedelta(seconds=1))
    done = Delivery.objects.create(webhook=hook, notification=note, next_attempt_at=now,
                                   state=DeliveryState.DELIVERED)
    assert sorted(deliveries_due()) == sorted([due.pk, lost.pk])
    assert delivery_attempt(later.pk) is None and delivery_attempt(held.pk) is None  # not theirs to send now
    assert delivery_attempt(done.pk) is None
    assert Delivery.objects.get(pk=later.pk).attempts == 0


def test_the_webhooks_page_edits_a_webhook_and_refuses_a_bad_url(client, team_setup):
    hook, _ = webhook_create(team=team_setup["team_a"], name="ops", url="http://127.0.0.1:9/hook")
    client.force_login(team_setup["alice"])
    page = client.get("/webhooks/")
    assert page.status_code == 200 and f'id="id_{hook.pk}_url"' in page.content.decode()
    bad = client.post(f"/webhooks/{hook.pk}/edit/", {"name": "ops", "url": "ftp://x/hook", "format": "json"})
    assert bad.status_code == 400 and "must start with http" in bad.content.decode()
    done = client.post(f"/webhooks/{hook.pk}/edit/", {"name": "ops", "url": "https://hooks.example/x",
                                                     "format": "slack", "events": ["job.failed"], "enabled": "on"})
    assert done.status_code == 302
    hook.refresh_from_db()
    assert (hook.url, hook.format, hook.events, hook.enabled) == ("https://hooks.example/x", "slack", ["job.failed"],
                                                                   True)
    client.force_login(team_setup["vera"])
    assert client.post(f"/webhooks/{hook.pk}/edit/", {"name": "x", "url": "https://e/x", "format": "json"}
                       ).status_code == 403


def test_the_webhook_form_says_which_addresses_are_refused_before_it_is_sent(client, team_setup, settings):
    """A receiver on this machine or the local network was refused only after submitting the form."""
    settings.OUTBOUND_ALLOW_CIDRS = []
    client.force_login(team_setup["alice"])
    page = client.get("/webhooks/").content.decode()
    assert "is refused unless the operator lists its range in TOKENWISE_OUTBOUND_ALLOW (listed now: none)" in page
    settings.OUTBOUND_ALLOW_CIDRS = ["10.0.0.0/8"]
    assert "(listed now: 10.0.0.0/8)" in client.get("/webhooks/").content.decode()
