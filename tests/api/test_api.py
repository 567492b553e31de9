"""The management API as a script uses it: a personal access token, JSON in and out, the pages' rules (roles, team
scoping, validation that saves nothing), audit rows, and the usage export's keyset pages."""
import json
import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from panel.accounts.models import AccessToken, Membership, Role, TeamKey
from panel.accounts.services import member_remove, member_role_change
from panel.audit.models import AuditAction, AuditEvent
from panel.channels.models import Channel, Route
from panel.usage.models import RequestLog
from tests.support.api_helpers import call, owner_token, token_for  # noqa: F401 (owner_token: a fixture)

API = "/api/v1"


def test_it_serves_the_schema_and_a_local_docs_page(client, team_setup):
    schema = call(client, "get", "/openapi.json", token_for(team_setup["alice"], team_setup["team_a"])).json()
    assert schema["openapi"].startswith("3.")
    assert {"/api/v1/keys", "/api/v1/usage", "/api/v1/webhooks", "/api/v1/routes/{route_id}/canary/promote"} <= set(
        schema["paths"])
    ids = [op["operationId"] for path in schema["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids)) > 40 and "keys_issue" in ids
    client.force_login(team_setup["alice"])
    docs = client.get(f"{API}/docs")
    assert docs.status_code == 200
    page = docs.content.decode()
    assert "swagger-ui-bundle.js" in page and "/static/" in page
    # Nothing from another origin (a bare "cdn" check failed once on a CSRF token that happened to contain it)
    assert re.findall(r"""(?:src|href)=["']((?:https?:)?//[^"']+)""", page) == []
    assert "cdn.jsdelivr" not in page and "unpkg.com" not in page


def test_it_refuses_a_missing_wrong_revoked_or_expired_token(client, team_setup, owner_token):
    assert call(client, "get", "/team").status_code == 401
    assert call(client, "get", "/team", owner_token + "x").status_code == 401
    assert call(client, "get", "/team", "tw-" + owner_token[4:]).status_code == 401
    answer = call(client, "get", "/team", owner_token)
    assert answer.status_code == 200 and answer.json() == {
        "id": team_setup["team_a"].pk, "name": "Team A", "slug": "team-a", "role": "owner", "via": "token"}
    token = AccessToken.objects.get(user=team_setup["alice"])
    assert token.last_used_at is not None and token.token_hash != owner_token and token.last4 == owner_token[-4:]
    AccessToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert call(client, "get", "/team", owner_token).status_code == 401
    AccessToken.objects.filter(pk=token.pk).update(expires_at=None, revoked_at=timezone.now())
    assert call(client, "get", "/team", owner_token).status_code == 401


def test_a_token_acts_with_the_lower_of_its_role_and_the_members_role(client, team_setup, django_user_model):
    carol = django_user_model.objects.create_user("carol", password="pw-carol-123")
    from panel.accounts.services import membership_add

    membership = membership_add(team=team_setup["team_a"], user=carol, role=Role.ADMIN)
    as_viewer = token_for(carol, team_setup["team_a"], role=Role.VIEWER)
    as_admin = token_for(carol, team_setup["team_a"])
    assert call(client, "get", "/members", as_viewer).status_code == 403
    assert call(client, "get", "/members", as_admin).status_code == 200
    owner = Membership.objects.get(user=team_setup["alice"], team=team_setup["team_a"])
    member_role_change(actor=owner, membership=membership, role=Role.MEMBER)
    assert call(client, "get", "/members", as_admin).status_code == 403  # demoted: at once
    refused = AuditEvent.objects.filter(action=AuditAction.REFUSED, actor=carol)
    assert refused.count() == 2 and refused.first().detail == {"needed": "admin", "had": "member"}
    member_remove(actor=owner, membership=Membership.objects.get(pk=membership.pk))
    assert call(client, "get", "/team", as_admin).status_code == 401  # removed: the token is dead
    with pytest.raises(Exception, match="cannot do more than you"):
        token_for(team_setup["vera"], team_setup["team_a"], role=Role.ADMIN)


def test_tokens_are_issued_once_listed_and_revoked_with_audit(client, team_setup):
    client.force_login(team_setup["vera"])
    page = client.post("/account/tokens/new/", {"name": "dashboards script", "role": "viewer"})
    assert page.status_code == 200 and page["Cache-Control"] == "no-store"
    raw = page.content.decode().split('id="new-token">', 1)[1].split("<", 1)[0]
    assert raw.startswith("twp-")
    listed = call(client, "get", "/tokens", raw).json()
    assert [(t["name"], t["role"], t["status"], t["masked"]) for t in listed] == [
        ("dashboards script", "viewer", "active", "twp-…" + raw[-4:])]
    assert raw not in client.get("/account/").content.decode()
    assert call(client, "post", "/tokens", raw, {"name": "second"}).status_code == 403  # only a session issues
    issued = call(client, "post", "/tokens", body={"name": "second", "expires_at": "2999-01-01T00:00:00Z"})
    assert issued.status_code == 201 and issued.json()["token"].startswith("twp-")
    revoked = call(client, "post", f"/tokens/{listed[0]['id']}/revoke", issued.json()["token"])
    assert revoked.status_code == 200 and revoked.json()["status"] == "revoked"
    assert call(client, "get", "/tokens", raw).status_code == 401
    actions = list(AuditEvent.objects.filter(actor=team_setup["vera"]).values_list("action", flat=True))
    assert actions.count(AuditAction.TOKEN_ISSUED) == 2 and AuditAction.TOKEN_REVOKED in actions
    assert all(raw not in json.dumps(row) for row in AuditEvent.objects.values("target", "detail"))
    bob = token_for(team_setup["bob"], team_setup["team_b"])
    assert call(client, "post", f"/tokens/{listed[0]['id']}/revoke", bob).status_code == 404


def test_a_browser_session_works_and_needs_csrf_for_changes(team_setup):
    from django.test import Client

    browser = Client(enforce_csrf_checks=True)
    browser.force_login(team_setup["alice"])
    assert call(browser, "get", "/team").json()["via"] == "session"
    refused = call(browser, "post", "/keys", body={"name": "no csrf"})
    assert refused.status_code in (401, 403) and not TeamKey.objects.exists()
    browser.get("/keys/")  # sets the CSRF cookie, as the page does
    token = browser.cookies["csrftoken"].value
    made = call(browser, "post", "/keys", body={"name": "with csrf"}, HTTP_X_CSRFTOKEN=token)
    assert made.status_code == 201 and TeamKey.objects.filter(name="with csrf").exists()
    assert made["Cache-Control"] == "no-store"


def test_keys_are_issued_listed_and_revoked_like_on_the_page(client, team_setup, owner_token):
    Route.objects.create(team=team_setup["team_a"], model_name="chat")
    bad = call(client, "post", "/keys", owner_token, {"name": "svc", "allowed_models": ["nope"]})
    assert bad.status_code == 400 and "No route serves nope" in bad.json()["errors"]["allowed_models"][0]
    assert not TeamKey.objects.exists()
    made = call(client, "post", "/keys", owner_token, {"name": "svc", "allowed_models": ["chat"], "rpm_limit": 60})
    assert made.status_code == 201
    body = made.json()
    key = TeamKey.objects.get()
    assert body["key"].startswith("tw-") and body["key"][-4:] == key.last4 and body["allowed_models"] == ["chat"]
    assert [k["id"] for k in call(client, "get", "/keys", owner_token).json()] == [key.pk]
    assert "key" not in call(client, "get", f"/keys/{key.pk}", owner_token).json()
    assert call(client, "post", f"/keys/{key.pk}/revoke", owner_token).json()["status"] == "revoked"
    assert list(AuditEvent.objects.filter(action__in=[AuditAction.KEY_ISSUED, AuditAction.KEY_REVOKED]).values_list(
        "action", flat=True).order_by("id")) == [AuditAction.KEY_ISSUED, AuditAction.KEY_REVOKED]
    bob = token_for(team_setup["bob"], team_setup["team_b"])
    assert call(client, "get", f"/keys/{key.pk}", bob).status_code == 404
    assert call(client, "post", f"/keys/{key.pk}/revoke", bob).status_code == 404


def channel_body(**changes):
    body = {"name": "cloud", "kind": "remote", "base_url": "https://provider.example/v1", "model_id": "m",
            "credential_kind": "stored", "api_key": "sk-test-abcdef123456", "timeout_seconds": 10,
            "price_input_per_million": "1.5", "price_output_per_million": 2, "price_cached_per_million": "0.5"}
    body.update(changes)
    return body


def test_channels_validate_fully_save_nothing_on_error_and_never_return_the_key(client, team_setup, owner_token):
    bad = call(client, "post", "/channels", owner_token, channel_body(base_url="http://x/v1/v1"))
    assert bad.status_code == 400 and "/v1/v1" in bad.json()["errors"]["base_url"][0]
    bad = call(client, "post", "/channels", owner_token, channel_body(api_key="Bearer sk-abcdefgh"))
    assert bad.status_code == 400 and "without \"Bearer\"" in bad.json()["errors"]["api_key"][0]
    assert not Channel.objects.exists()
    made = call(client, "post", "/channels", owner_token, channel_body())
    assert made.status_code == 201, made.content
    channel = Channel.objects.get()
    assert channel.api_key() == "sk-test-abcdef123456" and "abcdef123456" not in made.content.decode()
    assert made.json()["credential"].endswith("3456")
    assert Decimal(made.json()["price_input_per_million"]) == Decimal("1.5")
    changed = call(client, "patch", f"/channels/{channel.pk}", owner_token, {"timeout_seconds": 20})
    assert changed.status_code == 200 and changed.json()["timeout_seconds"] == 20
    assert Channel.objects.get().api_key() == "sk-test-abcdef123456"  # kept: no api_key sent
    rotated = call(client, "post", f"/channels/{channel.pk}/credential", owner_token, {"api_key": "sk-new-key-99999"})
    assert rotated.status_code == 200 and Channel.objects.get().api_key() == "sk-new-key-99999"
    assert AuditEvent.objects.filter(action=AuditAction.CREDENTIAL_CHANGED).count() == 2  # created, rotated
    viewer = token_for(team_setup["vera"], team_setup["team_a"])
    assert call(client, "get", f"/channels/{channel.pk}", viewer).status_code == 200
    assert call(client, "patch", f"/channels/{channel.pk}", viewer, {"enabled": False}).status_code == 403
    assert Channel.objects.get().enabled


def test_settings_json_round_trips_and_a_bad_file_saves_nothing(client, team_setup, owner_token):
    text = json.dumps({"channels": {"local": {"base_url": "http://127.0.0.1:8000/v1", "api_key": "EMPTY",
                                              "model_id": "tiny"}}, "default_channel": "local"})
    bad = call(client, "post", "/settings.json", owner_token, {"text": text.replace("http://", "ftp://")})
    assert bad.status_code == 400 and not Channel.objects.exists() and not Route.objects.exists()
    done = call(client, "post", "/settings.json", owner_token, {"text": text})
    assert done.status_code == 201 and done.json()["channels"] == ["local"]
    exported = call(client, "get", "/settings.json?format=b", owner_token)
    assert exported.status_code == 200 and exported.json()["channels"]["local"]["model_id"] == "tiny"
    assert call(client, "get", "/settings.json?format=a", owner_token).status_code == 400


def test_routes_and_a_canary_by_api(client, team_setup, owner_token):
    made = [call(client, "post", "/channels", owner_token, channel_body(name=name)).json()["id"]
            for name in ("stable", "candidate")]
    bad = call(client, "post", "/routes", owner_token, {"model_name": "chat", "channels": [{"channel": 999999}]})
    assert bad.status_code == 400 and not Route.objects.exists()
    waking = call(client, "post", "/routes", owner_token, {"model_name": "chat", "while_waking": "snooze",
                                                           "channels": [{"channel": made[0]}]})
    assert waking.status_code in (400, 422) and "while_waking" in waking.text and not Route.objects.exists()
    route = call(client, "post", "/routes", owner_token, {"model_name": "chat", "channels": [{"channel": made[0]}]})
    assert route.status_code == 201 and route.json()["channels"][0]["channel"] == "stable"
    assert route.json()["while_waking"] == "fallback"  # a sleeping local engine: the next channel meanwhile
    waits = call(client, "put", f"/routes/{route.json()['id']}", owner_token,
                 {"model_name": "chat", "while_waking": "wait", "channels": [{"channel": made[0]}]})
    assert waits.status_code == 200 and waits.json()["while_waking"] == "wait"
    assert Route.objects.get().while_waking == "wait"
    assert route.json()["spill_wait_ms"] == 0  # off unless asked
    spill = {"model_name": "chat", "while_waking": "wait", "channels": [{"channel": made[0]}], "spill_wait_ms": 20}
    refused = call(client, "put", f"/routes/{route.json()['id']}", owner_token, spill)
    assert refused.status_code == 400 and "from 50 to 600,000" in refused.text
    assert Route.objects.get().spill_wait_ms == 0
    spill["spill_wait_ms"] = 2000
    spills = call(client, "put", f"/routes/{route.json()['id']}", owner_token, spill)
    assert spills.status_code == 200 and spills.json()["spill_wait_ms"] == 2000
    route_id = route.json()["id"]
    started = call(client, "post", f"/routes/{route_id}/canary", owner_token, {"channel": made[1], "percent": 5})
    assert started.status_code == 200 and started.json()["canary"]["state"] == "running"
    refused = call(client, "post", f"/routes/{route_id}/canary/promote", owner_token)  # no verdict yet
    assert refused.status_code == 400 and "no passing verdict yet" in refused.json()["detail"]
    promoted = call(client, "post", f"/routes/{route_id}/canary/promote?override_reason=checked+by+hand",
                    owner_token)
    assert promoted.json()["canary"]["percent"] == 25
    back = call(client, "post", f"/routes/{route_id}/canary/rollback", owner_token, {"reason": "P99 doubled"})
    assert back.json()["canary"] == {**back.json()["canary"], "state": "rolled_back", "percent": 0,
                                     "reason": "P99 doubled"}
    assert call(client, "post", f"/routes/{route_id}/canary/stop", owner_token).status_code == 400
    from panel.notifications.models import Notification

    assert Notification.objects.get(kind="canary.rolled_back").facts["reason"] == "P99 doubled"


def test_a_routes_traffic_samples_by_api(client, team_setup, owner_token):
    from panel.core import crypto
    from panel.usage.models import TrafficSample

    made = call(client, "post", "/channels", owner_token, channel_body(name="stable")).json()["id"]
    route_id = call(client, "post", "/routes", owner_token,
                    {"model_name": "chat", "channels": [{"channel": made}]}).json()["id"]
    assert call(client, "get", f"/routes/{route_id}", owner_token).json()["sampling"] == {
        "samples_per_day": 0, "retention_days": 14, "redactions": [], "kept": 0}
    bad = call(client, "put", f"/routes/{route_id}/sampling", owner_token,
               {"samples_per_day": 10, "redactions": ["ok", "(?<=@)\\w+"]})
    assert bad.status_code == 400 and "line 2: the pattern looks ahead or behind" in bad.text
    assert Route.objects.get().samples_per_day == 0
    assert call(client, "put", f"/routes/{route_id}/sampling", owner_token,
                {"samples_per_day": 1001}).status_code in (400, 422)
    done = call(client, "put", f"/routes/{route_id}/sampling", owner_token,
                {"samples_per_day": 10, "retention_days": 3, "redactions": [r"CUST-\d{6}"]})
    assert done.json() == {"samples_per_day": 10, "retention_days": 3, "redactions": [r"CUST-\d{6}"], "kept": 0}
    route = Route.objects.get()
    TrafficSample.objects.create(team=route.team, route=route, endpoint="chat", model="chat", redacted=1,
                                 payload=crypto.encrypt(json.dumps({"messages": [{"role": "user", "content": "Hi"}],
                                                                    "answer": "Hello", "json_requested": False})))
    [kept] = call(client, "get", f"/routes/{route_id}/samples?limit=5", owner_token).json()
    assert (kept["messages"], kept["answer"], kept["redacted"]) == ([{"role": "user", "content": "Hi"}], "Hello", 1)
    viewer = token_for(team_setup["vera"], team_setup["team_a"])
    assert call(client, "get", f"/routes/{route_id}/samples", viewer).status_code == 403
    assert call(client, "delete", f"/routes/{route_id}/samples", viewer).status_code == 403
    assert call(client, "delete", f"/routes/{route_id}/samples", owner_token).status_code == 204
    assert not TrafficSample.objects.exists()
    assert AuditEvent.objects.filter(action__in=["route_sampling_changed", "samples_deleted"]).count() == 2


def test_a_shadow_test_by_api(client, team_setup, owner_token):
    from panel.channels.models import ShadowTest
    from panel.channels.shadow import shadow_record

    stable, small = [call(client, "post", "/channels", owner_token, channel_body(name=name)).json()["id"]
                     for name in ("stable", "small")]
    route_id = call(client, "post", "/routes", owner_token,
                    {"model_name": "chat", "channels": [{"channel": stable}]}).json()["id"]
    on_route = call(client, "post", f"/routes/{route_id}/shadow-tests", owner_token,
                    {"channel": stable, "percent": 10, "budget": "2"})
    assert on_route.status_code == 400 and "already serves this route" in on_route.json()["errors"]["channel"][0]
    assert call(client, "post", f"/routes/{route_id}/shadow-tests", owner_token,
                {"channel": small, "percent": 0, "budget": "2"}).status_code in (400, 422)
    viewer = token_for(team_setup["vera"], team_setup["team_a"])
    assert call(client, "post", f"/routes/{route_id}/shadow-tests", viewer,
                {"channel": small, "percent": 10, "budget": "2"}).status_code == 403
    assert not ShadowTest.objects.exists()
    started = call(client, "post", f"/routes/{route_id}/shadow-tests", owner_token,
                   {"channel": small, "percent": 10, "budget": "2", "min_similarity": 0.7})
    assert started.status_code == 201 and started.json()["state"] == "running"
    shadow_record(shadow_id=started.json()["id"], ok=True, similarity=0.9, passed=True, cost=Decimal("0.5"),
                  latency_ms=10, client_latency_ms=20, client_cost=Decimal("1"))
    [listed] = call(client, "get", f"/routes/{route_id}/shadow-tests", viewer).json()
    assert (listed["candidate"], listed["min_similarity"], listed["summary"]["passed"]) == ("small", 0.7, 1)
    assert listed["summary"]["cost_per_accepted"] == "0.5" and listed["summary"]["budget_left"] == "1.5"
    stopped = call(client, "post", f"/routes/{route_id}/shadow-tests/stop", owner_token)
    assert stopped.json()["state"] == "stopped"
    assert call(client, "post", f"/routes/{route_id}/shadow-tests/stop", owner_token).status_code == 400


def test_budgets_by_api(client, team_setup, owner_token):
    assert call(client, "put", "/budgets", owner_token, {"money_per_month": "-1"}).status_code == 400
    done = call(client, "put", "/budgets", owner_token, {"money_per_month": "12.50", "tokens_per_month": 1000})
    team = next(use for use in done.json() if use["scope"] == "team")
    assert Decimal(team["money_per_month"]) == Decimal("12.50") and team["tokens_per_month"] == 1000
    assert AuditEvent.objects.filter(action=AuditAction.BUDGET_CHANGED).count() == 1


def test_the_usage_export_pages_by_cursor_without_gaps_or_repeats(client, team_setup, owner_token):
    team, other = team_setup["team_a"], team_setup["team_b"]
    start = timezone.now() - timedelta(hours=3)
    rows = [RequestLog(team=team if i % 5 else other, created_at=start + timedelta(seconds=i), endpoint="chat",
                       model="chat" if i % 2 else "other", status_code=200, outcome="ok", latency_ms=10,
                       prompt_tokens=i, cost=Decimal("0.001")) for i in range(600)]
    RequestLog.objects.bulk_create(rows)
    expected = list(RequestLog.objects.filter(team=team).order_by("id").values_list("id", flat=True))
    seen, cursor, pages = [], None, 0
    while True:
        answer = call(client, "get", "/usage?limit=97" + (f"&cursor={cursor}" if cursor else ""), owner_token)
        assert answer.status_code == 200
        seen += [item["id"] for item in answer.json()["items"]]
        cursor, pages = answer.json()["next_cursor"], pages + 1
        if cursor is None:
            break
    assert seen == expected and pages == -(-len(expected) // 97)
    since = (start + timedelta(seconds=300)).isoformat()
    until = (start + timedelta(seconds=400)).isoformat()
    window = call(client, "get", "/usage", owner_token, data={"since": since, "until": until, "model": "chat"}).json()
    assert [item["prompt_tokens"] for item in window["items"]] == [i for i in range(300, 400) if i % 2 and i % 5]
    assert call(client, "get", "/usage?cursor=bogus", owner_token).status_code == 400
    viewer = token_for(team_setup["vera"], team_setup["team_a"])
    assert call(client, "get", "/usage?limit=1", viewer).status_code == 200


def test_another_teams_objects_are_404_and_nothing_changes(client, team_setup, owner_token):
    bob = token_for(team_setup["bob"], team_setup["team_b"])
    channel_id = call(client, "post", "/channels", owner_token, channel_body()).json()["id"]
    assert call(client, "get", f"/channels/{channel_id}", bob).status_code == 404
    assert call(client, "patch", f"/channels/{channel_id}", bob, {"enabled": False}).status_code == 404
    assert call(client, "delete", f"/channels/{channel_id}", bob).status_code == 404
    assert Channel.objects.get(pk=channel_id).enabled
    assert [c["id"] for c in call(client, "get", "/channels", bob).json()] == []


def test_a_body_over_the_form_limit_is_a_413_in_words(client, team_setup, owner_token, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2048
    answer = call(client, "post", "/keys", owner_token, {"name": "x" * 5000})
    assert answer.status_code == 413 and "larger than 2,048 bytes" in answer.json()["detail"]
    assert not TeamKey.objects.exists()


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory):
    from panel.registry.demo_model import build_demo_model

    path = tmp_path_factory.mktemp("api-registry") / "tiny"
    build_demo_model(path)
    return path


def test_models_profiles_and_config_toml_by_api(client, team_setup, owner_token, demo_model):
    bad = call(client, "post", "/models", owner_token, {"source": "/no/such/folder"})
    assert bad.status_code == 400 and "source" in bad.json()["errors"]
    made = call(client, "post", "/models", owner_token, {"source": str(demo_model), "name": "tiny"})
    assert made.status_code == 201, made.content
    model_id = made.json()["id"]
    detail = call(client, "get", f"/models/{model_id}", owner_token).json()
    assert detail["memory"]["kv_bytes_per_token"] > 0 and detail["memory"]["rows"][0]["weights_bytes"] > 0
    refused = call(client, "post", "/profiles", owner_token, {"name": "p", "model": model_id,
                                                              "gpu_memory_utilization": 1.5})
    assert refused.status_code == 400 and "gpu_memory_utilization" in refused.json()["errors"]
    from panel.serving.models import ServingProfile

    assert not ServingProfile.objects.exists()
    profile = call(client, "post", "/profiles", owner_token, {"name": "p", "model": model_id, "block_size": 32,
                                                               "max_model_len": 2048})
    assert profile.status_code == 201, profile.content
    body = profile.json()
    assert body["values"]["block_size"] == 32 and body["command"][1:3] == ["-m", "engine.serve"]
    toml = call(client, "get", f"/profiles/{body['id']}/export/toml", owner_token)
    assert toml.status_code == 200 and toml["Content-Type"].startswith("application/toml")
    assert "[kv_cache]" in toml.content.decode()
    text = toml.content.decode().replace(f'name = "{demo_model}"', 'name = "tiny"')
    copy = call(client, "post", "/profiles/import", owner_token, {"name": "copy", "config": text})
    assert copy.status_code == 201, copy.content
    assert {k: v for k, v in copy.json()["values"].items() if k != "name"} == {
        k: v for k, v in body["values"].items() if k != "name"}
    changed = call(client, "patch", f"/profiles/{body['id']}", owner_token, {"max_num_seqs": 8})
    assert changed.status_code == 200 and changed.json()["values"]["max_num_seqs"] == 8
    refused = call(client, "post", f"/models/{model_id}/evaluate", owner_token, {})
    assert refused.status_code == 400 and "has no parent" in refused.json()["errors"]["baseline"][0]
    bad = call(client, "post", f"/models/{model_id}/quantize", owner_token, {"calibration": "file"})
    assert bad.status_code == 400 and "calibration_file" in bad.json()["errors"]
    from panel.registry.models import QuantizationJob

    assert not QuantizationJob.objects.exists()
    job = call(client, "post", f"/models/{model_id}/quantize", owner_token, {})
    assert job.status_code == 201, job.content
    assert job.json()["state"] == "pending" and job.json()["source"] == "tiny"
    cancelled = call(client, "post", f"/quantization-jobs/{job.json()['id']}/cancel", owner_token)
    assert cancelled.json()["state"] == "cancelled"
    progress = call(client, "get", f"/quantization-jobs/{job.json()['id']}", owner_token).json()
    assert [event["to_state"] for event in progress["events"]] == ["pending", "cancelled"]
    launch = call(client, "post", f"/profiles/{body['id']}/deployments", owner_token, {})
    assert launch.status_code == 400  # no GPU worker online: refused in words, nothing saved
    from panel.serving.models import Deployment

    assert not Deployment.objects.exists() and launch.json()["detail"]
