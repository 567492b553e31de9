"""Dashboards: rollups equal the raw records they summarize (also after a late record, and twice over), percentiles
from buckets, the cost math against hand-computed values, the pages, their JSON and CSV, bad parameters, an empty
team, and the panel's own /metrics."""
import csv
import html
import io
import random
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import plotly.graph_objects as go
import pytest
from django.urls import reverse

from panel.accounts.keys import key_issue
from panel.channels.models import Channel
from panel.dashboards.cost import cost_summary
from panel.dashboards.models import DAY, HOUR, LATENCY_COLUMNS, MINUTE, TTFT_COLUMNS, UsageRollup
from panel.dashboards.pages import TABS, dashboard_page
from panel.dashboards.rollup import bucket_of, usage_rollup_run
from panel.dashboards.selectors import DashboardQuery, percentile_from_buckets
from panel.hosts.models import WorkerHost
from panel.usage.models import RequestLog
from tests.support import dashboards as dashboard_data
from tests.support.dashboards import NOW, make_deployment


@pytest.fixture(autouse=True)
def clock(monkeypatch):
    """NOW is each test's start, not the module's import: a slow run reaches these tests long after collection,
    and 40 minutes later a record from "half an hour before NOW" fell out of the last hour."""
    now = datetime.now(timezone.utc)
    monkeypatch.setattr(dashboard_data, "NOW", now)
    monkeypatch.setitem(globals(), "NOW", now)


@pytest.fixture
def traffic(team_setup):
    team = team_setup["team_a"]
    deployment = make_deployment(team, price=Decimal("2.5"), gpu_count=2)
    local = Channel.objects.create(team=team, name="local", kind="local", deployment=deployment,
                                   base_url=deployment.base_url, model_id="tiny-chat")
    cloud = Channel.objects.create(team=team, name="cloud", kind="remote", base_url="http://cloud/v1", model_id="c",
                                   price_input_per_million=Decimal("0.8"), price_output_per_million=Decimal("2.4"),
                                   price_cached_per_million=Decimal("0.2"))
    keys = [key_issue(team=team, user=None, name=name)[0] for name in ("web", "batch")]
    return {"team": team, "deployment": deployment, "local": local, "cloud": cloud, "keys": keys, **team_setup}


def write_records(traffic, count, *, hours=3, seed=7):
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        channel = rng.choice([traffic["local"], traffic["cloud"], None])
        failed = rng.random() < 0.1
        prompt = rng.randint(0, 3000)
        rows.append(RequestLog(
            team=traffic["team"], key=rng.choice(traffic["keys"]), channel=channel,
            created_at=NOW - timedelta(seconds=rng.uniform(0, hours * 3600)), endpoint="chat",
            model=rng.choice(["tiny-chat", "c"]), status_code=(404 if channel is None else 502) if failed else 200,
            outcome="error" if failed else rng.choice(["ok", "ok", "client_closed"]), fell_back=rng.random() < 0.2,
            prompt_tokens=prompt, completion_tokens=rng.randint(0, 500), cached_tokens=rng.randint(0, prompt),
            cache_write_tokens=rng.choice([None, rng.randint(0, prompt)]),
            ttft_ms=None if failed else rng.choice([rng.uniform(1, 100_000), 25.0, 60000.0]),
            latency_ms=rng.uniform(1, 120_000), cost=Decimal(rng.randint(0, 10**6)) / 10**8))
    RequestLog.objects.bulk_create(rows)


def expected_rollups(team, period):
    """The rollup computed the slow way from every raw record."""
    want = {}
    for row in RequestLog.objects.filter(team=team):
        start = int(row.created_at.timestamp() // period * period)
        group = want.setdefault((start, row.channel_id, row.key_id, row.model), {
            "requests": 0, "errors": 0, "refused": 0, "fallbacks": 0, "prompt_tokens": 0, "completion_tokens": 0,
            "cached_tokens": 0, "cache_write_tokens": 0, "cost": Decimal(0), "ttft_count": 0, "ttft": [0] * 16,
            "latency": [0] * 16})
        group["requests"] += 1
        group["errors"] += row.outcome == "error"
        group["refused"] += row.outcome == "error" and 400 <= row.status_code < 500
        group["fallbacks"] += row.fell_back
        group["prompt_tokens"] += row.prompt_tokens
        group["completion_tokens"] += row.completion_tokens
        group["cached_tokens"] += row.cached_tokens
        group["cache_write_tokens"] += row.cache_write_tokens or 0
        group["cost"] += row.cost
        if row.ttft_ms is not None:
            group["ttft_count"] += 1
            group["ttft"][bucket_of(row.ttft_ms)] += 1
        group["latency"][bucket_of(row.latency_ms)] += 1
    return want


def stored_rollups(team, period):
    got = {}
    for row in UsageRollup.objects.filter(team=team, period=period):
        key = (row.start, row.channel_id, row.key_id, row.model)
        assert key not in got, f"two rollup rows for {key}"
        got[key] = {"requests": row.requests, "errors": row.errors, "refused": row.refused, "fallbacks": row.fallbacks,
                    "prompt_tokens": row.prompt_tokens, "completion_tokens": row.completion_tokens,
                    "cached_tokens": row.cached_tokens, "cache_write_tokens": row.cache_write_tokens,
                    "cost": Decimal(str(round(row.cost, 8))),
                    "ttft_count": row.ttft_count, "ttft": [getattr(row, c) for c in TTFT_COLUMNS],
                    "latency": [getattr(row, c) for c in LATENCY_COLUMNS]}
    return got


def assert_rollups_match(team):
    for period in (MINUTE, HOUR, DAY):
        want, got = expected_rollups(team, period), stored_rollups(team, period)
        assert set(got) == set(want), period
        for key, values in want.items():
            values["cost"] = values["cost"].quantize(Decimal("0.00000001"))
            assert got[key] == values, (period, key)


def test_it_rolls_up_to_exactly_the_raw_records_and_a_late_record_lands_in_its_minute(traffic):
    write_records(traffic, 1500)
    assert usage_rollup_run() == 1500
    assert_rollups_match(traffic["team"])
    before = stored_rollups(traffic["team"], MINUTE)
    assert usage_rollup_run() == 0  # nothing new: nothing read
    from panel.dashboards.rollup import usage_rollup_minutes

    usage_rollup_minutes(team_id=traffic["team"].pk, minutes=[start for start, *_ in before])  # recomputed...
    assert stored_rollups(traffic["team"], MINUTE) == before  # ...nothing changes

    # A record that arrives late (a new id, a created_at two hours back) and one in a minute nobody had yet.
    late_at = NOW - timedelta(hours=2, seconds=17)
    RequestLog.objects.create(team=traffic["team"], key=traffic["keys"][0], channel=traffic["cloud"],
                              created_at=late_at, endpoint="chat", model="c", status_code=200, outcome="ok",
                              prompt_tokens=11, completion_tokens=5, ttft_ms=30, latency_ms=40, cost=Decimal("0.5"))
    RequestLog.objects.create(team=traffic["team_b"], created_at=NOW - timedelta(days=20), endpoint="chat",
                              model="x", status_code=200, outcome="ok", latency_ms=5)
    usage_rollup_run()
    assert_rollups_match(traffic["team"])
    assert_rollups_match(traffic["team_b"])
    minute = int(late_at.timestamp() // 60 * 60)
    assert UsageRollup.objects.filter(team=traffic["team"], period=MINUTE, start=minute, channel=traffic["cloud"],
                                      key=traffic["keys"][0], model="c").get().requests >= 1
    # Deployment and local flag come from the channel.
    assert set(UsageRollup.objects.filter(channel=traffic["local"]).values_list("deployment_id", "local")) == {
        (traffic["deployment"].pk, True)}


def test_it_reads_percentiles_from_the_buckets():
    counts = [0] * 16
    assert percentile_from_buckets(counts, 0.5) is None
    counts[bucket_of(80)] = 10  # ten requests in (50, 100]
    assert percentile_from_buckets(counts, 0.5) == 75.0
    assert percentile_from_buckets(counts, 1.0) == 100.0
    counts[15] = 10  # ten beyond the last bound: the open bucket answers its lower bound
    assert percentile_from_buckets(counts, 0.99) == 60000.0
    assert bucket_of(25) == 0 and bucket_of(25.01) == 1 and bucket_of(10**9) == 15


def test_it_computes_the_cost_page_as_by_hand(traffic):
    team, local, cloud = traffic["team"], traffic["local"], traffic["cloud"]
    # Local: 100 M prompt tokens (60 M cached) and 30 M completion tokens; cloud: 5.00 recorded.
    for _ in range(10):
        RequestLog.objects.create(team=team, channel=local, created_at=NOW - timedelta(hours=1), endpoint="chat",
                                  model="tiny-chat", status_code=200, outcome="ok", prompt_tokens=10_000_000,
                                  completion_tokens=3_000_000, cached_tokens=6_000_000, latency_ms=100)
    RequestLog.objects.create(team=team, channel=cloud, created_at=NOW - timedelta(hours=2), endpoint="chat",
                              model="c", status_code=200, outcome="ok", prompt_tokens=1_000_000,
                              completion_tokens=1_000_000, latency_ms=100, cost=Decimal("5"))
    usage_rollup_run()
    query = DashboardQuery(team=team, range="24h", now=NOW.timestamp())
    summary = cost_summary(query)
    (local_line,) = [line for line in summary.lines if line.kind == "local"]
    # The deployment is up 10 h of the range on 2 GPUs at 2.50 an hour: 50.00.
    assert local_line.gpu_hours == pytest.approx(10, abs=1e-6)
    assert local_line.hourly == 5.0 and local_line.cost == pytest.approx(50)
    assert local_line.per_million == pytest.approx(50 / 130)
    # Baseline: 40 M uncached at 0.8 + 60 M cached at 0.2 + 30 M out at 2.4 = 32 + 12 + 72 = 116; plus cloud's 5.
    assert summary.baseline_channel == cloud
    assert local_line.baseline == pytest.approx(116)
    assert summary.actual == pytest.approx(55) and summary.all_cloud == pytest.approx(121)
    assert summary.savings == pytest.approx(66) and summary.savings_share == pytest.approx(66 / 121)
    span = query.end - query.start
    assert summary.monthly_savings == pytest.approx(66 * 30 * 86400 / span)
    assert summary.per_million("remote") == pytest.approx(5 / 2)
    # Break-even: 5.00 an hour / (116 / 130 M tokens) = 5,603,448 tokens an hour.
    assert summary.break_even_tokens_per_hour == pytest.approx(5 / (116 / 130e6))
    # A key filter splits a deployment's GPU cost by that key's share of its tokens (here: no tokens → 0).
    key_query = DashboardQuery(team=team, range="24h", now=NOW.timestamp(), key_id=traffic["keys"][0].pk)
    assert [line for line in cost_summary(key_query).lines if line.kind == "local"] == []
    # Without a GPU price the local cost is unknown, and the page says where to set it.
    WorkerHost.objects.update(gpu_price_per_hour=None)
    page = dashboard_page(tab="cost", query=query)
    assert "No GPU price on: h" in page.table("cost").note
    assert cost_summary(query).lines[0].cost is None


def test_the_cost_tab_shows_cache_reads_and_writes_by_channel_and_prices_the_baseline_with_them(traffic):
    team, local, cloud = traffic["team"], traffic["local"], traffic["cloud"]
    cloud.price_cache_write_per_million = Decimal("1.0")
    cloud.save()
    for _ in range(2):  # an agent's turns through a provider with a prompt cache: 300 read and 500 written of 1,000
        RequestLog.objects.create(team=team, channel=cloud, created_at=NOW - timedelta(minutes=5), endpoint="messages",
                                  model="c", status_code=200, outcome="ok", prompt_tokens=1000, cached_tokens=300,
                                  cache_write_tokens=500, completion_tokens=100, latency_ms=100, cost=Decimal("1"))
    RequestLog.objects.create(team=team, channel=local, created_at=NOW - timedelta(minutes=5), endpoint="messages",
                              model="tiny-chat", status_code=200, outcome="ok", prompt_tokens=1000, cached_tokens=0,
                              cache_write_tokens=1000, completion_tokens=0, latency_ms=100)
    usage_rollup_run()
    query = DashboardQuery(team=team, range="1h", now=NOW.timestamp())
    table = dashboard_page(tab="cost", query=query).table("cost")
    rows = {row[0]: dict(zip(table.columns, row)) for row in table.rows}
    assert (rows["cloud"]["cached prompt tokens"], rows["cloud"]["cache writes"]) == (600, 1000)
    assert rows["local"]["cache writes"] == 1000
    # The local tokens at the cloud's prices: 1,000 written to its cache at 1.0 per million
    (local_line,) = [line for line in cost_summary(query).lines if line.kind == "local"]
    assert local_line.baseline == pytest.approx(1000 * 1.0 / 1e6)
    overview = dashboard_page(tab="overview", query=query).table("channels")
    assert {row[0]: dict(zip(overview.columns, row))["cache writes"] for row in overview.rows} == {
        "cloud": 1000, "local": 1000}


def test_reasoning_tokens_are_rolled_up_and_shown_by_channel_where_upstreams_report_them(traffic):
    team, cloud = traffic["team"], traffic["cloud"]
    for reasoning in (700, None):  # a reasoning model's answer says how much of it was reasoning; another does not
        RequestLog.objects.create(team=team, channel=cloud, created_at=NOW - timedelta(minutes=5), endpoint="chat",
                                  model="c", status_code=200, outcome="ok", prompt_tokens=100, completion_tokens=900,
                                  reasoning_tokens=reasoning, latency_ms=100, cost=Decimal("1"))
    usage_rollup_run()
    query = DashboardQuery(team=team, range="1h", now=NOW.timestamp())
    rows = {row[0]: dict(zip(table.columns, row))
            for table in [dashboard_page(tab="cost", query=query).table("cost")] for row in table.rows}
    assert rows["cloud"]["reasoning tokens"] == 700 and rows["cloud"]["tokens"] == 2000
    overview = dashboard_page(tab="overview", query=query).table("channels")
    assert {row[0]: dict(zip(overview.columns, row))["reasoning tokens"] for row in overview.rows}["cloud"] == 700


def test_the_ledger_sets_each_engines_token_counts_against_the_usage_rows_and_names_a_difference(traffic):
    from panel.dashboards.ledger import deployment_ledger
    from panel.dashboards.models import EngineSample
    from panel.serving.models import Deployment

    team, local = traffic["team"], traffic["local"]
    other = Deployment.objects.get(pk=traffic["deployment"].pk)
    other.pk, other.base_url = None, "http://127.0.0.1:10/v1"  # a second deployment of the same profile
    other.save()
    other_channel = Channel.objects.create(team=team, name="other", kind="local", deployment=other,
                                           base_url=other.base_url, model_id="tiny-chat")
    for channel, completion in ((local, 400), (other_channel, 400)):
        for minute in (5, 6):  # 2 x (1,000 + 400) tokens charged through the gateway
            RequestLog.objects.create(team=team, channel=channel, created_at=NOW - timedelta(minutes=minute),
                                      endpoint="chat", model="tiny-chat", status_code=200, outcome="ok",
                                      prompt_tokens=1000, completion_tokens=completion, latency_ms=100)
    # The engine of `local` counted what the rows say (2,800 tokens, and 10 more: 0.4%); the other one served
    # 700 tokens more than anyone was charged (a client that left before its usage, say).
    for deployment, prompt, generation in ((traffic["deployment"], 2000, 810), (other, 2700, 800)):
        EngineSample.objects.create(deployment=deployment, team=team, at=NOW - timedelta(minutes=4), seconds=10,
                                    prompt_tokens=prompt, generation_tokens=generation)
    usage_rollup_run()
    query = DashboardQuery(team=team, range="1h", now=NOW.timestamp())
    differs, agrees = deployment_ledger(query)
    assert (differs.deployment_id, differs.engine_tokens, differs.recorded_tokens) == (other.pk, 3500, 2800)
    assert round(differs.difference_percent, 1) == 20.0 and not differs.agrees
    assert differs.words.startswith("the engine served 20.0% more tokens than the gateway recorded")
    assert agrees.deployment_id == traffic["deployment"].pk and agrees.agrees and agrees.words == "agrees"
    table = dashboard_page(tab="cost", query=query).table("ledger")
    rows = {row[0]: dict(zip(table.columns, row)) for row in table.rows}
    assert [row["difference"] for row in rows.values()] == ["+20.0%", "+0.4%"]


def test_a_stopped_deployments_gpu_hours_stop_at_its_stop_time(traffic):
    """Stopping ends a deployment's job like any job's: its finished_at is its stop time, and the Cost tab charges
    GPU hours up to it, not to the end of the range."""
    from panel.jobs.services import job_cancelled
    from panel.serving.services import deployment_stop

    team, local, deployment = traffic["team"], traffic["local"], traffic["deployment"]  # ready for 10 h
    RequestLog.objects.create(team=team, channel=local, created_at=NOW - timedelta(hours=1), endpoint="chat",
                              model="tiny-chat", status_code=200, outcome="ok", prompt_tokens=1000,
                              completion_tokens=100, latency_ms=100)
    usage_rollup_run()
    assert deployment_stop(deployment=deployment, user=traffic["alice"])
    assert job_cancelled(deployment, reason="engine stopped")  # what the supervisor says once the engine is gone
    deployment.refresh_from_db()
    assert deployment.state == "stopped" and deployment.finished_at is not None
    assert abs((datetime.now(timezone.utc) - deployment.finished_at).total_seconds()) < 60  # stopped just now
    up_hours = (deployment.finished_at - deployment.ready_at).total_seconds() / 3600
    assert 10 <= up_hours < 10.5  # it became ready 10 h before the suite's NOW
    later = DashboardQuery(team=team, range="24h", now=(NOW + timedelta(hours=6)).timestamp())  # 6 h after the stop
    (line,) = [line for line in cost_summary(later).lines if line.kind == "local"]  # the Cost tab's numbers
    assert line.gpu_hours == pytest.approx(up_hours, abs=1e-6)
    assert line.cost == pytest.approx(up_hours * 5.0)


def test_it_uses_the_deployments_gpus_before_the_hosts_count(team_setup):
    from panel.dashboards.cost import deployment_up_hours

    deployment = make_deployment(team_setup["team_a"], price=Decimal("3"), gpu_count=8, gpu_indices=(0, 1))
    assert deployment.hourly_price() == 6.0
    stopped_at = NOW - timedelta(hours=4)
    deployment.finished_at = stopped_at
    assert deployment_up_hours(deployment, since=(NOW - timedelta(hours=5)).timestamp(),
                               until=NOW.timestamp()) == pytest.approx(1)


def signed_in(client, user):
    client.force_login(user)
    return client


def test_it_explains_an_empty_team_and_refuses_bad_parameters(client, traffic):
    client = signed_in(client, traffic["bob"])  # team B has no traffic
    page = client.get(reverse("dashboards"))
    assert page.status_code == 200 and "No traffic from this team yet" in page.content.decode()
    client = signed_in(client, traffic["alice"])
    for params, words in (({"range": "2h"}, "range must be one of 1h, 24h, 7d, 30d"),
                          ({"channel": "abc"}, "channel must be the id"),
                          ({"key": "999999"}, "no key with id 999999"),
                          ({"colour": "red"}, "unknown parameter 'colour'")):
        response = client.get(reverse("dashboards_latency"), params)
        assert response.status_code == 400 and words in html.unescape(response.content.decode()), params
    other = Channel.objects.create(team=traffic["team_b"], name="theirs", base_url="http://x/v1", model_id="x")
    assert client.get(reverse("dashboards"), {"channel": other.pk}).status_code == 400
    response = client.get(reverse("dashboards_data"), {"tab": "nope"})
    assert response.status_code == 400 and "tab must be one of" in response.json()["error"]
    response = client.get(reverse("dashboards_csv"), {"tab": "cost", "table": "nope"})
    assert response.status_code == 400 and "has no table 'nope'" in response.content.decode()


def test_it_serves_every_tab_its_json_and_every_table_as_csv(client, traffic):
    write_records(traffic, 400, hours=0.5)  # well inside the 1 h range, however long the tabs take
    usage_rollup_run()
    client = signed_in(client, traffic["vera"])  # a viewer reads dashboards
    for tab, url in (("overview", "dashboards"), ("latency", "dashboards_latency"), ("cache", "dashboards_cache"),
                     ("cost", "dashboards_cost"), ("agents", "dashboards_agents")):
        for range_ in ("1h", "24h", "7d", "30d"):
            page = client.get(reverse(url), {"range": range_})
            assert page.status_code == 200, (tab, range_)
            assert "plotly/plotly.min.js" in page.content.decode()
        data = client.get(reverse("dashboards_data"), {"tab": tab, "range": "1h"}).json()
        assert data["figures"] and "Export CSV" in data["tables"]
        for figure in data["figures"].values():
            go.Figure(figure)  # plotly's own validation: an unknown key or a bad value raises
        tables = dashboard_page(tab=tab, query=DashboardQuery(team=traffic["team"], range="1h")).tables
        for table in tables:
            response = client.get(reverse("dashboards_csv"), {"tab": tab, "table": table.name, "range": "1h"})
            assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
            rows = list(csv.reader(io.StringIO(response.content.decode())))
            assert rows[0] == table.columns and len(rows) == len(table.rows) + 1
    overview = client.get(reverse("dashboards_data"), {"tab": "overview", "range": "1h"}).json()
    requests = overview["figures"]["requests"]
    assert sum(len(trace["x"]) for trace in requests["data"]) > 0
    assert {trace["name"] for trace in requests["data"]} == {"local", "cloud", "(none: refused before a channel)"}
    channels = dashboard_page(tab="overview", query=DashboardQuery(team=traffic["team"], range="1h")).table("channels")
    assert sum(row[1] for row in channels.rows) == 400
    filtered = client.get(reverse("dashboards_data"), {"tab": "overview", "range": "1h",
                                                       "channel": traffic["cloud"].pk}).json()
    assert {trace["name"] for trace in filtered["figures"]["requests"]["data"]} == {"cloud"}
    assert set(TABS) == {"overview", "latency", "cache", "cost", "agents"}


def test_it_exposes_the_gateways_own_metrics(client, settings):
    from panel.gateway import metrics

    metrics.gateway_request_observe(fields={"endpoint": "chat", "model": "m1", "status_code": 200, "outcome": "ok",
                                            "prompt_tokens": 3, "completion_tokens": 2, "ttft_ms": 120,
                                            "latency_ms": 300}, fell_back=True)
    metrics.gateway_request_observe(fields={"endpoint": "chat", "model": "m1", "status_code": 502,
                                            "outcome": "error", "error_kind": "upstream_5xx", "latency_ms": 50},
                                    fell_back=False, trail=[
                                        {"channel": "busy-engine", "outcome": "spilled"},  # passed by: no attempt
                                        {"channel": "cloud-metrics-test", "outcome": "upstream_5xx"},
                                        {"channel": "cloud-metrics-test", "outcome": "upstream_5xx"}])
    text = client.get("/metrics").content.decode()
    assert 'tokenwise_gateway_attempt_failures_total{channel="cloud-metrics-test",outcome="upstream_5xx"} 2.0' in text
    assert 'channel="busy-engine"' not in text
    assert 'tokenwise_gateway_requests_total{endpoint="chat",model="m1",outcome="ok"}' in text
    assert 'tokenwise_gateway_errors_total{endpoint="chat",kind="upstream_5xx",model="m1"}' in text
    assert 'tokenwise_gateway_fallbacks_total{endpoint="chat",model="m1"}' in text
    assert 'tokenwise_gateway_time_to_first_token_seconds_bucket{le="0.2",model="m1"}' in text
    settings.METRICS_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200


def test_it_lets_admins_set_a_hosts_gpu_price_on_the_workers_page(client, team_setup):
    host = WorkerHost.objects.create(name="gpu@box", host="box", kind="gpu")
    client.force_login(team_setup["alice"])  # a team's owner: the price counts in every team's costs
    assert 'id="gpu-prices"' not in client.get(reverse("hosts")).content.decode()
    assert client.post(reverse("host_price", args=[host.pk]), {"gpu_price_per_hour": "9"}).status_code == 403
    team_setup["alice"].is_superuser = True
    team_setup["alice"].save()
    assert 'id="gpu-prices"' in client.get(reverse("hosts")).content.decode()
    response = client.post(reverse("host_price", args=[host.pk]), {"gpu_price_per_hour": "2.75", "gpu_count": "4"},
                           follow=True)
    assert "box: 2.75 per GPU-hour" in response.content.decode()
    from panel.audit.models import AuditAction, AuditEvent
    assert AuditEvent.objects.get(action=AuditAction.SETTING_CHANGED).detail["price"] == "None → 2.75"
    host.refresh_from_db()
    assert (host.gpu_price_per_hour, host.gpu_count) == (Decimal("2.75"), 4)
    response = client.post(reverse("host_price", args=[host.pk]), {"gpu_price_per_hour": "-1", "gpu_count": "0"},
                           follow=True)
    assert "was not changed" in response.content.decode()
    host.refresh_from_db()
    assert (host.gpu_price_per_hour, host.gpu_count) == (Decimal("2.75"), 4)  # nothing written
    client.post(reverse("host_price", args=[host.pk]), {"gpu_price_per_hour": "", "gpu_count": ""})
    host.refresh_from_db()
    assert (host.gpu_price_per_hour, host.gpu_count) == (None, None)
    client.force_login(team_setup["vera"])  # a viewer sees no form and may not post
    assert 'id="gpu-prices"' not in client.get(reverse("hosts")).content.decode()
    assert client.post(reverse("host_price", args=[host.pk]), {"gpu_price_per_hour": "1"}).status_code == 403


def test_it_seeds_usage_both_ways_and_the_rollup_still_matches(team_setup):
    from panel.dashboards.seed import usage_seed, usage_seed_sql

    team = team_setup["team_a"]
    usage_seed(team=team, count=300, days=1)
    usage_seed_sql(team=team, count=700, days=1, chunk=500)
    records = RequestLog.objects.filter(team=team)
    assert records.count() == 1000
    assert set(records.values_list("model", flat=True)) == {"qwen2.5-14b-awq", "qwen2.5-14b-instruct", "deepseek-v3"}
    assert not records.filter(model="qwen2.5-14b-awq", cost__gt=0).exists()  # local tokens cost no channel price
    cloud = records.exclude(model="qwen2.5-14b-awq").filter(outcome="ok").first()
    assert cloud.cost == cloud.channel.cost(cloud.prompt_tokens, cloud.completion_tokens, cloud.cached_tokens)
    usage_rollup_run()
    assert_rollups_match(team)


def test_the_cost_figures_write_money_as_plain_decimals(traffic):
    """Plotly's default axis wrote 0.0008 as "800μ"; the money axes are plain decimals."""
    RequestLog.objects.create(team=traffic["team"], channel=traffic["cloud"], created_at=NOW - timedelta(minutes=5),
                              endpoint="chat", model="c", status_code=200, outcome="ok", prompt_tokens=1000,
                              completion_tokens=100, latency_ms=100, cost=Decimal("0.0008"))
    usage_rollup_run()
    page = dashboard_page(tab="cost", query=DashboardQuery(team=traffic["team"], range="1h", now=NOW.timestamp()))
    for name in ("per_million", "savings"):
        axis = go.Figure(page.figures[name]).layout.yaxis
        assert (axis.tickformat, axis.exponentformat) == (",.6~f", "none"), name


def test_a_requests_detail_names_its_rule_its_deployment_and_a_cost_not_known_yet(client, traffic):
    """A local request's detail said "Cost 0.000000" where the Cost tab said "unknown", and did not say which rule
    matched or which replica answered."""
    from panel.channels.models import Route, RouteRule

    team, local = traffic["team"], traffic["local"]
    rule = RouteRule.objects.create(route=Route.objects.create(team=team, model_name="tiny-chat"), name="long prompts")
    row = RequestLog.objects.create(team=team, channel=local, route_rule=rule, created_at=NOW, endpoint="chat",
                                    model="tiny-chat", status_code=200, outcome="ok", prompt_tokens=10,
                                    completion_tokens=5, latency_ms=10, request_id="req_local0000000000000001")
    client.force_login(traffic["vera"])
    page = client.get(reverse("request_detail", args=[row.request_id])).content.decode()
    link = reverse("deployment_detail", args=[local.deployment_id])
    assert "long prompts" in page and f'deployment <a href="{link}">' in page
    assert "not known yet: a local request's share of its deployment's GPU time" in page
    assert "reasoning" not in page and "estimated:" not in page
    RequestLog.objects.filter(pk=row.pk).update(gpu_cost=Decimal("0.00042"), cost=Decimal("0.00042"),
                                                reasoning_tokens=3, tokens_estimated="completion")
    page = client.get(reverse("request_detail", args=[row.request_id])).content.decode()
    assert "0.000420" in page and "its share of the GPU time" in page and "not known yet" not in page
    assert "5 out (of them 3 reasoning)" in page and "(estimated: completion)" in page


def test_the_clients_own_refusals_are_shown_apart_from_the_error_rate_and_cost_nothing(traffic):
    team, cloud = traffic["team"], traffic["cloud"]
    common = {"team": team, "endpoint": "chat", "model": "c", "latency_ms": 5.0, "created_at": NOW}
    RequestLog.objects.bulk_create(
        [RequestLog(channel=cloud, status_code=200, outcome="ok", prompt_tokens=10, **common) for _ in range(10)]
        + [RequestLog(channel=None, status_code=status, outcome="error", error_kind=kind, **common)
           for status, kind in ((404, "model_not_found"), (402, "budget_exceeded"), (401, "invalid_key"))]
        + [RequestLog(channel=cloud, status_code=502, outcome="error", **common) for _ in range(2)])
    usage_rollup_run(lock=False)
    query = DashboardQuery(team=team, range="1h")
    page = dashboard_page(tab="overview", query=query)
    cards = {title: (value, note) for title, value, note, *_ in page.cards}
    assert cards["Error rate"][0] == "13.33 %"  # the two 502s of 15 requests; not the clients' 4xx
    assert "3 refused (the clients' own 4xx" in cards["Error rate"][1]
    table = page.table("channels")
    rows = {row[0]: row for row in table.rows}
    assert table.columns[:4] == ["channel", "requests", "errors", "refused"]
    assert rows["(none: refused before a channel)"][1:4] == [3, 0, 3] and rows["cloud"][1:4] == [12, 2, 0]
    names = [line.name for line in cost_summary(query).lines]
    assert "cloud" in names and "(deleted channel)" not in names  # refused requests are no channel line


def test_a_priced_deployment_that_served_nothing_still_costs_its_gpu_hours(traffic):
    """The traffic fixture's local deployment (2.5 an hour × 2 GPUs, ready for 10 hours) served nothing in the last
    hour: the Cost tab counts its hour, with no tokens to spread it over, and no key is charged for it."""
    query = DashboardQuery(team=traffic["team"], range="1h")
    summary = cost_summary(query)
    [idle] = [line for line in summary.lines if line.kind == "local"]
    assert idle.name == "local (idle)" and (idle.requests, idle.tokens) == (0, 0)
    assert 1.0 <= idle.gpu_hours <= 1.02  # the range begins on a whole step, up to a minute more than an hour
    assert idle.cost == pytest.approx(idle.gpu_hours * 5.0) and summary.local_cost == idle.cost
    assert summary.per_million("local") is None  # no tokens to divide by
    keyed = cost_summary(DashboardQuery(team=traffic["team"], range="1h", key_id=traffic["keys"][0].pk))
    assert [line for line in keyed.lines if line.kind == "local"] == []
    elsewhere = cost_summary(DashboardQuery(team=traffic["team"], range="1h", channel_id=traffic["cloud"].pk))
    assert [line for line in elsewhere.lines if line.kind == "local"] == []


def test_a_percentage_card_is_never_in_exponent_form():
    from panel.dashboards.pages import _percent

    assert [_percent(value) for value in (12.5, 100.0, 0.0, -6253378.67, None)] == [
        "12.5 %", "100 %", "0 %", "-6,253,378.67 %", "—"]
