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
                                                                            "pattern": "(a+)+"}]}) + "\n")
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
