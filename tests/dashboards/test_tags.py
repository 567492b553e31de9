"""Spend by tag: the rollup by tag equals the tagged records it sums (a record with two tags under both, a late
record in its minute, every period), the Cost tab's table by tag follows the page's filters, and its CSV export."""
import csv
import io
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from django.urls import reverse

from panel.accounts.keys import key_issue
from panel.channels.models import Channel
from panel.dashboards.models import DAY, HOUR, MINUTE, TagRollup
from panel.dashboards.pages import dashboard_page
from panel.dashboards.rollup import usage_rollup_run
from panel.dashboards.selectors import DashboardQuery
from panel.usage.models import RequestLog


@pytest.fixture
def tagged(team_setup):
    team = team_setup["team_a"]
    cloud = Channel.objects.create(team=team, name="cloud", kind="remote", base_url="http://cloud/v1", model_id="c")
    web, batch = (key_issue(team=team, user=None, name=name)[0] for name in ("web", "batch"))
    now = datetime.now(timezone.utc).replace(second=30, microsecond=0)

    def record(key, tags, *, minutes_ago=5, prompt=100, completion=10, cost="0.01", outcome="ok", cache_write=None):
        return RequestLog.objects.create(
            team=team, key=key, channel=cloud, created_at=now - timedelta(minutes=minutes_ago), endpoint="chat",
            model="c", status_code=200 if outcome == "ok" else 502, outcome=outcome, prompt_tokens=prompt,
            completion_tokens=completion, cached_tokens=prompt // 2, cache_write_tokens=cache_write, latency_ms=50,
            cost=Decimal(cost), tags=tags)

    return {"team": team, "web": web, "batch": batch, "now": now, "record": record, **team_setup}


def tag_rows(query):
    table = dashboard_page(tab="cost", query=query).table("tags")
    return {row[0]: dict(zip(table.columns, row)) for row in table.rows}


def test_the_cost_tab_sums_each_tag_and_a_record_with_two_tags_counts_under_both(tagged):
    record, web, batch = tagged["record"], tagged["web"], tagged["batch"]
    record(web, "|search|")
    record(web, "|search|beta|", prompt=200, cost="0.02", cache_write=40)
    record(batch, "|beta|", outcome="error", prompt=0, completion=0, cost="0")
    record(batch, None, prompt=5000, cost="1")  # untagged: in the team's totals, in no tag's row
    usage_rollup_run()
    query = DashboardQuery(team=tagged["team"], range="1h", now=tagged["now"].timestamp())
    rows = tag_rows(query)
    assert list(rows) == ["search", "beta"]  # most cost first
    search, beta = rows["search"], rows["beta"]
    assert (search["requests"], search["prompt tokens"], search["completion tokens"]) == (2, 300, 20)
    assert (search["cached prompt tokens"], search["cache writes"], float(search["cost"])) == (150, 40, 0.03)
    assert (beta["requests"], beta["errors"], beta["prompt tokens"], float(beta["cost"])) == (2, 1, 200, 0.02)

    by_key = tag_rows(DashboardQuery(team=tagged["team"], range="1h", now=tagged["now"].timestamp(),
                                     key_id=batch.pk))  # the page's key filter applies to the table
    assert list(by_key) == ["beta"] and by_key["beta"]["requests"] == 1

    late = record(web, "|search|", minutes_ago=50)  # a new id in an old minute lands in that minute
    usage_rollup_run()
    assert tag_rows(query)["search"]["requests"] == 3
    for period in (MINUTE, HOUR, DAY):  # every period holds the same sums
        summed = sum(TagRollup.objects.filter(team=tagged["team"], period=period, tag="search")
                     .values_list("requests", flat=True))
        assert summed == 3, period
    minute = int(late.created_at.timestamp() // MINUTE * MINUTE)
    assert TagRollup.objects.get(period=MINUTE, tag="search", start=minute).requests == 1
    usage_rollup_run()  # twice changes nothing: one row per minute, tag, key (and channel, model)
    assert sorted(TagRollup.objects.filter(period=MINUTE).values_list("tag", "key_id", "requests")) == sorted([
        ("beta", batch.pk, 1), ("beta", web.pk, 1), ("search", web.pk, 2), ("search", web.pk, 1)])


def test_the_table_by_tag_exports_as_csv(client, tagged):
    tagged["record"](tagged["web"], "|search|")
    usage_rollup_run()
    client.force_login(tagged["alice"])
    response = client.get(reverse("dashboards_csv"), {"tab": "cost", "table": "tags", "range": "1h"})
    assert response.status_code == 200
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0][:3] == ["tag", "requests", "errors"] and rows[1][:2] == ["search", "1"]
    page = client.get(reverse("dashboards_cost")).content.decode()
    assert "Cost by tag" in page and "x-tokenwise-tags" in page
