"""Channel, route and settings.json pages as users see them: roles (viewers read, members test, admins change),
another team's objects are a 404, forms refuse bad input and save nothing, a stored key never reaches a page."""
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from panel.accounts.models import Role
from panel.accounts.services import membership_add
from panel.channels.models import Channel, ChannelKind, CredentialKind, Route
from panel.channels.services import channel_create, route_save
from tests.support.environment import FIXTURES
from tests.support.fake_provider import GOOD_KEY, FakeProvider

SEED_A = (FIXTURES / "seed_settings_a.json").read_text()
SEED_B = (FIXTURES / "seed_settings_b.json").read_text()
SECRET = "sk-page-secret-key-7788"


@pytest.fixture
def objects(team_setup, django_user_model):
    team = team_setup["team_a"]
    mary = django_user_model.objects.create_user("mary", password="pw-mary-123")
    membership_add(team=team, user=mary, role=Role.MEMBER)
    cloud = channel_create(team=team, name="cloud", kind=ChannelKind.REMOTE, base_url="https://api.example.com/v1",
                           model_id="qwen", credential_kind=CredentialKind.STORED, api_key=SECRET)
    route = route_save(team=team, model_name="qwen", entries=[(cloud, 0, 1)])
    return {"team": team, "cloud": cloud, "route": route, "mary": mary, **team_setup}


def form_data(**changes):
    data = {"name": "taotoken", "kind": "remote", "deployment": "", "base_url": "https://taotoken.net/api/v1",
            "model_id": "qwen2.5-7b-instruct", "enabled": "on", "credential_kind": "stored", "api_key": SECRET,
            "credential_env": "", "timeout_seconds": 120, "max_retries": 3, "retry_backoff": 1.5, "priority": 100,
            "weight": 1, "price_input_per_million": "0.5", "price_output_per_million": "1.5",
            "price_cached_per_million": "0.1"}
    data.update(changes)
    return {key: value for key, value in data.items() if value is not None}


def urls(objects):
    cloud, route = objects["cloud"].pk, objects["route"].pk
    return {  # url: (method, the role needed)
        reverse("channels"): ("get", "viewer"),
        reverse("channel_create"): ("get", "admin"),
        reverse("settings_import"): ("get", "admin"),
        reverse("settings_export") + "?format=b": ("get", "viewer"),
        reverse("channel_detail", args=[cloud]): ("get", "viewer"),
        reverse("channel_edit", args=[cloud]): ("get", "admin"),
        reverse("channel_test", args=[cloud]): ("post", "member"),
        reverse("channel_delete", args=[cloud]): ("post", "admin"),
        reverse("route_create"): ("get", "admin"),
        reverse("route_edit", args=[route]): ("get", "admin"),
        reverse("route_delete", args=[route]): ("post", "admin"),
        reverse("settings_export") + f"?format=a&route={route}": ("get", "viewer"),
    }


def test_viewers_read_members_test_admins_change(client, objects):
    client.force_login(objects["vera"])
    for url, (method, role) in urls(objects).items():
        status = getattr(client, method)(url).status_code
        assert (status == 403) == (role != "viewer"), (url, status)
        assert status in (200, 403), (url, status)
    client.force_login(objects["mary"])
    for url, (method, role) in urls(objects).items():
        if role == "admin":
            assert getattr(client, method)(url).status_code == 403, url
    assert Channel.objects.filter(pk=objects["cloud"].pk).exists() and Route.objects.count() == 1


def test_another_teams_channels_and_routes_are_a_404(client, objects):
    client.force_login(objects["bob"])  # owner of team B
    for url, (method, role) in urls(objects).items():
        if "/channels/" in url and any(char.isdigit() for char in url.split("?")[0]) or "route=" in url:
            assert getattr(client, method)(url).status_code == 404, url
    assert Channel.objects.filter(pk=objects["cloud"].pk).exists() and Route.objects.count() == 1
    page = client.get(reverse("channels")).content.decode()
    assert "No channels yet" in page and "api.example.com" not in page


def test_the_taotoken_preset_fills_the_form(client, objects):
    client.force_login(objects["alice"])
    page = client.get(reverse("channel_create") + "?preset=taotoken").content.decode()
    assert 'value="https://taotoken.net/api/v1"' in page and 'value="TAOTOKEN_API_KEY"' in page
    assert '<option value="env" selected>' in page
    assert '<option value="chat_only" selected>' in page  # Codex's Responses requests translated to chat


@pytest.mark.parametrize("changes, words", [
    ({"api_key": "Bearer " + SECRET}, "without &quot;Bearer&quot;"),
    ({"base_url": "https://taotoken.net/api/v1/v1"}, "Remove one: https://taotoken.net/api/v1"),
    ({"base_url": "https://taotoken.net/api/v1/chat/completions"}, "ends in /chat/completions"),
    ({"base_url": "taotoken.net/api/v1"}, "must start with http:// or https://"),
    ({"api_key": ""}, "Enter the key to store"),
    ({"max_retries": "lots"}, "Enter a whole number"),
    ({"name": "cloud"}, "already has a channel named"),
])
def test_the_form_refuses_bad_input_and_saves_nothing(client, objects, changes, words):
    client.force_login(objects["alice"])
    response = client.post(reverse("channel_create"), form_data(**changes))
    assert response.status_code == 400 and words in response.content.decode()
    assert SECRET not in response.content.decode()  # a typed key is not echoed back
    assert list(Channel.objects.values_list("name", flat=True)) == ["cloud"]


def test_a_saved_key_is_shown_only_as_its_last_four(client, objects):
    client.force_login(objects["alice"])
    response = client.post(reverse("channel_create"), form_data(base_url="https://taotoken.net/api"), follow=True)
    page = response.content.decode()
    channel = Channel.objects.get(name="taotoken")
    assert response.redirect_chain[-1][0] == reverse("channel_detail", args=[channel.pk])
    assert "has no /v1" in page and "••••7788" in page and SECRET not in page
    assert channel.api_key() == SECRET and SECRET not in channel.credential_ciphertext
    for url in (reverse("channel_edit", args=[channel.pk]), reverse("channels")):
        text = client.get(url).content.decode()
        assert SECRET not in text and channel.credential_ciphertext not in text
    # Editing with the key field empty keeps the key.
    response = client.post(reverse("channel_edit", args=[channel.pk]),
                           form_data(api_key="", base_url="https://taotoken.net/api/v1", model_id="qwen-max"))
    assert response.status_code == 302
    channel.refresh_from_db()
    assert channel.model_id == "qwen-max" and channel.api_key() == SECRET


def test_the_test_button_shows_the_diagnosis(client, objects):
    provider = FakeProvider()
    try:
        channel = channel_create(team=objects["team"], name="fake", kind=ChannelKind.REMOTE,
                                 base_url=provider.url + "/v1", model_id="nope", credential_kind=CredentialKind.STORED,
                                 api_key=GOOD_KEY)
        client.force_login(objects["mary"])  # a member may test
        page = client.post(reverse("channel_test", args=[channel.pk]), follow=True).content.decode()
        assert "failed the test" in page and "Diagnosis:" in page
        assert "&#x27;nope&#x27; is not served here" in page and "qwen2.5-7b-instruct, tiny" in page
        Channel.objects.filter(pk=channel.pk).update(model_id="tiny")
        page = client.post(reverse("channel_test", args=[channel.pk]), follow=True).content.decode()
        assert "fake answers" in page and "Passed" in page
    finally:
        provider.close()


def test_routes_are_made_and_edited_through_the_form(client, objects):
    team = objects["team"]
    box = channel_create(team=team, name="box", kind=ChannelKind.LOCAL, base_url="http://127.0.0.1:8000/v1",
                         model_id="tiny", credential_kind=CredentialKind.NONE)
    cloud = objects["cloud"]
    client.force_login(objects["alice"])
    data = {"model_name": "tiny", "strategy": "priority", "fallback_on_error": "on", "enabled": "on",
            f"use_{box.pk}": "on", f"position_{box.pk}": 5, f"weight_{box.pk}": 1,
            f"use_{cloud.pk}": "on", f"position_{cloud.pk}": 1, f"weight_{cloud.pk}": 1}
    assert client.post(reverse("route_create"), data).status_code == 302
    route = Route.objects.get(model_name="tiny")
    assert route.ordered_channels() == [cloud, box]
    response = client.post(reverse("route_create"), data)
    assert response.status_code == 400 and "already has a route" in response.content.decode()
    empty = {key: value for key, value in data.items() if not key.startswith("use_")}
    response = client.post(reverse("route_edit", args=[route.pk]), empty)
    assert response.status_code == 400 and "Pick at least one channel" in response.content.decode()
    data.update(strategy="local_first", **{f"use_{cloud.pk}": ""})
    saved = client.post(reverse("route_edit", args=[route.pk]), data)
    assert saved.status_code == 302 and saved.url == reverse("route_detail", args=[route.pk])  # back to the route
    route.refresh_from_db()
    assert route.strategy == "local_first" and route.ordered_channels() == [box]
    page = client.get(reverse("channels")).content.decode()
    assert "<code>tiny</code>" in page and "Local first" in page


def test_import_by_paste_and_by_upload_and_export_download(client, objects):
    client.force_login(objects["alice"])
    response = client.post(reverse("settings_import"), {"text": SEED_A}, follow=True)
    page = response.content.decode()
    assert "Imported settings.json (format A)" in page and "local_vllm" in page
    upload = SimpleUploadedFile("settings.json", SEED_B.encode(), content_type="application/json")
    page = client.post(reverse("settings_import"), {"file": upload}, follow=True).content.decode()
    assert "Imported settings.json (format B)" in page and "has no /v1" in page
    route = Route.objects.get(model_name="qwen2.5-14b-instruct")
    response = client.get(reverse("settings_export") + f"?format=a&route={route.pk}")
    assert response["Content-Disposition"] == 'attachment; filename="settings.json"'
    assert json.loads(response.content) == json.loads(SEED_A)
    everything = client.get(reverse("settings_export") + "?format=b").content.decode()
    assert SECRET not in everything and "${TOKENWISE_UPSTREAM_CLOUD}" in everything
    response = client.get(reverse("settings_export") + "?format=a", follow=True)
    assert "pick the route to export" in response.content.decode()
    assert client.get(reverse("settings_export") + "?format=c").status_code == 404
    assert client.get(reverse("settings_export") + "?route=abc").status_code == 404


@pytest.mark.parametrize("payload, words", [
    ("not json", "is not valid JSON"),
    (json.dumps({"channels": {"x": {"base_url": "http://127.0.0.1:8000/v1/v1", "model_id": "m"}},
                 "default_channel": "x"}), "<code>$.channels.x.base_url</code>: The base URL ends in /v1/v1"),
    ("{\"_note\": \"" + "x" * (1024 * 1024 + 10) + "\"}", "larger than 256 KB"),
    ("", "Paste a settings.json or upload one"),
])
def test_import_errors_are_shown_and_nothing_is_saved(client, objects, payload, words):
    client.force_login(objects["alice"])
    before = (Channel.objects.count(), Route.objects.count())
    response = client.post(reverse("settings_import"), {"text": payload})
    assert response.status_code == 400 and words in response.content.decode()
    assert (Channel.objects.count(), Route.objects.count()) == before


def test_a_big_upload_is_refused(client, objects):
    client.force_login(objects["alice"])
    upload = SimpleUploadedFile("settings.json", b" " * (2 * 1024 * 1024) + b"{}")
    response = client.post(reverse("settings_import"), {"file": upload})
    assert response.status_code == 400 and "larger than 256 KB" in response.content.decode()


def test_empty_states_say_what_to_do_first(client, team_setup):
    client.force_login(team_setup["alice"])
    page = client.get(reverse("channels")).content.decode()
    assert "No channels yet" in page and "Start a deployment" in page and "?preset=taotoken" in page
    assert "Routes appear once there are channels" in page
    client.force_login(team_setup["vera"])
    page = client.get(reverse("channels")).content.decode()
    assert "No channels yet" in page and "New channel" not in page and "Add a TaoToken channel" not in page


def test_delete_a_channel_and_a_route(client, objects):
    client.force_login(objects["alice"])
    assert client.post(reverse("route_delete", args=[objects["route"].pk])).status_code == 302
    assert client.post(reverse("channel_delete", args=[objects["cloud"].pk])).status_code == 302
    assert Channel.objects.count() == 0 and Route.objects.count() == 0
