"""Local requests carry their GPU cost (panel/dashboards/local_cost.py): a minute's GPU cost split by tokens adds up
exactly, an unpriced host allocates nothing and says so, a late row re-splits its minute, a second run changes
nothing, and the roll-up, the budget counters and the API count it while the Cost tab's totals stay as they were;
a vLLM pool's GPUs are split among its requests the same way.
Beside the dashboards' tests: the allocation needs deployments and the Cost tab's math, which sit above `usage`."""
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import redis
from django.conf import settings
from django.db.models import Sum

from panel.accounts.keys import key_issue
from panel.budgets.counters import counter_keys, money_from_units
from panel.budgets.services import budget_set, budgets_reconcile
from panel.channels.models import Channel
from panel.dashboards.cost import cost_summary
from panel.dashboards.local_cost import local_cost_allocate, shares_split
from panel.dashboards.models import MINUTE, LocalCostWatermark, UsageRollup
from panel.dashboards.rollup import usage_rollup_run
from panel.dashboards.selectors import DashboardQuery, usage_grouped
from panel.dashboards.tasks import allocate_local_cost
from panel.usage.models import RequestLog
from tests.support.api_helpers import bearer, token_for
from tests.support.dashboards import make_deployment

# A fixed clock inside a month (the allocation never reaches back before the month's start). The deployment is up
# from T - 2 h on 2 GPUs at 2.50 an hour: 5.00 an hour, 0.08333... a minute.
T = datetime(2026, 11, 15, 12, 0, tzinfo=timezone.utc)
MONTH = "2026-11"
M = T - timedelta(minutes=30)  # a busy minute, long settled at T


@pytest.fixture
def local(team_setup):
    team = team_setup["team_a"]
    deployment = make_deployment(team, price=Decimal("2.5"), gpu_count=2)
    deployment.ready_at = T - timedelta(hours=2)
    deployment.save()
    channel = Channel.objects.create(team=team, name="local", kind="local", deployment=deployment,
                                     base_url=deployment.base_url, model_id="tiny-chat")
    cloud = Channel.objects.create(team=team, name="cloud", kind="remote", base_url="http://cloud/v1", model_id="c",
                                   price_input_per_million=Decimal("0.8"), price_output_per_million=Decimal("2.4"))
    web, batch = (key_issue(team=team, user=None, name=name)[0] for name in ("web", "batch"))
    return {"team": team, "deployment": deployment, "channel": channel, "cloud": cloud, "web": web, "batch": batch,
            **team_setup}


def request(local, at, prompt, completion, *, key=None, channel=None, cost=Decimal(0)):
    return RequestLog.objects.create(team=local["team"], key=key or local["web"], channel=channel or local["channel"],
                                     created_at=at, endpoint="chat", model="tiny-chat", status_code=200,
                                     outcome="ok", prompt_tokens=prompt, completion_tokens=completion,
                                     latency_ms=100, cost=cost)


def minute_cost(minutes_after_ready):
    """The minute's cost as documented: the difference of the cumulative cost, each rounded to 1e-8."""
    def units(minutes):
        return round(minutes * 60 / 3600 * 5.0 * 10**8)
    return Decimal(units(minutes_after_ready + 1) - units(minutes_after_ready)) / 10**8


def fresh(row):
    row.refresh_from_db()
    return row


def test_it_splits_a_minutes_gpu_cost_among_its_requests_by_tokens_to_the_last_decimal(local):
    rows = [request(local, M + timedelta(seconds=s), prompt, completion)
            for s, prompt, completion in ((5, 80, 20), (20, 150, 50), (59, 30, 3))]  # 100, 200 and 33 tokens
    paid = request(local, M + timedelta(seconds=30), 0, 0, cost=Decimal("0.001"))  # zero tokens: a zero share
    quiet = [request(local, M + timedelta(minutes=1, seconds=s), 0, 0) for s in (1, 2)]  # a minute with no tokens
    cloud = request(local, M + timedelta(seconds=10), 1000, 1000, channel=local["cloud"], cost=Decimal("0.0032"))
    unsettled = request(local, T - timedelta(seconds=30), 100, 100)  # its minute ended less than 2 minutes ago

    done = local_cost_allocate(now=T.timestamp())

    assert (done.minutes, done.rows, done.late_minutes, done.unpriced) == (2, 6, 0, [])
    # Minute 90 after ready: 7.50000000 → 7.58333333 → 0.08333333; the minute after it 0.08333334 (together
    # 0.16666667, two minutes of 5.00 an hour rounded once).
    assert (minute_cost(90), minute_cost(91)) == (Decimal("0.08333333"), Decimal("0.08333334"))
    shares = [fresh(row).gpu_cost for row in rows + [paid]]
    assert sum(shares) == minute_cost(90)
    for share, tokens in zip(shares, (100, 200, 33, 0)):
        assert abs(share - minute_cost(90) * tokens / 333) <= Decimal("1e-8")
    assert shares[3] == 0 and fresh(paid).cost == Decimal("0.001")  # added to its cost, which stays as it was
    assert all(fresh(row).cost == fresh(row).gpu_cost for row in rows)  # its cost was 0, now its share
    assert [fresh(row).gpu_cost for row in quiet] == [Decimal("0.04166667")] * 2  # by request count
    assert (fresh(cloud).gpu_cost, fresh(cloud).cost) == (None, Decimal("0.0032"))
    assert fresh(unsettled).gpu_cost is None
    watermark = LocalCostWatermark.objects.get(deployment=local["deployment"])
    assert watermark.allocated_until == (T.timestamp() - 120) // 60 * 60  # idle minutes passed, charged to no one

    before = list(RequestLog.objects.order_by("id").values_list("id", "cost", "gpu_cost"))
    again = local_cost_allocate(now=T.timestamp())
    assert (again.minutes, again.rows) == (0, 0)
    assert list(RequestLog.objects.order_by("id").values_list("id", "cost", "gpu_cost")) == before
    # A minute later the unsettled row's minute is allocated, and only it.
    later = local_cost_allocate(now=(T + timedelta(minutes=2)).timestamp())
    assert (later.minutes, later.rows) == (1, 1)
    assert fresh(unsettled).gpu_cost == minute_cost(119)


def test_the_largest_remainders_add_up_exactly():
    assert shares_split(10, [1, 1, 1]) == [4, 3, 3]
    assert shares_split(8333333, [100, 200, 33]) == [2502502, 5005005, 825826]
    assert sum(shares_split(7, [0, 0])) == 7 and shares_split(5, []) == []


def test_a_host_without_a_gpu_price_allocates_nothing_and_says_so(team_setup):
    team = team_setup["team_a"]
    deployment = make_deployment(team, price=None, gpu_count=2)
    deployment.ready_at = T - timedelta(hours=2)
    deployment.save()
    channel = Channel.objects.create(team=team, name="local", kind="local", deployment=deployment,
                                     base_url=deployment.base_url, model_id="tiny-chat")
    row = RequestLog.objects.create(team=team, channel=channel, created_at=M, endpoint="chat", model="tiny-chat",
                                    status_code=200, outcome="ok", prompt_tokens=10, completion_tokens=10,
                                    latency_ms=5)
    done = local_cost_allocate(now=T.timestamp())
    assert (done.minutes, done.unpriced) == (0, [deployment.host.host])
    assert (fresh(row).gpu_cost, fresh(row).cost) == (None, 0)
    assert not LocalCostWatermark.objects.exists()


def test_a_row_written_late_into_an_allocated_minute_splits_that_minute_again(local):
    first, second = request(local, M, 100, 0), request(local, M + timedelta(seconds=40), 100, 0)
    local_cost_allocate(now=T.timestamp())
    assert (fresh(first).gpu_cost, fresh(second).gpu_cost) == (Decimal("0.04166667"), Decimal("0.04166666"))

    late = request(local, M + timedelta(seconds=50), 300, 0)  # written now into the minute allocated above
    idle = M + timedelta(minutes=5)  # an idle minute that was passed: a late row there takes the whole minute
    late_alone = request(local, idle + timedelta(seconds=1), 10, 0)
    done = local_cost_allocate(now=T.timestamp())

    assert (done.minutes, done.late_minutes, done.rows) == (2, 2, 4)
    shares = [fresh(row).gpu_cost for row in (first, second, late)]
    assert sum(shares) == minute_cost(90)  # not charged twice: the minute's cost is split anew
    assert shares == [Decimal("0.01666667"), Decimal("0.01666666"), Decimal("0.05000000")]
    assert [fresh(row).cost for row in (first, second, late)] == shares  # cost moved by the difference
    assert fresh(late_alone).gpu_cost == minute_cost(95)
    assert local_cost_allocate(now=T.timestamp()).minutes == 0


def test_the_rollup_and_the_budgets_count_it_and_the_cost_tabs_totals_do_not_change(local):
    team, web, batch = local["team"], local["web"], local["batch"]
    request(local, M, 300, 0, key=web)
    request(local, M + timedelta(seconds=3), 100, 0, key=batch)
    request(local, M, 1000, 1000, channel=local["cloud"], key=batch, cost=Decimal("0.0032"))
    budget_set(team=team, money_per_month=Decimal("100"))
    usage_rollup_run()
    query = DashboardQuery(team=team, range="24h", now=T.timestamp())
    summary = cost_summary(query)
    totals = (summary.local_cost, summary.cloud_cost, summary.actual, summary.all_cloud)
    assert totals[0] == pytest.approx(10.0)  # the Cost tab: 2 h up at 5.00, idle minutes included
    budgets_reconcile(month=MONTH)
    assert counted("key", web.pk) == 0 and counted("team", team.pk) == Decimal("0.0032")

    local_cost_allocate(now=T.timestamp())
    assert settings.CELERY_BEAT_SCHEDULE["allocate-local-cost"]["task"] == allocate_local_cost.name

    gpu = minute_cost(90)
    assert RequestLog.objects.aggregate(total=Sum("gpu_cost"))["total"] == gpu
    minute = UsageRollup.objects.filter(team=team, period=MINUTE, start=int(M.timestamp()), local=True)
    assert sum(row.cost for row in minute) == pytest.approx(float(gpu), abs=1e-12)
    by_key = {row["key_id"]: row["cost"] for row in usage_grouped(query, by=("key_id",))}
    assert by_key[web.pk] == pytest.approx(float(gpu) * 3 / 4, abs=1e-8)
    assert by_key[batch.pk] == pytest.approx(0.0032 + float(gpu) / 4, abs=1e-8)
    summary = cost_summary(query)
    assert (summary.local_cost, summary.cloud_cost, summary.actual, summary.all_cloud) == pytest.approx(totals)

    budgets_reconcile(month=MONTH)
    web_share = RequestLog.objects.get(key=web).gpu_cost
    assert web_share == Decimal("0.06250000")  # 3/4 of 0.08333333, rounded up by the largest remainder
    assert counted("key", web.pk) == web_share
    assert counted("key", batch.pk) == Decimal("0.0032") + gpu - web_share
    assert counted("team", team.pk) == Decimal("0.0032") + gpu


def test_a_pools_gpus_are_split_among_its_requests_and_counted_by_the_budgets(local):
    """2 GPUs at 1.50 an hour: 0.05 a minute since the pool's channel was made, as the Cost tab charges it."""
    team = local["team"]
    pool = Channel.objects.create(team=team, name="gpu-pool", kind="pool", base_url="http://pool/v1",
                                  model_id="pool-chat", scrape_urls="http://pool/metrics", gpu_count=2,
                                  price_per_gpu_hour=Decimal("1.5"))
    Channel.objects.filter(pk=pool.pk).update(created_at=T - timedelta(minutes=90))
    unpriced = Channel.objects.create(team=team, name="free-pool", kind="pool", base_url="http://free/v1",
                                      model_id="pool-chat", scrape_urls="http://free/metrics")
    big = request(local, M, 300, 0, channel=pool)
    small = request(local, M + timedelta(seconds=40), 60, 40, key=local["batch"], channel=pool)
    other = request(local, M, 10, 10, channel=unpriced)
    budget_set(team=team, money_per_month=Decimal("100"))
    usage_rollup_run()
    query = DashboardQuery(team=team, range="24h", now=T.timestamp())
    before = cost_summary(query)

    done = local_cost_allocate(now=T.timestamp())

    assert done.minutes == 1 and done.rows == 2
    assert (fresh(big).gpu_cost, fresh(small).gpu_cost) == (Decimal("0.0375"), Decimal("0.0125"))
    assert fresh(big).cost == Decimal("0.0375") and (fresh(other).gpu_cost, fresh(other).cost) == (None, 0)
    watermark = LocalCostWatermark.objects.get(channel=pool)
    assert watermark.allocated_since == int((T - timedelta(minutes=90)).timestamp())
    assert not LocalCostWatermark.objects.filter(channel=unpriced).exists()
    assert local_cost_allocate(now=T.timestamp()).rows == 0  # done once
    after = cost_summary(query)
    assert (after.local_cost, after.cloud_cost, after.actual) == pytest.approx(
        (before.local_cost, before.cloud_cost, before.actual))  # the Cost tab charges the pool by its hours
    budgets_reconcile(month=MONTH)
    assert counted("team", team.pk) == Decimal("0.05") and counted("key", local["batch"].pk) == Decimal("0.0125")


def counted(scope, ident):
    value = redis.Redis.from_url(settings.REDIS_URL).get(counter_keys(MONTH, scope, ident)[0])
    return money_from_units(value)


def test_the_usage_export_shows_the_gpu_cost(client, local):
    row = request(local, M, 100, 0)
    local_cost_allocate(now=T.timestamp())
    raw = token_for(local["alice"], local["team"])
    (item,) = client.get("/api/v1/usage", **bearer(raw)).json()["items"]
    assert item["id"] == row.pk and item["gpu_cost"] == item["cost"] == str(minute_cost(90))
