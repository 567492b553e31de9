"""Benchmark traffic counts against the team's monthly budget, like the gateway's and Compare's: every request
(warm-up too) is counted, a run stops when its own requests spend the budget, a queued run whose team's budget is
spent by the time it starts sends nothing, and the form refuses a new run with words saying why."""
from decimal import Decimal

import redis

from panel.benchmarks.models import BenchmarkRun
from panel.benchmarks.services import benchmark_launch
from panel.budgets.counters import counter_keys, money_from_units, month_of
from panel.budgets.models import Budget, BudgetNotice
from panel.channels.models import Channel
from panel.jobs.models import JobState
from tests.support.benchmarks import fake_channel, post_run, run_now
from tests.support.environment import REDIS_URL
from tests.support.fake_upstream import FakeUpstream, prompt_tokens

PRICES = dict(price_input_per_million=Decimal("1.00"), price_output_per_million=Decimal("2.00"))


def team_counters(team):
    money, tokens = redis.Redis.from_url(REDIS_URL).mget(counter_keys(month_of(), "team", team.pk))
    return money_from_units(money), int(tokens or 0)


def sent_tokens(fake):
    """What the fake reported in usage for the requests it answered (prompt + completion)."""
    return sum(prompt_tokens(request.json) + min(fake.chunks, request.json["max_tokens"]) for request in fake.requests)


def test_every_benchmark_request_warm_up_included_is_counted_against_the_team(team_setup):
    team = team_setup["team_a"]
    with FakeUpstream(chunks=6) as fake:
        channel = fake_channel(team, fake, **PRICES)
        run = benchmark_launch(team=team, user=team_setup["alice"], target_kind="channel", target_id=channel.pk,
                               requests=8, warmup_requests=2, concurrency=2, output_tokens=5, enqueue=False)
        run = run_now(run)
        expected_tokens = sent_tokens(fake)
        assert len(fake.requests) == 10
    assert run.state == JobState.SUCCEEDED, run.failure_reason
    money, tokens = team_counters(team)
    assert tokens == expected_tokens > 0
    prompt = sum(prompt_tokens(request.json) for request in fake.requests)
    assert money == channel.cost(prompt, 10 * 5)


def test_a_benchmark_stops_when_its_own_requests_spend_the_budget_and_says_so(team_setup):
    team = team_setup["team_a"]
    Budget.objects.create(team=team, tokens_per_month=200)
    with FakeUpstream(chunks=8, chunk_delay=0.01) as fake:  # about 0.1 s a request: 300 would take 30 s
        channel = fake_channel(team, fake, **PRICES)
        run = benchmark_launch(team=team, user=team_setup["alice"], target_kind="channel", target_id=channel.pk,
                               requests=300, warmup_requests=0, concurrency=1, output_tokens=8, enqueue=False)
        run = run_now(run)
        sent = len(fake.requests)
    assert run.state == JobState.FAILED and run.failure_kind == "budget_exceeded"
    assert "stopped after" in run.failure_reason and "monthly budget of 200 tokens is spent" in run.failure_reason
    assert sent < 40  # stopped within about a second of the budget being spent
    assert run.result["requests"] == sent  # the figures of what was sent are kept
    _, tokens = team_counters(team)
    assert tokens >= 200
    assert set(BudgetNotice.objects.values_list("level", flat=True)) == {"alert", "exhausted"}


def test_a_queued_run_whose_teams_budget_is_spent_when_it_starts_sends_nothing(team_setup):
    team = team_setup["team_a"]
    with FakeUpstream() as fake:
        channel = fake_channel(team, fake, **PRICES)
        run = benchmark_launch(team=team, user=team_setup["alice"], target_kind="channel", target_id=channel.pk,
                               requests=5, enqueue=False)
        Budget.objects.create(team=team, tokens_per_month=10)
        redis.Redis.from_url(REDIS_URL).set(counter_keys(month_of(), "team", team.pk)[1], 10)
        run = run_now(run)
        assert fake.request_count == 0
    assert run.state == JobState.FAILED and run.failure_kind == "budget_exceeded"
    assert run.failure_reason.startswith("not started: this team's monthly budget of 10 tokens is spent")


def test_the_form_refuses_a_run_when_the_teams_budget_is_spent_with_a_clear_message(client, team_setup):
    team = team_setup["team_a"]
    Budget.objects.create(team=team, money_per_month=Decimal("5"))
    redis.Redis.from_url(REDIS_URL).set(counter_keys(month_of(), "team", team.pk)[0], 6 * 10**8)  # 6.00 spent
    channel = Channel.objects.create(team=team, name="c", base_url="http://127.0.0.1:9/v1", model_id="m")
    client.force_login(team_setup["alice"])
    response = post_run(client, channel)
    assert response.status_code == 400
    page = response.content.decode()
    assert "Not started: this team&#x27;s monthly budget of 5" in page and "is spent (6.00" in page
    assert "Benchmarks count against the team&#x27;s budget." in page
    assert BenchmarkRun.objects.count() == 0
