"""The overview page answers "how are we doing": this month's spend and requests, the local share, the savings
against the cloud baseline (the Cost tab's figures, last month left out), live deployments, and what is failing."""
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from panel.channels.models import Channel
from panel.dashboards.home import overview
from panel.dashboards.rollup import usage_rollup_run
from panel.hosts.models import WorkerHost
from panel.serving.models import Deployment
from panel.usage.models import RequestLog
from tests.support.advisor_objects import make_host, make_model, make_profile, serve

NOW = datetime(2026, 11, 15, 12, 0, tzinfo=dt_timezone.utc)


def rows(team, count, *, at, **fields):
    defaults = {"endpoint": "chat", "model": "chat", "status_code": 200, "outcome": "ok", "latency_ms": 100.0}
    RequestLog.objects.bulk_create([RequestLog(team=team, created_at=at, **{**defaults, **fields})
                                    for _ in range(count)])


@pytest.mark.django_db
def test_it_adds_up_this_month_only_and_lists_deployments_and_failures(team_setup):
    team = team_setup["team_a"]
    cloud = Channel.objects.create(team=team, name="taotoken", base_url="http://127.0.0.1:9/v1", model_id="m",
                                   price_input_per_million=Decimal("1"), price_output_per_million=Decimal("2"))
    model = make_model(team)
    deployment, local = serve(team, make_profile(team, model, "chat"), host=make_host("h200"))
    WorkerHost.objects.filter(host="h200").update(gpu_price_per_hour=Decimal("0.05"))
    Deployment.objects.filter(pk=deployment.pk).update(ready_at=NOW - timedelta(hours=10))
    rows(team, 100, at=NOW - timedelta(hours=1), channel=local, prompt_tokens=10_000)  # 1M local tokens
    rows(team, 10, at=NOW - timedelta(hours=1), channel=cloud, prompt_tokens=100_000, cost=Decimal("0.1"))
    rows(team, 5, at=NOW - timedelta(hours=1), channel=cloud, outcome="error", status_code=502)
    rows(team, 10, at=datetime(2026, 10, 31, 23, 0, tzinfo=dt_timezone.utc), channel=cloud,
         prompt_tokens=100_000, cost=Decimal("0.1"))  # last month: not this month's
    failed, _ = serve(team, make_profile(team, model, "broken"), state="failed")
    Deployment.objects.filter(pk=failed.pk).update(finished_at=NOW - timedelta(days=1),
                                                   failure_reason="the engine exited: out of memory\nTraceback ...")
    old, _ = serve(team, make_profile(team, model, "old"), state="failed")
    Deployment.objects.filter(pk=old.pk).update(finished_at=NOW - timedelta(days=8))  # before the last 7 days
    Channel.objects.create(team=team, name="cloud-down", base_url="http://no-such-host.invalid/v1", model_id="m",
                           last_test={"ok": False, "diagnosis": "no-such-host.invalid does not resolve"})
    usage_rollup_run(lock=False)

    summary = overview(team=team, now=NOW.timestamp())
    month = summary.month
    assert month.name == "November 2026"
    assert (month.requests, month.errors) == (115, 5)
    assert month.spend == pytest.approx(0.05 * 10 + 1.0)  # ten GPU hours at 0.05, and the cloud's charges
    assert month.local_share == pytest.approx(0.5)
    # All cloud: the cloud's 1.00 and the local million tokens at taotoken's 1 per million.
    assert month.savings == pytest.approx(2.0 - 1.5) and month.savings_share == pytest.approx(0.25)
    assert month.baseline_name == "taotoken" and month.missing_prices == []
    assert [item.pk for item in summary.deployments] == [deployment.pk]
    assert [(item.what, item.why, item.link) for item in summary.attention] == [
        ("Channel cloud-down", "its last Test failed: no-such-host.invalid does not resolve",
         reverse("channel_detail", args=[Channel.objects.get(name="cloud-down").pk])),
        (f"Deployment #{failed.pk} failed", "the engine exited: out of memory",
         reverse("deployment_detail", args=[failed.pk]))]


@pytest.mark.django_db
def test_a_deployment_whose_engine_counted_more_than_was_charged_needs_attention(team_setup):
    from panel.dashboards.models import EngineSample

    team = team_setup["team_a"]
    deployment, local = serve(team, make_profile(team, make_model(team), "chat"), host=make_host("h1"))
    rows(team, 10, at=NOW - timedelta(hours=1), channel=local, prompt_tokens=900, completion_tokens=100)
    EngineSample.objects.create(deployment=deployment, team=team, at=NOW - timedelta(hours=1), seconds=10,
                                prompt_tokens=10_000, generation_tokens=2_500)  # 12,500 counted, 10,000 charged
    usage_rollup_run(lock=False)
    [item] = overview(team=team, now=NOW.timestamp()).attention
    assert item.what == f"Deployment #{deployment.pk}: ledger differs by +20.0%"
    assert item.why.startswith("the engine served 20.0% more tokens than the gateway recorded")
    assert item.link == reverse("dashboards_cost") + f"?range=24h&deployment={deployment.pk}"


@pytest.mark.django_db
def test_the_hourly_ledger_check_notifies_a_difference_once_and_webhooks_get_it(team_setup):
    from panel.dashboards.ledger import ledgers_check
    from panel.dashboards.models import EngineSample
    from panel.notifications.models import Delivery, EventKind, Notification, Webhook

    team = team_setup["team_a"]
    Webhook.objects.create(team=team, name="ops", url="https://ops.example/hook", secret_ciphertext="x",
                           secret_last4="abcd", events=[EventKind.LEDGER_MISMATCH])
    deployment, local = serve(team, make_profile(team, make_model(team), "chat"), host=make_host("h1"))
    in_hour = NOW - timedelta(minutes=30)  # the hour to NOW, which the check at NOW + 5 minutes reads
    rows(team, 10, at=in_hour, channel=local, prompt_tokens=900, completion_tokens=100)
    EngineSample.objects.create(deployment=deployment, team=team, at=in_hour, seconds=10, prompt_tokens=9_000,
                                generation_tokens=1_050)  # 10,050 counted, 10,000 charged: 0.5%, within 1%
    usage_rollup_run(lock=False)
    check_at = NOW.timestamp() + 300
    assert ledgers_check(now=check_at) == []
    EngineSample.objects.create(deployment=deployment, team=team, at=in_hour, seconds=10, prompt_tokens=2_000)
    [note] = ledgers_check(now=check_at)  # 12,050 counted: 17.0% more than charged
    assert note.kind == EventKind.LEDGER_MISMATCH and note.facts["deployment_id"] == deployment.pk
    assert note.facts["difference_percent"] == pytest.approx(17.01, abs=0.01)
    assert "differs from the usage rows by +17.0% in the hour to 12:00 UTC" in note.title
    assert Delivery.objects.filter(notification=note).count() == 1
    assert ledgers_check(now=check_at) == [] and Notification.objects.count() == 1  # once per hour


@pytest.mark.django_db
def test_a_local_host_without_a_price_makes_the_spend_unknown_not_zero(team_setup):
    team = team_setup["team_a"]
    deployment, local = serve(team, make_profile(team, make_model(team), "chat"), host=make_host("h200"))
    Deployment.objects.filter(pk=deployment.pk).update(ready_at=NOW - timedelta(hours=2))
    rows(team, 3, at=NOW - timedelta(hours=1), channel=local, prompt_tokens=100)
    usage_rollup_run(lock=False)
    month = overview(team=team, now=NOW.timestamp()).month
    assert month.spend is None and month.savings is None and month.missing_prices == ["h200"]
    assert not month.dearer and month.savings_shown is None


@pytest.mark.django_db
def test_local_serving_dearer_than_the_cloud_says_so(team_setup):
    team = team_setup["team_a"]
    Channel.objects.create(team=team, name="taotoken", base_url="http://127.0.0.1:9/v1", model_id="m",
                           price_input_per_million=Decimal("1"))
    deployment, local = serve(team, make_profile(team, make_model(team), "chat"), host=make_host("h200"))
    WorkerHost.objects.filter(host="h200").update(gpu_price_per_hour=Decimal("2"))
    Deployment.objects.filter(pk=deployment.pk).update(ready_at=NOW - timedelta(hours=3))
    rows(team, 10, at=NOW - timedelta(hours=1), channel=local, prompt_tokens=1000)
    usage_rollup_run(lock=False)
    month = overview(team=team, now=NOW.timestamp()).month
    assert month.dearer and month.savings_shown == pytest.approx(6.0 - 0.01)


@pytest.mark.django_db
def test_the_page_shows_the_month_deployments_and_what_needs_attention(client, team_setup):
    team = team_setup["team_a"]
    client.force_login(team_setup["vera"])  # a viewer sees the overview too
    empty = client.get(reverse("home")).content.decode()
    assert "Spent this month" in empty and "None yet" in empty and "Nothing is failing" in empty
    assert "Nothing is served locally" in empty
    assert empty.count('href="/dashboards/cost/?range=30d"') == 3  # spend, local share, savings: the Cost tab

    model = make_model(team)
    make_profile(team, model, "split", tensor_parallel_size=3)  # the advisor calls that a problem (28 heads)
    deployment, _ = serve(team, make_profile(team, model, "chat"), host=make_host("h200"))
    failed, _ = serve(team, make_profile(team, model, "broken"), state="failed")
    Deployment.objects.filter(pk=failed.pk).update(finished_at=timezone.now(), failure_reason="out of memory")
    page = client.get(reverse("home")).content.decode()
    assert f'href="/serving/deployments/{deployment.pk}/">chat #{deployment.pk}</a>' in page
    assert f"Deployment #{failed.pk} failed" in page and "out of memory" in page
    assert "Advisor: 1 problem" in page and "tensor_parallel_size 3 does not divide the heads" in page
    assert "Nothing is failing" not in page


def test_a_failed_evaluation_run_is_listed_with_a_link_to_its_page(client, team_setup):
    from panel.evaluations.models import EvalRun
    from panel.evaluations.services import starter_set_add

    team = team_setup["team_a"]
    eval_set = starter_set_add(team=team, user=team_setup["alice"])
    run = EvalRun.objects.create(team=team, eval_version=eval_set.current(), state="failed",
                                 finished_at=timezone.now(), failure_reason="the route answered 502 to every case",
                                 candidate={"kind": "route", "id": 1, "label": "support-bot"})
    client.force_login(team_setup["alice"])
    page = client.get(reverse("home"))
    assert page.status_code == 200
    text = page.content.decode()
    assert f"Evaluation run #{run.pk} failed" in text and reverse("eval_run_detail", args=[run.pk]) in text
