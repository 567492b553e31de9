"""Evaluations in Chromium at 1280 px, with screenshots: add the starter set, read its cases and checks in words,
paste a bad line into a new version and see every problem without losing the text, then save a good one."""
import json

from playwright.sync_api import expect

from panel.evaluations.models import EvalSet
from tests.support.browser import screenshot, sign_in


def test_a_member_adds_the_starter_set_and_saves_a_new_version(page, live_server, team_setup):
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.click("nav.sidebar >> text=Evaluations")
    expect(page.locator("#eval-sets")).to_contain_text("No sets yet")
    page.click("text=Add the starter set")
    expect(page.locator("h1")).to_have_text("Starter: JSON, extraction and formats")
    expect(page.locator("#eval-cases tbody tr")).to_have_count(12)
    expect(page.locator("#eval-cases")).to_contain_text("matches the JSON schema")
    screenshot(page, "evaluations-starter")

    cases = page.locator("#id_cases")
    kept = cases.input_value()
    cases.fill(kept + "not a case\n" + json.dumps({"prompt": "x", "checks": [{"type": "regex",
                                                                            "pattern": "(?<=a)b"}]}) + "\n")
    page.fill("#id_note", "two more")
    page.click("text=Save version 2")
    errors = page.locator("#revise .field-error")
    expect(errors.first).to_contain_text("line 13: not JSON")
    expect(page.locator("#revise")).to_contain_text("line 14: check 1:")
    assert "not a case" in page.locator("#id_cases").input_value()  # the text is kept to be fixed
    screenshot(page, "evaluations-problems")

    page.locator("#id_cases").fill(kept + json.dumps({"id": "greeting", "prompt": "Say hello.",
                                                      "checks": [{"type": "contains", "text": "hello"}]}) + "\n")
    page.click("text=Save version 2")
    expect(page.locator(".message.success")).to_contain_text("Saved version 2: 13 cases")
    expect(page.locator("#eval-versions tbody tr")).to_have_count(2)
    assert EvalSet.objects.get().current().number == 2
    screenshot(page, "evaluations-versions")


def test_an_admin_turns_samples_into_a_set_and_reads_the_routes_autopilot(page, live_server, team_setup):
    from decimal import Decimal

    from django.utils import timezone

    from panel.channels.models import Channel, Route, RouteChannel
    from panel.channels.shadow import shadow_record, shadow_start
    from panel.core import crypto
    from panel.evaluations.autopilot import autopilot_save
    from panel.evaluations.models import EvalRun
    from panel.usage.models import TrafficSample

    team = team_setup["team_a"]
    stable = Channel.objects.create(team=team, name="taotoken", base_url="https://api.example.com/v1", model_id="big")
    small = Channel.objects.create(team=team, name="local-w8a8", base_url="https://api.example.com/v1",
                                   model_id="small")
    route = Route.objects.create(team=team, model_name="support-bot")
    RouteChannel.objects.create(route=route, channel=stable, position=0)
    for ask, answer in (("Where is my order [redacted]?", "It ships today."), ("Refund?", "Within 30 days.")):
        TrafficSample.objects.create(team=team, route=route, endpoint="chat", model="support-bot", redacted=1,
                                     payload=crypto.encrypt(json.dumps({"messages": [
                                         {"role": "user", "content": ask}], "answer": answer})))
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}/channels/routes/{route.pk}/")
    expect(page.locator("#sampling-note")).to_contain_text("Off: this route keeps none of its requests. 2 kept now.")
    page.click("#sampling-note >> text=Samples and settings")
    page.fill("#id_samples_per_day", "100")
    page.fill("#id_sample_redactions", "(?<=@)\\w+")
    page.click("#sampling-settings >> text=Save")
    expect(page.locator("#sampling-settings")).to_contain_text("line 1: the pattern looks ahead or behind")
    page.fill("#id_sample_redactions", "CUST-\\d{6}")
    page.click("#sampling-settings >> text=Save")
    expect(page.locator("#sampling-state")).to_contain_text("On: this route keeps up to 100")
    expect(page.locator("#samples tbody tr")).to_have_count(2)
    screenshot(page, "route-samples")
    page.click("text=Make the set from 2 samples")
    expect(page.locator("h1")).to_have_text("support-bot traffic")
    expect(page.locator("#eval-cases")).to_contain_text('agrees with the recorded answer "It ships today."')

    eval_set = EvalSet.objects.get(name="support-bot traffic")
    for kind, ident, passed, cost in (("route", route.pk, 2, "0.0030"), ("channel", small.pk, 2, "0.0010")):
        EvalRun.objects.create(team=team, eval_version=eval_set.current(), state="succeeded",
                               finished_at=timezone.now(), candidate={"kind": kind, "id": ident, "label": "x"},
                               result={"cases": 2, "passed": passed, "pass_rate": passed / 2,
                                       "cost_per_accepted": cost})
    shadow = shadow_start(route=route, channel=small, percent=10, budget=Decimal("1"))
    shadow_record(shadow_id=shadow.pk, ok=True, similarity=0.8, passed=True, cost=Decimal("0.0001"), latency_ms=300,
                  client_latency_ms=700, client_cost=Decimal("0.002"))
    autopilot_save(route=route, user=None, eval_set=eval_set, min_pass_rate=0.9, min_shadow_copies=1,
                   start_canary=False)
    page.goto(f"{live_server.url}/channels/routes/{route.pk}/")
    page.click(".page-head >> text=Autopilot")
    expect(page.locator("#autopilot-verdict")).to_contain_text("local-w8a8 passes 100%")
    expect(page.locator("#autopilot-candidates")).to_contain_text("proposed")
    page.click("text=Review now and notify")
    expect(page.locator(".message")).to_contain_text("propose a canary of it")
    wide = page.evaluate("() => document.documentElement.scrollWidth > window.innerWidth + 1")
    assert not wide  # nothing wider than the 1280 px window
    screenshot(page, "route-autopilot")
    page.click("text=Start a canary of local-w8a8 at 5%")
    expect(page.locator(".message.success")).to_contain_text("Canary started: 5% of support-bot goes to local-w8a8")
