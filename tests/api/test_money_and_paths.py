"""The API's answers in their own shape: money as a plain decimal string, and a 404 in JSON for a path it does not
have (a user walking the API met "0E-8" and Django's HTML 404 page)."""
import json
from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from panel.channels.models import Channel, ChannelKind, CredentialKind
from panel.usage.models import RequestLog
from tests.support.api_helpers import bearer, token_for

API = "/api/v1"


def test_money_is_a_plain_decimal_string(client, team_setup):
    team = team_setup["team_a"]
    raw = token_for(team_setup["alice"], team)
    RequestLog.objects.create(team=team, created_at=timezone.now() - timedelta(minutes=1), endpoint="chat",
                              model="m", status_code=200, outcome="ok", latency_ms=5, cost=Decimal("0"))
    RequestLog.objects.create(team=team, created_at=timezone.now(), endpoint="chat", model="m", status_code=200,
                              outcome="ok", latency_ms=5, cost=Decimal("0.00001234"))
    Channel.objects.create(team=team, name="cloud", kind=ChannelKind.REMOTE, base_url="https://api.example.com/v1",
                           model_id="m", credential_kind=CredentialKind.NONE,
                           price_input_per_million=Decimal("0.5"), price_output_per_million=Decimal("2"))
    usage = client.get(f"{API}/usage", **bearer(raw)).json()["items"]
    assert [item["cost"] for item in usage] == ["0.00000000", "0.00001234"]
    channel = client.get(f"{API}/channels", **bearer(raw)).json()[0]
    assert channel["price_input_per_million"] == "0.500000" and channel["price_output_per_million"] == "2.000000"
    raw_text = client.get(f"{API}/usage", **bearer(raw)).content.decode()
    assert "E-" not in raw_text


def test_an_unknown_api_path_is_a_json_404(client, team_setup):
    raw = token_for(team_setup["alice"], team_setup["team_a"])
    for path in ("/no-such-thing", "/keys/extra/parts", "/keys/999999/nothing"):
        answer = client.get(f"{API}{path}", **bearer(raw))
        assert answer.status_code == 404 and answer["Content-Type"] == "application/json"
        assert "/api/v1/docs" in json.loads(answer.content)["detail"]
    assert client.get(f"{API}/keys", **bearer(raw)).status_code == 200  # the real operations are untouched
    root = client.get(f"{API}/")
    assert root.status_code == 200 and root.json()["reference"] == "/api/v1/docs"
