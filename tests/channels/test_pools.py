"""vLLM pools on the channel pages: a pool (engines the panel did not start) saved with its scrape URLs, token, GPUs
and price per GPU-hour; its token stored encrypted and shown only as its last four; bad input refused in words with
nothing written; a stored token never follows the scrape URLs to another server; what the gateway's target and the
evaluation runs read of it."""
import json

import pytest
from django.urls import reverse

from panel.channels.models import Channel, ChannelKind, CredentialKind
from panel.channels.routing import target_for
from panel.channels.services import channel_create, channel_update
from panel.core import crypto
from panel.evaluations.runs import answer_cost, local_hourly_prices

TOKEN = "pool-scrape-token-4242"
URLS = "http://127.0.0.1:18001/metrics\r\nhttp://127.0.0.1:18002/metrics"


def pool_form(**changes):
    data = {"name": "gpu-pool", "kind": "pool", "deployment": "", "base_url": "http://127.0.0.1:18000/v1",
            "model_id": "pool-chat", "apis": "chat", "enabled": "on", "credential_kind": "none", "api_key": "",
            "credential_env": "", "timeout_seconds": 120, "max_retries": 1, "retry_backoff": 1.5, "priority": 100,
            "weight": 1, "scrape_urls": URLS, "scrape_token": TOKEN, "gpu_count": 2, "price_per_gpu_hour": "1.75",
            "batch_slots": 16}
    data.update(changes)
    return {key: value for key, value in data.items() if value is not None}


def test_it_saves_a_pool_from_the_page_with_its_token_encrypted(client, team_setup):
    client.force_login(team_setup["alice"])
    response = client.post(reverse("channel_create"), pool_form(), follow=True)
    pool = Channel.objects.get(name="gpu-pool")
    assert response.redirect_chain[-1][0] == reverse("channel_detail", args=[pool.pk])
    assert pool.kind == ChannelKind.POOL and pool.get_kind_display() == "vLLM pool"
    assert pool.scrape_url_list() == ["http://127.0.0.1:18001/metrics", "http://127.0.0.1:18002/metrics"]
    assert (pool.gpu_count, str(pool.price_per_gpu_hour.normalize()), pool.batch_slots) == (2, "1.75", 16)
    assert pool.gpu_hourly_price() == 3.5
    assert TOKEN not in pool.scrape_token_ciphertext and crypto.decrypt(pool.scrape_token_ciphertext) == TOKEN
    page = response.content.decode()
    assert "vLLM pool" in page and "http://127.0.0.1:18002/metrics" in page and "••••4242" in page
    for url in (reverse("channel_detail", args=[pool.pk]), reverse("channel_edit", args=[pool.pk]),
                reverse("channels")):
        text = client.get(url).content.decode()
        assert TOKEN not in text and pool.scrape_token_ciphertext not in text
    # An edit with the token field empty keeps it.
    response = client.post(reverse("channel_edit", args=[pool.pk]), pool_form(scrape_token="", gpu_count=4))
    assert response.status_code == 302
    pool.refresh_from_db()
    assert pool.gpu_count == 4 and crypto.decrypt(pool.scrape_token_ciphertext) == TOKEN


@pytest.mark.parametrize("changes, field, words", [
    ({"scrape_urls": ""}, "scrape_urls", "Enter the /metrics URL of each engine"),
    ({"scrape_urls": "ftp://127.0.0.1/metrics"}, "scrape_urls", "starts with http:// or https://"),
    ({"scrape_urls": "http://user:pw@127.0.0.1:18001/metrics"}, "scrape_urls", "not in the URL"),
    ({"scrape_urls": "http://127.0.0.1:18001/metrics\nhttp://127.0.0.1:18001/metrics"}, "scrape_urls",
     "appears twice"),
    ({"scrape_urls": "http://169.254.169.254/metrics"}, "scrape_urls", "the panel does not call this address"),
    ({"scrape_token": "Bearer " + TOKEN}, "scrape_token", "without \"Bearer\""),
    ({"gpu_count": 0}, "gpu_count", "needs the number of GPUs"),
    ({"batch_slots": 0}, "batch_slots", "the sum of its engines' --max-num-seqs"),
    ({"price_per_gpu_hour": "-1"}, "price_per_gpu_hour", "from 0 to"),
])
def test_the_service_refuses_bad_pool_input_and_writes_nothing(team_setup, changes, field, words):
    from django.core.exceptions import ValidationError

    from panel.channels.forms import ChannelForm

    form = ChannelForm(pool_form(**changes), team=team_setup["team_a"])
    if form.is_valid():
        with pytest.raises(ValidationError) as raised:
            channel_create(team=team_setup["team_a"], api_key="", **form.channel_fields())
        errors = raised.value.message_dict
    else:
        errors = form.errors
    assert any(words in message for message in errors[field]), errors
    assert not Channel.objects.exists()


def test_the_page_shows_bad_pool_input_and_writes_nothing(client, team_setup):
    client.force_login(team_setup["alice"])
    response = client.post(reverse("channel_create"), pool_form(scrape_urls="file:///etc/passwd"))
    page = response.content.decode()
    assert response.status_code == 400 and "starts with http:// or https://" in page and TOKEN not in page
    assert not Channel.objects.exists()


def test_a_stored_token_never_follows_the_scrape_urls_to_another_server(team_setup):
    pool = channel_create(team=team_setup["team_a"], name="p", kind=ChannelKind.POOL, base_url="http://127.0.0.1:1/v1",
                          model_id="m", scrape_urls="http://127.0.0.1:18001/metrics", scrape_token=TOKEN,
                          gpu_count=1)
    assert any("No price per GPU-hour" in warning for warning in pool.warnings)
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as raised:
        channel_update(channel=Channel.objects.get(pk=pool.pk), scrape_urls="http://127.0.0.2:18001/metrics")
    assert "enter the token again" in raised.value.message_dict["scrape_token"][0]
    assert Channel.objects.get(pk=pool.pk).scrape_urls == "http://127.0.0.1:18001/metrics"
    # Another path on the same server keeps it; the new server with the token typed again takes it.
    channel_update(channel=Channel.objects.get(pk=pool.pk), scrape_urls="http://127.0.0.1:18001/engine/metrics")
    channel_update(channel=Channel.objects.get(pk=pool.pk), scrape_urls="http://127.0.0.2:18001/metrics",
                   scrape_token="another-token-9999")
    pool.refresh_from_db()
    assert pool.scrape_token_last4 == "9999"
    # A channel that stops being a pool keeps none of it.
    channel_update(channel=pool, kind=ChannelKind.REMOTE, price_input_per_million=0, price_output_per_million=0)
    pool.refresh_from_db()
    assert (pool.scrape_urls, pool.scrape_token_ciphertext, pool.gpu_count, pool.price_per_gpu_hour) == ("", "", 0,
                                                                                                        None)


def test_the_gateway_and_evaluation_runs_read_its_gpu_price(team_setup):
    team = team_setup["team_a"]
    pool = channel_create(team=team, name="gpu-pool", kind=ChannelKind.POOL, base_url="http://127.0.0.1:18000/v1",
                          model_id="pool-chat", credential_kind=CredentialKind.STORED, api_key="pool-key-12345678",
                          scrape_urls="http://127.0.0.1:18001/metrics", gpu_count=2, price_per_gpu_hour="1.75")
    target = target_for(pool)
    assert not target.credential_error and target.api_key == "pool-key-12345678" and not target.loopback_ok
    assert (target.gpu_hourly, target.engine_words) == (3.5, "the vLLM pool gpu-pool")
    assert target.context_tokens is None and target.tool_calling is None  # nothing is known of its engines
    prices = local_hourly_prices(team.pk)
    assert prices == {"gpu-pool": 3.5}
    # An answer of 7.2 s on the pool costs 3.5 / h for 7.2 s: 0.007, its GPU time (the pool's token prices are 0).
    cost, gpu = answer_cost({"channel": "gpu-pool", "cost": "0", "latency_ms": 7200}, prices)
    assert str(gpu) == "0.0070000000" and cost == gpu


def test_the_api_takes_a_pool_with_the_pages_rules_and_never_returns_its_token(client, team_setup):
    from tests.support.api_helpers import call, token_for

    raw = token_for(team_setup["alice"], team_setup["team_a"])
    body = {"name": "gpu-pool", "kind": "pool", "base_url": "http://127.0.0.1:18000/v1", "model_id": "pool-chat",
            "credential_kind": "none", "timeout_seconds": 120, "max_retries": 1, "retry_backoff": 1.5,
            "priority": 100, "weight": 1, "scrape_urls": "http://127.0.0.1:18001/metrics", "scrape_token": TOKEN,
            "gpu_count": 1, "price_per_gpu_hour": "2"}
    bad = call(client, "post", "/channels", raw, {**body, "scrape_urls": "gopher://127.0.0.1/metrics"})
    assert bad.status_code == 400 and "starts with http://" in bad.json()["errors"]["scrape_urls"][0]
    assert not Channel.objects.exists()
    made = call(client, "post", "/channels", raw, body)
    assert made.status_code == 201, made.content
    assert TOKEN not in made.content.decode() and made.json()["kind"] == "pool"
    answer = made.json()
    assert answer["scrape_urls"] == ["http://127.0.0.1:18001/metrics"] and answer["scrape_token"] == "••••" + TOKEN[-4:]
    assert (answer["gpu_count"], answer["price_per_gpu_hour"], answer["batch_slots"]) == (1, "2", None)
    pool = Channel.objects.get()
    assert crypto.decrypt(pool.scrape_token_ciphertext) == TOKEN and pool.gpu_hourly_price() == 2.0
    changed = call(client, "patch", f"/channels/{pool.pk}", raw, {"gpu_count": 4})
    assert changed.status_code == 200, changed.content
    pool.refresh_from_db()
    assert pool.gpu_count == 4 and crypto.decrypt(pool.scrape_token_ciphertext) == TOKEN
    listed = {channel["name"]: channel for channel in call(client, "get", "/channels", raw).json()}
    assert listed["gpu-pool"]["gpu_count"] == 4 and TOKEN not in json.dumps(listed)
