"""The budgets see the GPU cost when its minute is allocated (panel/dashboards/local_cost.py, panel/budgets/adjust.py):
the allocation moves the money counters of each row's team, key and tags by exactly the rows' gpu_cost once its
transaction commits; a minute split again moves them by the difference only; a repeated run moves nothing; with
Redis gone the rows still get their cost and the reconciliation raises the counters to them.
Transactional tests: the counters move on commit, which a test wrapped in one transaction never reaches."""
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

from panel.accounts.keys import key_issue
from panel.budgets.counters import counter_keys, money_from_units, money_units, tag_ident
from panel.budgets.services import budget_set, budget_spend_recorded, budgets_reconcile
from panel.channels.models import Channel
from panel.core import redis_client
from panel.dashboards.local_cost import local_cost_allocate
from panel.usage.models import RequestLog
from tests.support.dashboards import make_deployment

pytestmark = pytest.mark.django_db(transaction=True)

# Up from T - 2 h on 2 GPUs at 2.50 an hour: 5.00 an hour. M is minute 90 after ready, whose cost is 0.08333333.
T = datetime(2026, 11, 15, 12, 0, tzinfo=timezone.utc)
MONTH = "2026-11"
M = T - timedelta(minutes=30)
MINUTE_90 = Decimal("0.08333333")
TAGS = ("search", "ml")


@pytest.fixture
def local(team_setup):
    team = team_setup["team_a"]
    deployment = make_deployment(team, price=Decimal("2.5"), gpu_count=2)
    deployment.ready_at = T - timedelta(hours=2)
    deployment.save()
    channel = Channel.objects.create(team=team, name="local", kind="local", deployment=deployment,
                                     base_url=deployment.base_url, model_id="tiny-chat")
    web, batch = (key_issue(team=team, user=None, name=name)[0] for name in ("web", "batch"))
    return {"team": team, "channel": channel, "web": web, "batch": batch}


def served(local, at, prompt, *, key, tags=None, cost=Decimal(0)):
    """A local request the gateway recorded and counted (its token price, here `cost`) as it ended."""
    row = RequestLog.objects.create(team=local["team"], key=key, channel=local["channel"], created_at=at,
                                    endpoint="chat", model="tiny-chat", status_code=200, outcome="ok",
                                    prompt_tokens=prompt, completion_tokens=0, latency_ms=100, cost=cost, tags=tags)
    counters = redis.Redis.from_url(settings.REDIS_URL)
    for scope, ident in scopes(local, key, tags):
        counters.incrby(counter_keys(MONTH, scope, ident)[0], money_units(cost))
    return row


def scopes(local, key=None, tags=None):
    team_id = local["team"].pk
    return ([("team", team_id)] + ([("key", key.pk)] if key else [])
            + [("tag", tag_ident(team_id, tag)) for tag in (tags or "").split("|") if tag])


def counted(local):
    """{(scope, ident): money} of the team, both keys and both tags, as the counters say."""
    every = scopes(local, local["web"]) + [("key", local["batch"].pk)] + scopes(local, tags="|search|ml|")[1:]
    values = redis.Redis.from_url(settings.REDIS_URL).mget([counter_keys(MONTH, *scope)[0] for scope in every])
    return {scope: money_from_units(value) for scope, value in zip(every, values)}


def recorded(local):
    """The same scopes' money, summed from the rows (what the reconciliation raises the counters to)."""
    spend = budget_spend_recorded(team_id=local["team"].pk, month=MONTH, tags=TAGS)
    return {scope: spend.get(scope, (Decimal(0), 0))[0] for scope in counted(local)}


def gpu_of(rows):
    return sum(RequestLog.objects.get(pk=row.pk).gpu_cost for row in rows)


def test_an_allocation_moves_the_team_key_and_tag_counters_by_the_rows_gpu_cost(local):
    team, web, batch = local["team"], local["web"], local["batch"]
    searched = served(local, M, 300, key=web, tags="|search|", cost=Decimal("0.0004"))
    both = served(local, M + timedelta(seconds=3), 100, key=batch, tags="|search|ml|")
    panel = served(local, M + timedelta(seconds=9), 100, key=None)  # Compare: the team's budget only
    before = counted(local)

    done = local_cost_allocate(now=T.timestamp())

    after = counted(local)
    moved = {scope: after[scope] - before[scope] for scope in after}
    assert gpu_of([searched, both, panel]) == MINUTE_90
    assert moved == {("team", team.pk): MINUTE_90, ("key", web.pk): gpu_of([searched]),
                     ("key", batch.pk): gpu_of([both]), ("tag", tag_ident(team.pk, "search")): gpu_of([searched, both]),
                     ("tag", tag_ident(team.pk, "ml")): gpu_of([both])}
    assert gpu_of([searched]) == Decimal("0.05000000")  # 300 of 500 tokens: a share that is no counter's whole
    assert after == recorded(local)  # the counters say what the rows say, without a reconciliation
    assert done.budgets_behind == 0
    tokens = redis.Redis.from_url(settings.REDIS_URL).get(counter_keys(MONTH, "team", team.pk)[1])
    assert tokens is None  # tokens are not GPU time: their counters stay as the gateway left them


def test_a_minute_split_again_moves_the_counters_by_the_difference_only(local):
    team, web, batch = local["team"], local["web"], local["batch"]
    first = served(local, M, 100, key=web, tags="|search|")
    local_cost_allocate(now=T.timestamp())
    assert gpu_of([first]) == MINUTE_90
    before = counted(local)

    late = served(local, M + timedelta(seconds=50), 300, key=batch, tags="|ml|")  # written after the allocation
    done = local_cost_allocate(now=T.timestamp())

    assert done.late_minutes == 1
    after = counted(local)
    moved = {scope: after[scope] - before[scope] for scope in after}
    given_back = MINUTE_90 - gpu_of([first])
    assert given_back == gpu_of([late]) == Decimal("0.06250000")
    assert moved == {("team", team.pk): 0, ("key", web.pk): -given_back, ("key", batch.pk): given_back,
                     ("tag", tag_ident(team.pk, "search")): -given_back, ("tag", tag_ident(team.pk, "ml")): given_back}
    assert after == recorded(local)
    assert done.budgets_behind == 0


def test_a_repeated_run_moves_nothing(local):
    served(local, M, 100, key=local["web"], tags="|search|")
    served(local, M + timedelta(seconds=30), 50, key=local["batch"], tags="|ml|")
    local_cost_allocate(now=T.timestamp())
    before = counted(local)
    assert sum(before.values()) > 0

    again = local_cost_allocate(now=T.timestamp())

    assert again.minutes == 0
    assert counted(local) == before == recorded(local)


def test_with_redis_gone_the_rows_get_their_cost_and_the_reconciliation_catches_up(local, monkeypatch, caplog):
    web = local["web"]
    budget_set(team=local["team"], key=web, money_per_month=Decimal("10"))
    budget_set(team=local["team"], tag="search", money_per_month=Decimal("10"))  # it raises budgeted tags only
    rows = [served(local, M, 100, key=web, tags="|search|"),
            served(local, M + timedelta(minutes=1), 100, key=web, tags="|search|")]
    # The counters' client points at a port where no Redis listens (no retries: each would wait); the roll-up's
    # lock, in the cache, still answers.
    monkeypatch.setattr(redis_client, "_sync_client", redis.Redis(port=1, retry=Retry(NoBackoff(), 0)))

    done = local_cost_allocate(now=T.timestamp())

    assert (done.minutes, done.budgets_behind) == (2, 2)
    tried = [record for record in caplog.records if record.name == "panel.budgets.adjust"]
    assert len(tried) == 1  # after one failure the run does not wait on Redis again
    assert gpu_of(rows) == MINUTE_90 + Decimal("0.08333334")
    assert counted(local)[("key", web.pk)] == 0
    budgets_reconcile(month=MONTH)
    assert counted(local)[("key", web.pk)] == gpu_of(rows)
    assert counted(local) == recorded(local)
