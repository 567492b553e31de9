"""My usage: every member, viewers included, sees the traffic and spend of the keys they issued (with the
dashboards' charts) and of the routes they may use; a key's page shows that key's usage alone."""
import json
from decimal import Decimal

from django.utils import timezone
from plotly.graph_objects import Figure

from panel.accounts.keys import key_issue
from panel.accounts.models import Role
from panel.accounts.services import membership_add
from panel.channels.models import Route
from panel.dashboards.rollup import usage_rollup_run
from panel.usage.models import RequestLog


def traffic(team, key, count, model, cost="0.01"):
    RequestLog.objects.bulk_create([
        RequestLog(team=team, key=key, created_at=timezone.now(), endpoint="chat", model=model, status_code=200,
                   outcome="ok", latency_ms=20, ttft_ms=5, prompt_tokens=10, completion_tokens=5,
                   cost=Decimal(cost)) for _ in range(count)])


def test_a_viewer_sees_their_own_keys_and_the_routes_they_may_use(client, team_setup, django_user_model):
    team = team_setup["team_a"]
    mia = django_user_model.objects.create_user("mia", password="pw-mia-12345")
    membership_add(team=team, user=mia, role=Role.VIEWER)
    Route.objects.create(team=team, model_name="chat")
    Route.objects.create(team=team, model_name="secret-model")
    Route.objects.create(team=team, model_name="off", enabled=False)
    mine, _ = key_issue(team=team, user=mia, name="mia's notebook", allowed_models=["chat"])
    theirs, _ = key_issue(team=team, user=team_setup["alice"], name="alice's service")
    traffic(team, mine, 3, "chat")
    traffic(team, theirs, 7, "chat")
    traffic(team, theirs, 2, "secret-model")
    traffic(team_setup["team_b"], None, 5, "chat")
    usage_rollup_run(lock=False)
    client.force_login(mia)
    page = client.get("/usage/mine/?range=1h")
    assert page.status_code == 200
    cards = dict((label, value) for label, value, _ in page.context["page"].cards)
    assert cards["Requests"] == "3"  # her key only, not alice's 9, not team B's
    figures = page.context["figures"]
    assert {"requests", "tokens", "errors"} <= set(figures)
    Figure(figures["requests"])  # a valid plotly figure, as the dashboards draw it
    routes = page.context["page"].table("routes")
    # Her only key may call "chat": that route, with the whole team's 10 requests on it; not "secret-model".
    assert routes.rows == [["chat", 10, 150, 0.1]]
    data = client.get("/usage/mine/data/?range=1h").json()
    assert set(data) == {"figures", "tables", "cards"} and "chat" in data["tables"]


def test_a_keys_page_shows_that_keys_usage_only(client, team_setup):
    team = team_setup["team_a"]
    one, _ = key_issue(team=team, user=team_setup["alice"], name="one")
    two, _ = key_issue(team=team, user=team_setup["alice"], name="two")
    traffic(team, one, 4, "chat")
    traffic(team, two, 6, "chat")
    usage_rollup_run(lock=False)
    client.force_login(team_setup["vera"])  # a viewer: key pages are for every member
    page = client.get(f"/keys/{one.pk}/?range=1h")
    assert page.status_code == 200
    assert dict((label, value) for label, value, _ in page.context["page"].cards)["Requests"] == "4"
    assert "one" in page.content.decode() and one.masked in page.content.decode()
    assert json.loads(client.get(f"/keys/{two.pk}/data/?range=1h").content)["cards"].count("6") >= 1
    client.force_login(team_setup["bob"])
    assert client.get(f"/keys/{one.pk}/").status_code == 404
