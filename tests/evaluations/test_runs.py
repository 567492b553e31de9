"""An evaluation run on a real default worker: every case of the set answered by the candidate channel (a fake cloud
provider), the agrees check answered by a reference channel, the judge check by a judge channel, each answer a usage
row with endpoint "evaluation"; the summary's pass rate, cost and cost per accepted answer; a set that names a
channel the team lacks is refused before anything is queued; the run's page."""
import json
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from panel.evaluations.models import EvalRun
from panel.evaluations.runs import eval_run_launch
from panel.evaluations.services import eval_set_create
from panel.usage.models import RequestLog
from tests.support.fake_upstream import FakeUpstream, content_text
from tests.support.gateway import channel
from tests.support.waiting import wait_until

CASES = [
    {"id": "says-alpha", "prompt": "Say the first word.", "checks": [{"type": "contains", "text": "alpha"}]},
    {"id": "json", "prompt": "Give JSON.", "checks": [{"type": "json"}]},
    {"id": "agrees", "prompt": "Three words.", "checks": [{"type": "agrees", "channel": "reference"}]},
    {"id": "judged", "prompt": "Be polite.", "checks": [{"type": "judge", "channel": "judge",
                                                         "criteria": "The answer is polite."}]},
    {"id": "pattern", "prompt": "Start with alpha bravo.", "checks": [{"type": "regex", "pattern": "^alpha bravo"}]},
]


@pytest.fixture
def fakes():
    with FakeUpstream(models=("m",), chunks=3) as candidate, FakeUpstream(models=("m",), chunks=3) as reference, \
            FakeUpstream(models=("m",), chunks=2) as judge:
        yield candidate, reference, judge


def test_a_run_answers_checks_and_prices_every_case(transactional_db, team_setup, start_worker, fakes, client):
    team, alice = team_setup["team_a"], team_setup["alice"]
    candidate_fake, reference_fake, judge_fake = fakes
    candidate = channel(team, "candidate", candidate_fake, "m", price_input_per_million=Decimal("1"),
                        price_output_per_million=Decimal("2"))
    channel(team, "reference", reference_fake, "m")
    eval_set = eval_set_create(team=team, user=alice, name="smoke", text="\n".join(json.dumps(c) for c in CASES))
    with pytest.raises(ValidationError, match="judge"):  # the judge channel is not there yet
        eval_run_launch(team=team, user=alice, eval_set=eval_set, candidate=f"channel:{candidate.pk}")
    assert not EvalRun.objects.exists()
    channel(team, "judge", judge_fake, "m")

    start_worker("long")
    run = eval_run_launch(team=team, user=alice, eval_set=eval_set, candidate=f"channel:{candidate.pk}")
    wait_until(lambda: EvalRun.objects.get(pk=run.pk).is_final, seconds=90, interval=0.3, message="the run")
    run.refresh_from_db()
    assert run.state == "succeeded", (run.failure_kind, run.failure_reason)
    verdicts = {line["id"]: line["passed"] for line in run.results}
    assert verdicts == {"says-alpha": True, "json": False, "agrees": True, "judged": False, "pattern": True}
    by_id = {line["id"]: line for line in run.results}
    assert by_id["says-alpha"]["answer"] == content_text(3)
    assert by_id["agrees"]["checks"][0]["words"].startswith("agrees 1.00 with the reference")
    assert "the judge said: " + content_text(2) in by_id["judged"]["checks"][0]["words"]

    rows = RequestLog.objects.filter(endpoint="evaluation")  # the worker's usage writer adds them in batches
    wait_until(lambda: rows.count() >= 7, seconds=30, interval=0.3, message="the run's usage rows")
    assert rows.filter(channel=candidate).count() == 5 and rows.count() == 7  # + one reference, one judge answer
    cost = sum((row.cost for row in rows.filter(channel=candidate)), Decimal(0))
    assert cost > 0
    summary = run.result
    assert (summary["cases"], summary["passed"], summary["errors"], summary["pass_rate"]) == (5, 3, 0, 0.6)
    assert Decimal(summary["cost"]) == cost and Decimal(summary["cost_per_accepted"]) == cost / 3
    assert len(candidate_fake.requests) == 5 and len(judge_fake.requests) == 1

    # A second run in the same worker process (a fresh event loop) works as the first did.
    again = eval_run_launch(team=team, user=alice, eval_set=eval_set, candidate=f"channel:{candidate.pk}")
    wait_until(lambda: EvalRun.objects.get(pk=again.pk).is_final, seconds=90, interval=0.3, message="the 2nd run")
    again.refresh_from_db()
    assert again.state == "succeeded" and again.result["passed"] == 3, (again.failure_kind, again.failure_reason)

    client.force_login(team_setup["vera"])  # a viewer reads the run
    page = client.get(reverse("eval_run_detail", args=[run.pk])).content.decode()
    assert "3 of 5" in page and "Cost per accepted answer" in page and "the judge said" in page
    live = client.get(reverse("eval_run_live", args=[run.pk])).content.decode()  # what the page polls while it runs
    assert "data-final" in live and "3 of 5" in live and "<html" not in live
    detail = client.get(reverse("eval_set_detail", args=[eval_set.pk])).content.decode()
    assert f"#{run.pk}" in detail and "Run version 1" not in detail  # a viewer cannot start one
    assert client.post(reverse("eval_run_start", args=[eval_set.pk]),
                       {"candidate": f"channel:{candidate.pk}"}).status_code == 403


def test_a_member_starts_a_run_from_the_page_and_a_bad_candidate_is_refused(team_setup, client):
    team = team_setup["team_a"]
    eval_set = eval_set_create(team=team, user=team_setup["alice"], name="smoke",
                               text=json.dumps(CASES[0]) + "\n")
    made = channel(team, "candidate", "http://127.0.0.1:9/v1", "m")
    client.force_login(team_setup["alice"])
    refused = client.post(reverse("eval_run_start", args=[eval_set.pk]), {"candidate": "channel:999999"})
    assert refused.status_code == 400 and not EvalRun.objects.exists()
    started = client.post(reverse("eval_run_start", args=[eval_set.pk]), {"candidate": f"channel:{made.pk}"})
    run = EvalRun.objects.get()
    assert started.status_code == 302 and started.url == reverse("eval_run_detail", args=[run.pk])
    assert run.state == "pending" and run.candidate["id"] == made.pk and run.queue == "long"
    page = client.get(started.url).content.decode()  # pending: the page polls its live part until the run ends
    assert reverse("eval_run_live", args=[run.pk]) in page and "data-live-done" not in page
    live = client.get(reverse("eval_run_live", args=[run.pk])).content.decode()
    assert "Pending" in live and "No case answered yet." in live and "data-final" not in live
    assert client.get(reverse("eval_run_live", args=[run.pk + 1])).status_code == 404


def test_candidates_rank_by_cost_per_accepted_answer_and_the_page_shows_the_cheapest(team_setup, client):
    from django.utils import timezone

    from panel.evaluations.runs import candidates_ranked

    team = team_setup["team_a"]
    eval_set = eval_set_create(team=team, user=team_setup["alice"], name="smoke", text=json.dumps(CASES[0]) + "\n")
    version = eval_set.current()

    def run(label, pk, passed, cost, state="succeeded", minutes_ago=0):
        per = format(Decimal(cost) / passed, "f") if passed else None
        return EvalRun.objects.create(team=team, eval_version=version, state=state,
                                      finished_at=timezone.now() - timezone.timedelta(minutes=minutes_ago),
                                      candidate={"kind": "channel", "id": pk, "label": label},
                                      result={"cases": 10, "passed": passed, "cost": cost, "pass_rate": passed / 10,
                                              "cost_per_accepted": per, "p50_ms": 100.0})

    run("cloud", 1, 10, "0.0100", minutes_ago=5)  # older run of the same candidate: replaced by the next
    cloud = run("cloud", 1, 9, "0.0090")
    w8a8 = run("local w8a8", 2, 8, "0.0016")
    w4 = run("local w4a16", 3, 0, "0.0008")
    run("broken", 4, 5, "0.0001", state="failed")
    assert [r.pk for r in candidates_ranked(version)] == [w8a8.pk, cloud.pk, w4.pk]
    client.force_login(team_setup["vera"])
    page = client.get(reverse("eval_set_detail", args=[eval_set.pk])).content.decode()
    ranking = page.split('id="eval-ranking"')[1].split("</table>")[0]
    assert ranking.index("local w8a8") < ranking.index("cloud") < ranking.index("local w4a16")
    assert "cheapest" in ranking and "— (none passed)" in ranking and "broken" not in ranking


def test_a_local_answer_costs_its_deployments_gpu_time(team_setup):
    """A priced local deployment's answer costs its price per hour × its latency on top of the channel's token
    prices; an unpriced host's answer and a cloud answer cost only their token prices."""
    from panel.channels.models import Channel, ChannelKind
    from panel.evaluations.runs import answer_cost, local_hourly_prices
    from tests.support.dashboards import make_deployment

    team = team_setup["team_a"]
    deployment = make_deployment(team, price=Decimal("3.6"), gpu_count=2)  # 7.2 an hour: 0.002 a second
    Channel.objects.create(team=team, name="local-bf16", kind=ChannelKind.LOCAL, base_url=deployment.base_url,
                           deployment=deployment, model_id="tiny-chat")
    prices = local_hourly_prices(team.pk)
    assert prices == {"local-bf16": pytest.approx(7.2)}
    cost, gpu = answer_cost({"channel": "local-bf16", "latency_ms": 1500.0, "cost": "0.0001"}, prices)
    assert gpu == Decimal("0.003") and cost == Decimal("0.0031")
    assert answer_cost({"channel": "cloud", "latency_ms": 1500.0, "cost": "0.0001"}, prices) == \
        (Decimal("0.0001"), None)
    deployment.host.gpu_price_per_hour = None
    deployment.host.save()
    assert local_hourly_prices(team.pk) == {"local-bf16": None}
