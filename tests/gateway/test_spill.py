"""Spill to the cloud on overload: a route whose local engine (one batch slot here) is busy with a request sends the
next one to its cloud channel first when the expected wait (the requests beyond its slots × its measured time per
request) passes the route's spill wait; the row says `spilled` and the trail the wait it avoided; a request that
finds a free slot stays local; nothing is measured yet, nothing spills. The Cost tab counts what spilled and what it
cost; the route form and the API refuse a spill wait out of bounds and save nothing."""
import re
import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import timezone

from panel.channels.models import Channel, Route
from panel.channels.services import route_save
from panel.gateway.spill import expected_wait_ms, spill_order
from panel.serving.models import Deployment, ServingProfile
from panel.usage.models import RequestLog
from tests.support.channels import make_deployment
from tests.support.gateway import CHAT, fallback, gateway, post, primary, records, setup  # noqa: F401 (fixtures)
from tests.support.waiting import wait_until

STREAM = dict(CHAT, stream=True)


def engine_behind(setup, primary, *, spill_wait_ms):
    """The route's local channel is a deployment's engine with one batch slot; the route spills past the wait."""
    deployment = make_deployment(setup["team"], setup["alice"], "busy", served="up-model", state="ready",
                                 port=primary.port)
    Deployment.objects.filter(pk=deployment.pk).update(base_url=primary.base_url)
    ServingProfile.objects.filter(pk=deployment.profile_id).update(max_num_seqs=1)
    Channel.objects.filter(pk=setup["local"].pk).update(deployment=deployment, base_url=primary.base_url)
    Route.objects.filter(pk=setup["route"].pk).update(spill_wait_ms=spill_wait_ms)


def trail(row):
    return [(step["channel"], step["outcome"]) for step in row.attempt_trail]


def test_a_busy_engine_spills_the_next_request_to_the_cloud_and_a_free_one_keeps_it(gateway, setup, primary,
                                                                                     fallback):
    engine_behind(setup, primary, spill_wait_ms=300)
    primary.chunk_delay = 0.05  # 20 chunks: an answer takes about a second
    first = post(gateway, setup["raw"], STREAM)  # alone: no wait, and its time per request is measured
    assert first.status_code == 200, first.text
    assert not records()[0].spilled

    busy = threading.Thread(target=post, args=(gateway, setup["raw"], STREAM))
    busy.start()
    wait_until(lambda: len(primary.requests) == 2, seconds=10, interval=0.02, message="the engine busy")
    spilled = post(gateway, setup["raw"], STREAM)  # the slot is taken: a second's wait, past 300 ms
    busy.join(timeout=30)
    assert spilled.status_code == 200, spilled.text
    rows = records(3)
    row = next(row for row in rows if row.channel_id == setup["cloud"].pk)
    assert row.spilled is True and trail(row) == [("local", "spilled"), ("cloud", "ok")]
    assert 300 < row.attempt_trail[0]["expected_wait_ms"] < 5000, row.attempt_trail
    assert len(primary.requests) == 2 and len(fallback.requests) == 1  # the engine never saw the spilled one
    assert [r.spilled for r in rows if r.channel_id == setup["local"].pk] == [None, None]

    again = post(gateway, setup["raw"], STREAM)  # the slot is free again: it stays local
    assert again.status_code == 200
    last = records(4)[-1]
    assert last.channel_id == setup["local"].pk and not last.spilled and trail(last) == [("local", "ok")]


def test_nothing_spills_before_the_engine_is_measured_or_with_no_cloud_behind_it(gateway, setup, primary, fallback):
    engine_behind(setup, primary, spill_wait_ms=50)
    primary.chunk_delay = 0.05
    busy = threading.Thread(target=post, args=(gateway, setup["raw"], STREAM))
    busy.start()
    wait_until(lambda: len(primary.requests) == 1, seconds=10, interval=0.02, message="the engine busy")
    response = post(gateway, setup["raw"], STREAM)  # busy, but no answer has been timed yet: no spill
    busy.join(timeout=30)
    assert response.status_code == 200
    assert [row.spilled for row in records(2)] == [None, None] and not fallback.requests


def test_the_wait_is_the_queue_beyond_the_slots_times_the_time_per_request():
    assert expected_wait_ms(1, 1, 800) == 0  # a free slot
    assert expected_wait_ms(2, 1, 800) == 800  # one ahead of it
    assert expected_wait_ms(9, 4, 800) == 1000  # five beyond four slots, which free up in parallel
    assert expected_wait_ms(3, None, 100) == 200  # no slots known: one

    class Kind:
        def __init__(self, kind):
            self.channel = type("C", (), {"kind": kind})()

    local, cloud, other = Kind("local"), Kind("remote"), Kind("remote")
    assert spill_order([local, cloud, other]) == [cloud, other, local]


def test_a_spill_is_no_failed_attempt_of_the_engine_it_passed_by(setup):
    """The engine was not called: the Latency tab's failures and the advisor's failing channels leave it out, and a
    client that leaves during the cloud call after a spill was being answered (its prompt is charged)."""
    import time

    from panel.advisor.services import advice
    from panel.dashboards.requests import failures_table
    from panel.dashboards.selectors import DashboardQuery
    from panel.gateway.exchange import Exchange

    team, local, cloud = setup["team"], setup["local"], setup["cloud"]
    spill = {"channel": local.name, "channel_id": local.pk, "outcome": "spilled", "ms": 0, "expected_wait_ms": 900}
    for outcome in ("ok", "ok", "client_closed", "ok", "ok"):
        RequestLog.objects.create(team=team, route=setup["route"], channel=cloud, endpoint="chat", model="chat",
                                  outcome=outcome, status_code=200 if outcome == "ok" else 499, latency_ms=10,
                                  spilled=True, attempts=1, attempt_trail=[
                                      spill, {"channel": cloud.name, "channel_id": cloud.pk, "outcome": outcome,
                                              "ms": 9}])
    table = failures_table(DashboardQuery(team=team, range="1h"), {local.pk: local.name, cloud.pk: cloud.name})
    assert [row[:2] for row in table.rows] == [[cloud.name, "client_closed"]]
    assert not [item for item in advice(team=team) if item.rule == "channel_failing"]

    exchange = Exchange("chat", time.perf_counter())
    exchange.log["trail"].append(spill)
    exchange.log["attempts"] = 1  # the cloud call, under way
    assert exchange.attempt_in_flight()


def test_the_cost_tab_counts_what_spilled_and_what_it_cost(setup, client):
    from panel.dashboards.pages import dashboard_page
    from panel.dashboards.rollup import usage_rollup_run
    from panel.dashboards.selectors import DashboardQuery

    team, cloud = setup["team"], setup["cloud"]
    now = timezone.now() - timedelta(minutes=5)
    for spilled, cost in ((True, "0.002"), (True, "0.003"), (None, "0.001"), (None, "0")):
        RequestLog.objects.create(team=team, route=setup["route"], channel=cloud, endpoint="chat", model="chat",
                                  outcome="ok", status_code=200, latency_ms=10, cost=Decimal(cost), spilled=spilled,
                                  created_at=now)
    usage_rollup_run()
    page = dashboard_page(tab="cost", query=DashboardQuery(team=team, range="24h"))
    rows = dict(page.table("savings").rows)
    assert rows["spilled to the cloud (local engine busy)"] == "2 requests (50 % of all)"
    assert rows["spilled requests' cost"] == pytest.approx(0.005)


def test_a_spill_wait_out_of_bounds_is_refused_and_nothing_is_saved(setup, client):
    route = setup["route"]
    for wrong in (10, -1, 600_001, True, 1.5):
        with pytest.raises(ValidationError, match="spill wait"):
            route_save(team=setup["team"], route=route, model_name="chat", entries=[], spill_wait_ms=wrong)
    route.refresh_from_db()
    assert route.spill_wait_ms == 0 and route.entries()  # the channels are still there

    client.force_login(setup["alice"])
    form = {"model_name": "chat", "strategy": "local_first", "fallback_on_error": "on", "enabled": "on",
            "deadline_seconds": "45", "spill_wait_ms": "20"}
    for position, channel in enumerate((setup["local"], setup["cloud"]), start=1):
        form.update({f"use_{channel.pk}": "on", f"position_{channel.pk}": str(position), f"weight_{channel.pk}": "1"})
    response = client.post(reverse("route_edit", args=[route.pk]), form)
    errors = re.findall(r'class="field-error"[^>]*>([^<]*)<', response.content.decode())
    assert response.status_code == 400 and errors == [
        "The spill wait is 0 (off) or a whole number of milliseconds from 50 to 600,000."], errors
    form["spill_wait_ms"] = "1500"
    assert client.post(reverse("route_edit", args=[route.pk]), form).status_code == 302
    route.refresh_from_db()
    assert route.spill_wait_ms == 1500
    page = client.get(reverse("route_detail", args=[route.pk])).content.decode()
    assert "spills to the cloud past a 1500 ms local wait" in page
