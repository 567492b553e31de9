"""The route page's rules: the editor in Chromium (every error at once and nothing written, add, reorder,
delete, the traffic and cost table), the audit log, and the same rules through the API."""
from decimal import Decimal

import pytest
from playwright.sync_api import expect

from panel.accounts.keys import key_issue
from panel.audit.models import AuditAction, AuditEvent
from panel.channels.models import Channel, Route, RouteChannel, RouteRule
from panel.channels.rules import rule_save
from panel.usage.models import RequestLog
from tests.support.api_helpers import call, owner_token  # noqa: F401 (fixture)
from tests.support.browser import screenshot, sign_in


def _route(team):
    local = Channel.objects.create(team=team, name="local-qwen", kind="local", base_url="http://127.0.0.1:9/v1",
                                   model_id="m")
    cloud = Channel.objects.create(team=team, name="cloud", base_url="http://127.0.0.1:9/v1", model_id="m")
    route = Route.objects.create(team=team, model_name="agent", strategy="priority")
    RouteChannel.objects.create(route=route, channel=cloud, position=0)
    return route, local, cloud


def test_the_rules_editor_checks_saves_reorders_and_deletes(page, live_server, team_setup):
    team = team_setup["team_a"]
    route, local, cloud = _route(team)
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}/channels/routes/{route.pk}/")
    expect(page.locator("#rules")).to_be_visible()
    expect(page.locator("main")).to_contain_text("tools and under 4,000 input tokens → local")
    page.click("a:has-text('Add a rule')")
    page.fill("#id_tokens_over", "5000")
    page.fill("#id_tokens_under", "4000")
    page.fill("#id_header_value", "batch")
    page.click("button:has-text('Save rule')")
    errors = page.locator(".field-error")
    expect(errors).to_have_count(4)  # name, the token range, the header's name, the first channel
    expect(page.locator("#rule-form")).to_contain_text("No estimate is both over 5,000 and under 4,000")
    expect(page.locator("#rule-form")).to_contain_text("Name the header whose value this is")
    assert RouteRule.objects.count() == 0
    screenshot(page, "route-rule-errors")

    page.fill("#id_name", "short tool calls")
    page.fill("#id_tokens_over", "")
    page.fill("#id_header_value", "")
    page.select_option("#id_tools", "with")
    page.select_option("#id_channel_0", str(local.pk))
    page.click("button:has-text('Save rule')")
    expect(page.locator(".message.success")).to_contain_text("Saved the rule short tool calls")
    page.click("a:has-text('Add a rule')")
    page.fill("#id_name", "batch jobs")
    page.fill("#id_header_name", "X-Workload")
    page.fill("#id_header_value", "batch")
    page.select_option("#id_channel_0", str(cloud.pk))
    page.select_option("#id_channel_1", str(local.pk))
    page.click("button:has-text('Save rule')")
    table = page.locator("#rules-table tbody tr")
    expect(table).to_have_count(3)
    expect(table.nth(0)).to_contain_text("has tools and under 4,000 input tokens")
    expect(table.nth(1)).to_contain_text("header x-workload = 'batch'")
    expect(table.nth(1).locator(".chip")).to_have_text(["cloud", "local-qwen"])

    short, batch = RouteRule.objects.order_by("position")
    RequestLog.objects.bulk_create(
        [RequestLog(team=team, route=route, route_rule=short, channel=local, endpoint="chat", model="agent",
                    status_code=200, outcome="ok", latency_ms=5, prompt_tokens=900, cost=Decimal("0.0001"))
         for _ in range(3)]
        + [RequestLog(team=team, route=route, channel=cloud, endpoint="chat", model="agent", status_code=200,
                      outcome="ok", latency_ms=5, prompt_tokens=9000, cost=Decimal("1.25"))])
    page.click("button[aria-label='Move batch jobs up']")
    expect(table.nth(0)).to_contain_text("batch jobs")
    expect(table.nth(1)).to_contain_text("short tool calls")
    cells = table.nth(1).locator("td")
    expect(cells.nth(4)).to_have_text("3")
    expect(cells.nth(6)).to_have_text("0.00030")
    expect(table.nth(2).locator("td").nth(6)).to_have_text("1.25")
    screenshot(page, "route-rules")
    page.on("dialog", lambda dialog: dialog.accept())
    page.click("button[aria-label='Delete batch jobs']")
    expect(table).to_have_count(2)
    assert list(RouteRule.objects.values_list("name", flat=True)) == ["short tool calls"]
    changes = list(AuditEvent.objects.filter(action=AuditAction.ROUTE_RULE_CHANGED).order_by("at", "id")
                   .values_list("detail__change", flat=True))
    assert changes == ["created", "created", "moved up", "deleted"]


@pytest.mark.django_db
def test_the_api_lists_adds_reorders_and_deletes_rules(client, team_setup, owner_token):  # noqa: F811
    team = team_setup["team_a"]
    route, local, cloud = _route(team)
    key, _ = key_issue(team=team, user=team_setup["alice"], name="ci")
    answer = call(client, "post", f"/routes/{route.pk}/rules", owner_token,
                  {"name": "", "tokens_under": 10, "tokens_over": 50, "header_value": "x", "channels": [999]})
    assert answer.status_code == 400
    assert set(answer.json()["errors"]) == {"name", "tokens_under", "header_name", "channels"}
    assert RouteRule.objects.count() == 0
    first = call(client, "post", f"/routes/{route.pk}/rules", owner_token,
                 {"name": "short tool calls", "tools": "with", "tokens_under": 4000, "channels": [local.pk]})
    assert first.status_code == 201, first.content
    assert first.json()["conditions"] == "has tools and under 4,000 input tokens"
    second = call(client, "post", f"/routes/{route.pk}/rules", owner_token,
                  {"name": "ci key", "key_id": key.pk, "api": "messages", "channels": [cloud.pk, local.pk]})
    assert second.status_code == 201 and second.json()["position"] == 1
    order = call(client, "put", f"/routes/{route.pk}/rule-order", owner_token,
                 {"rule_ids": [second.json()["id"], first.json()["id"]]})
    assert [rule["name"] for rule in order.json()] == ["ci key", "short tool calls"]
    shown = call(client, "get", f"/routes/{route.pk}", owner_token).json()
    assert [rule["name"] for rule in shown["rules"]] == ["ci key", "short tool calls"]
    assert [c["channel"] for c in shown["rules"][0]["channels"]] == ["cloud", "local-qwen"]
    assert call(client, "delete", f"/routes/{route.pk}/rules/{first.json()['id']}", owner_token).status_code == 204
    assert list(RouteRule.objects.values_list("name", flat=True)) == ["ci key"]
    assert AuditEvent.objects.filter(action=AuditAction.ROUTE_RULE_CHANGED).count() == 4


@pytest.mark.django_db
def test_a_viewer_cannot_change_rules(client, team_setup):
    from tests.support.api_helpers import token_for
    route, local, _ = _route(team_setup["team_a"])
    rule_save(route=route, name="tools", tools="with", channels=[local])
    viewer = token_for(team_setup["vera"], team_setup["team_a"])
    assert call(client, "get", f"/routes/{route.pk}/rules", viewer).status_code == 200
    refused = call(client, "post", f"/routes/{route.pk}/rules", viewer, {"name": "x", "tools": "with",
                                                                         "channels": [local.pk]})
    assert refused.status_code == 403 and RouteRule.objects.count() == 1


@pytest.mark.django_db
def test_a_rule_is_tried_on_a_sample_request_before_it_is_saved_and_nothing_is_written(client, team_setup):
    import json
    from html import unescape

    from django.urls import reverse

    team = team_setup["team_a"]
    route, local, cloud = _route(team)
    rule_save(route=route, name="batch jobs", header_name="x-workload", header_value="batch", channels=[cloud])
    client.force_login(team_setup["alice"])
    url = reverse("rule_create", args=[route.pk])
    assert "Try it on a sample request" in client.get(url).content.decode()
    short_tools = json.dumps({"model": "agent", "messages": [{"role": "user", "content": "Find the ticket."}],
                              "tools": [{"type": "function", "function": {"name": "search"}}]})
    rule = {"name": "short tools", "tools": "with", "tokens_under": "4000", "channel_0": local.pk, "try": "1",
            "sample_api": "chat"}

    def tried(**sample):
        response = client.post(url, {**rule, **sample})
        return response.status_code, unescape(response.content.decode())

    status, page = tried(sample=short_tools, sample_headers="x-workload: interactive")
    assert status == 200 and "This rule matches the sample." in page
    assert "The request would go to this rule's channels: local-qwen." in page
    assert "has tools</td><td>has tools</td>" in page and "under 4,000 input tokens" in page
    status, page = tried(sample=short_tools, sample_headers="X-Workload: batch")
    assert "Rules above this one match it first: batch jobs." in page
    assert "The request would go to the rule batch jobs's channels (it comes first)." in page
    status, page = tried(sample=json.dumps({"messages": [{"role": "user", "content": "x" * 20_000}]}))
    assert "This rule does not match the sample." in page and "the route's own channels" in page
    assert "about 5,004 input tokens" in page and page.count(">fails<") == 2  # no tools, and too long
    status, page = tried(sample="{not json", sample_headers="no colon here")
    assert status == 400 and "The sample is not JSON" in page and "Line 1 is not a header" in page
    assert list(RouteRule.objects.values_list("name", flat=True)) == ["batch jobs"]  # a Try saves nothing


def test_the_try_button_shows_each_condition_against_the_sample_in_the_browser(page, live_server, team_setup):
    route, local, cloud = _route(team_setup["team_a"])
    sign_in(page, live_server.url, "alice", "pw-alice-123")
    page.goto(f"{live_server.url}/channels/routes/{route.pk}/rules/new/")
    page.fill("#id_name", "short tools")
    page.select_option("#id_tools", "with")
    page.fill("#id_tokens_under", "4000")
    page.select_option("#id_channel_0", str(local.pk))
    page.fill("#id_sample", '{"messages": [{"role": "user", "content": "Find it."}], "tools": [{"type": "function"}]}')
    page.click("button:has-text('Try')")
    expect(page.locator(".trial")).to_contain_text("This rule matches the sample.")
    expect(page.locator(".trial tbody tr")).to_have_count(2)
    expect(page.locator("#id_name")).to_have_value("short tools")  # the form keeps what was typed
    screenshot(page, "route-rule-try")
    assert RouteRule.objects.count() == 0
