"""Budgets per tag: the gateway holds and counts a tagged request against each of its tags' budgets and refuses one
a tag's budget cannot cover (402, naming the tag) while other tags and untagged requests go on; the 80% notice of a
tag budget; the reconciliation rebuilds a tag's counter from the usage records; the page, its form and the API set
one, and bad input writes nothing."""
import httpx
import pytest
import redis
from django.conf import settings
from django.urls import reverse

from panel.audit.models import AuditAction, AuditEvent
from panel.budgets.models import Budget, BudgetNotice
from panel.budgets.reservations import prompt_bound
from panel.budgets.services import budget_set, budget_usage, budgets_reconcile
from panel.usage.models import RequestLog
from tests.budgets.test_budgets import CHAT, LONG, admin_client, gateway, priced  # noqa: F401 (fixtures)
from tests.support.api_helpers import call, owner_token  # noqa: F401 (fixtures)
from tests.support.waiting import wait_until


def ask(gateway, raw, tags=None, body=CHAT):
    headers = {"Authorization": f"Bearer {raw}", **({"x-tokenwise-tags": tags} if tags else {})}
    return httpx.post(f"{gateway.url}/v1/chat/completions", json=body, timeout=30, headers=headers)


def logged(count):
    return wait_until(lambda: RequestLog.objects.count() >= count, seconds=10, message=f"{count} usage records")


def tag_use(team, tag):
    return next(use for use in budget_usage(team=team) if use.name == f"Tag {tag}")


def test_a_tag_budget_refuses_its_tag_and_leaves_other_requests_alone(gateway, priced):
    team, raw = priced["team"], priced["raw_app"]
    priced["fake"].behave("ok", chunks=400)
    most = prompt_bound(LONG).tokens + LONG["max_tokens"]
    budget_set(team=team, tag="search", tokens_per_month=404 + most, user=priced["alice"])
    assert ask(gateway, raw, "search", LONG).status_code == 200  # 404 tokens
    assert ask(gateway, raw, "Search, beta", LONG).status_code == 200  # 808: its most fitted exactly
    logged(2)
    assert wait_until(lambda: BudgetNotice.objects.filter(budget__tag="search").first(), seconds=5,
                      message="the tag budget's 80% notice").level == BudgetNotice.Level.ALERT
    refused = ask(gateway, priced["raw_batch"], "beta,search", LONG)  # another key: the tag's budget is the team's
    assert refused.status_code == 402
    said = refused.json()["error"]["message"]
    assert (f'the "search" tag\'s monthly budget of {404 + most:,} tokens has {most - 404} left (808 spent, 0 held '
            f"for requests in flight): lower max_tokens or raise the budget") in said
    assert ask(gateway, raw, "beta").status_code == 200  # another tag
    assert ask(gateway, raw).status_code == 200  # no tag
    logged(5)
    assert tag_use(team, "search").tokens == 808 and tag_use(team, "search").level == "alert"

    # A Redis flush forgets the tag's counter; the reconciliation brings it back from the usage records.
    redis.Redis.from_url(settings.REDIS_URL).flushdb()
    budgets_reconcile()
    again = ask(gateway, raw, "search")
    assert again.status_code == 402 and "808 spent" in again.json()["error"]["message"]


def test_a_budget_set_after_the_spend_counts_the_tags_spend_this_month(gateway, priced):
    team = priced["team"]
    assert ask(gateway, priced["raw_app"], "nightly").status_code == 200
    logged(1)
    budget_set(team=team, tag="nightly", tokens_per_month=24, user=priced["alice"])  # counted before it existed
    refused = ask(gateway, priced["raw_app"], "nightly")
    assert refused.status_code == 402
    assert 'the "nightly" tag\'s monthly budget of 24 tokens is spent (24 tokens this month)' in \
        refused.json()["error"]["message"]
    assert tag_use(team, "nightly").level == "exhausted"


def test_the_page_sets_a_tag_budget_and_shows_its_use(admin_client, priced):
    response = admin_client.post(reverse("budget_edit"), {"target": "tag", "tag": " Search ",
                                                          "tokens_per_month": "1000"})
    assert response.status_code == 302
    budget = Budget.objects.get()
    assert (budget.tag, budget.key, budget.tokens_per_month) == ("search", None, 1000)
    assert AuditEvent.objects.get(action=AuditAction.BUDGET_CHANGED).target == "tag search"
    page = admin_client.get(reverse("budgets")).content.decode()
    assert 'data-scope="tag-search"' in page and "Tag search" in page and "x-tokenwise-tags" in page


@pytest.mark.parametrize("data, words", [
    ({"target": "tag", "tag": "", "tokens_per_month": "5"}, "Name the tag"),
    ({"target": "tag", "tag": "two words", "tokens_per_month": "5"}, "is not a tag"),
    ({"target": "team", "tag": "search", "tokens_per_month": "5"}, "A tag is named only for a tag&#x27;s budget"),
])
def test_a_bad_tag_budget_is_refused_and_writes_nothing(admin_client, priced, data, words):
    response = admin_client.post(reverse("budget_edit"), data)
    assert response.status_code == 400 and words in response.content.decode()
    assert Budget.objects.count() == 0 and not AuditEvent.objects.filter(action=AuditAction.BUDGET_CHANGED).exists()


def test_the_api_sets_and_lists_a_tag_budget_and_refuses_a_key_and_a_tag_together(client, priced, owner_token):
    both = call(client, "put", "/budgets", owner_token, {"key": priced["app"].pk, "tag": "search",
                                                          "tokens_per_month": 5})
    assert both.status_code == 400 and "not both" in both.json()["detail"]
    bad = call(client, "put", "/budgets", owner_token, {"tag": "no|pipes", "tokens_per_month": 5})
    assert bad.status_code == 400 and "is not a tag" in bad.json()["detail"]
    assert Budget.objects.count() == 0
    done = call(client, "put", "/budgets", owner_token, {"tag": "Search", "money_per_month": "3.00"})
    assert done.status_code == 200
    [tag] = [use for use in done.json() if use["scope"] == "tag"]
    assert (tag["id"], tag["tag"], tag["name"], tag["money_per_month"]) == (None, "search", "Tag search", "3.00")
    RequestLog.objects.create(team=priced["team"], endpoint="chat", model="chat", status_code=200, outcome="ok",
                              latency_ms=1, prompt_tokens=7, tags="|search|beta|")
    RequestLog.objects.create(team=priced["team"], endpoint="chat", model="chat", status_code=200, outcome="ok",
                              latency_ms=1, prompt_tokens=9)
    listed = call(client, "get", "/budgets", owner_token).json()
    assert next(use for use in listed if use["scope"] == "tag")["tokens"] == 7
    export = call(client, "get", "/usage?tag=beta", owner_token).json()["items"]
    assert [item["tags"] for item in export] == [["search", "beta"]]
    assert call(client, "get", "/usage?tag=a%20b", owner_token).status_code == 400
