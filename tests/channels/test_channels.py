"""Channels and routes: credentials encrypted at rest (rotation, unknown keys), the base URL and key rules of the
seeds' §5 (nothing saved on error), costs, route ordering per strategy, and local channels kept in step with
deployments."""
import random
from collections import Counter
from decimal import Decimal

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ValidationError
from django.db import connection

from panel.channels.local_channels import local_channel_sync
from panel.channels.models import (
    Channel,
    ChannelKind,
    CredentialError,
    CredentialKind,
    Route,
    RouteChannel,
    RouteStrategy,
    order_channels,
)
from panel.channels.routing import routing_version
from panel.channels.services import channel_create, channel_update, credentials_rotate, route_save
from panel.core import crypto
from panel.env import EnvError
from tests.support.channels import KEY, make_deployment, remote, set_state


def local(team, name="local", **changes):
    fields = dict(name=name, kind=ChannelKind.LOCAL, base_url="http://127.0.0.1:8000/v1", model_id="tiny",
                  credential_kind=CredentialKind.NONE)
    fields.update(changes)
    return channel_create(team=team, **fields)


def raw_column(channel):
    with connection.cursor() as cursor:
        cursor.execute("SELECT credential_ciphertext, credential_last4 FROM channels_channel WHERE id = %s",
                       [channel.pk])
        return cursor.fetchone()


# ------------------------------------------------------------------------------------------------ secrets

def test_it_stores_a_key_encrypted_and_shows_only_its_last_four(team_setup):
    channel = remote(team_setup["team_a"])
    ciphertext, last4 = raw_column(channel)
    assert KEY not in ciphertext and KEY[:10] not in ciphertext
    assert last4 == "WXYZ" and channel.credential_display == "••••WXYZ"
    assert Channel.objects.get(pk=channel.pk).api_key() == KEY
    assert channel.misconfigured == ""


def test_it_rotates_to_a_new_key_and_keeps_old_tokens_readable(team_setup, monkeypatch):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    monkeypatch.setenv("TOKENWISE_ENCRYPTION_KEYS", old)
    channel = remote(team_setup["team_a"])
    before = raw_column(channel)[0]
    monkeypatch.setenv("TOKENWISE_ENCRYPTION_KEYS", f"{new},{old}")
    assert Channel.objects.get(pk=channel.pk).api_key() == KEY  # the old key still decrypts
    assert credentials_rotate() == (1, [])
    after = raw_column(channel)[0]
    assert after != before
    monkeypatch.setenv("TOKENWISE_ENCRYPTION_KEYS", new)  # the old key retired
    assert Channel.objects.get(pk=channel.pk).api_key() == KEY
    assert crypto.rotate(after) != after and crypto.decrypt(crypto.rotate(after)) == KEY


def test_a_key_from_an_unknown_encryption_key_is_an_error_never_the_ciphertext(team_setup, monkeypatch):
    channel = remote(team_setup["team_a"])
    ciphertext = raw_column(channel)[0]
    monkeypatch.setenv("TOKENWISE_ENCRYPTION_KEYS", Fernet.generate_key().decode())
    channel = Channel.objects.get(pk=channel.pk)
    with pytest.raises(CredentialError) as caught:
        channel.api_key()
    assert "cannot be decrypted" in str(caught.value) and ciphertext not in str(caught.value)
    assert "cannot be decrypted" in channel.credential_problem()
    rotated, problems = credentials_rotate()
    assert rotated == 0 and len(problems) == 1
    assert "cannot be decrypted" in Channel.objects.get(pk=channel.pk).misconfigured
    assert raw_column(channel)[0] == ciphertext  # left as it was


def test_a_damaged_token_is_a_credential_error(team_setup):
    channel = remote(team_setup["team_a"])
    Channel.objects.filter(pk=channel.pk).update(credential_ciphertext="gAAAAAB-not-a-token")
    with pytest.raises(CredentialError):
        Channel.objects.get(pk=channel.pk).api_key()


@pytest.mark.parametrize("value, words", [
    (None, "TOKENWISE_ENCRYPTION_KEYS is not set"),
    ("", "TOKENWISE_ENCRYPTION_KEYS is not set"),
    ("not-a-fernet-key", "key 1 of 1 is not a Fernet key"),
    ("uoCEune358PVvLlqWgU70DAPPWRL6mXgdqx-IrL8uVg=,short", "key 2 of 2 is not a Fernet key"),
])
def test_missing_or_malformed_encryption_keys_fail_loudly_by_name(monkeypatch, value, words):
    if value is None:
        monkeypatch.delenv("TOKENWISE_ENCRYPTION_KEYS")
    else:
        monkeypatch.setenv("TOKENWISE_ENCRYPTION_KEYS", value)
    with pytest.raises(EnvError) as caught:
        crypto.encrypt("x")
    assert words in str(caught.value)
    assert "short" not in str(caught.value) and "not-a-fernet-key" not in str(caught.value)  # never echoes a key
    assert crypto.encryption_problem() == str(caught.value)


def test_without_encryption_keys_a_stored_key_is_refused_and_a_stored_one_is_misconfigured(team_setup,
                                                                                            monkeypatch):
    channel = remote(team_setup["team_a"])
    monkeypatch.delenv("TOKENWISE_ENCRYPTION_KEYS")
    with pytest.raises(CredentialError, match="TOKENWISE_ENCRYPTION_KEYS is not set"):
        Channel.objects.get(pk=channel.pk).api_key()
    with pytest.raises(ValidationError) as caught:
        remote(team_setup["team_a"], name="other")
    assert "TOKENWISE_ENCRYPTION_KEYS" in caught.value.message_dict["api_key"][0]
    assert not Channel.objects.filter(name="other").exists()


def test_env_and_none_credentials(team_setup, monkeypatch):
    monkeypatch.delenv("TAOTOKEN_API_KEY", raising=False)
    channel = remote(team_setup["team_a"], credential_kind=CredentialKind.ENV, credential_env="TAOTOKEN_API_KEY",
                     api_key="")
    assert channel.credential_display == "${TAOTOKEN_API_KEY}"
    assert any("TAOTOKEN_API_KEY is not set" in warning for warning in channel.warnings)
    assert "TAOTOKEN_API_KEY is not set" in channel.misconfigured
    with pytest.raises(CredentialError, match="TAOTOKEN_API_KEY is not set"):
        channel.api_key()
    monkeypatch.setenv("TAOTOKEN_API_KEY", " sk-from-env-1234\n")
    assert channel.api_key() == "sk-from-env-1234"
    monkeypatch.setenv("TAOTOKEN_API_KEY", "Bearer sk-from-env-1234")
    with pytest.raises(CredentialError, match="starts with \"Bearer\""):
        channel.api_key()
    assert local(team_setup["team_a"]).api_key() == "EMPTY"
    assert raw_column(channel) == ("", "")


# ------------------------------------------------------------------------------------------------ validation

@pytest.mark.parametrize("url, field_error", [
    ("ftp://example.com/v1", "must start with http:// or https://"),
    ("127.0.0.1:8000/v1", "must start with http:// or https://"),
    ("http:///v1", "has no host"),
    ("http://127.0.0.1:8000/v1/v1", "/v1/v1"),
    ("https://taotoken.net/api/v1/v1/", "Remove one: https://taotoken.net/api/v1"),
    ("http://127.0.0.1:8000/v1/chat/completions", "client appends /chat/completions itself; use http://127.0.0.1:8000/v1"),
    ("http://127.0.0.1:99999/v1", "port"),
    ("https://user:sk-secret@taotoken.net/api/v1", "not in the URL"),
    ("http://127.0.0.1:8000/v1?x=1", "query string"),
    ("", "Enter the server's base URL"),
])
def test_it_refuses_bad_base_urls_and_saves_nothing(team_setup, url, field_error):
    with pytest.raises(ValidationError) as caught:
        remote(team_setup["team_a"], base_url=url)
    assert any(field_error in message for message in caught.value.message_dict["base_url"])
    assert Channel.objects.count() == 0


def test_a_base_url_without_v1_is_saved_with_a_warning(team_setup):
    channel = remote(team_setup["team_a"], base_url="https://taotoken.net/api/")
    assert channel.base_url == "https://taotoken.net/api"  # trailing slash dropped
    assert any("has no /v1" in warning and "https://taotoken.net/api/v1" in warning for warning in channel.warnings)
    assert not any("/v1" in warning for warning in remote(team_setup["team_a"], name="ok").warnings)


@pytest.mark.parametrize("key, words", [
    ("Bearer sk-abcdefghijkl", "without \"Bearer\""),
    ("bearersk-abcdefghijkl", "without \"Bearer\""),
    ("EMPTY", "choose the credential None"),
    ("${TAOTOKEN_API_KEY}", "choose \"Environment variable\""),
    ("sk-abc def-ghijkl", "without spaces"),
    ("sk-1", "too short"),
])
def test_it_refuses_bad_keys_and_saves_nothing(team_setup, key, words):
    with pytest.raises(ValidationError) as caught:
        remote(team_setup["team_a"], api_key=key)
    assert words in caught.value.message_dict["api_key"][0]
    assert Channel.objects.count() == 0


def test_other_rules(team_setup):
    team = team_setup["team_a"]
    remote(team)
    cases = [
        (dict(name="taotoken"), "name", "already has a channel"),
        (dict(name="bad name"), "name", "letters, digits"),
        (dict(model_id="has space"), "model_id", "no spaces"),
        (dict(timeout_seconds=0), "timeout_seconds", "0.1 to 3600"),
        (dict(max_retries=11), "max_retries", "0 to 10"),
        (dict(retry_backoff=float("nan")), "retry_backoff", "0 to 60"),
        (dict(price_input_per_million=Decimal("-1")), "price_input_per_million", "0 to"),
        (dict(credential_kind=CredentialKind.ENV, credential_env="1BAD"), "credential_env", "letters, digits"),
        (dict(api_key=""), "api_key", "Enter the key"),
    ]
    for changes, field, words in cases:
        changes.setdefault("name", "second")
        with pytest.raises(ValidationError) as caught:
            remote(team, **changes)
        assert words in " ".join(caught.value.message_dict[field]), (changes, caught.value.message_dict)
    assert Channel.objects.count() == 1
    # The same name in another team is fine.
    assert remote(team_setup["team_b"]).team == team_setup["team_b"]


def test_an_update_with_an_empty_key_keeps_the_stored_one(team_setup):
    channel = remote(team_setup["team_a"])
    ciphertext = raw_column(channel)[0]
    channel_update(channel=channel, api_key="", model_id="qwen2.5-14b-instruct")
    assert raw_column(channel)[0] == ciphertext
    channel_update(channel=Channel.objects.get(pk=channel.pk), api_key="sk-replaced-key-9876")
    assert Channel.objects.get(pk=channel.pk).api_key() == "sk-replaced-key-9876"
    assert raw_column(channel)[1] == "9876"
    with pytest.raises(ValidationError):
        channel_update(channel=Channel.objects.get(pk=channel.pk), api_key="Bearer sk-replaced-key-9876",
                       model_id="changed")
    assert Channel.objects.get(pk=channel.pk).model_id == "qwen2.5-14b-instruct"  # nothing saved
    channel_update(channel=Channel.objects.get(pk=channel.pk), credential_kind=CredentialKind.NONE)
    assert raw_column(channel) == ("", "")  # switching away from stored forgets the key


def test_a_deployment_of_another_team_cannot_be_linked(team_setup):
    deployment = make_deployment(team_setup["team_b"], team_setup["bob"], "tiny-b")
    with pytest.raises(ValidationError) as caught:
        local(team_setup["team_a"], deployment=deployment)
    assert "another team" in caught.value.message_dict["deployment"][0]


# ------------------------------------------------------------------------------------------------ cost

def test_cost_bills_cached_tokens_at_the_cached_price(team_setup):
    channel = remote(team_setup["team_a"], price_input_per_million=Decimal("2"),
                     price_output_per_million=Decimal("8"), price_cached_per_million=Decimal("0.5"))
    # 1,000 prompt tokens of which 600 cached, 200 completion tokens.
    expected = (Decimal(400) * 2 + Decimal(600) * Decimal("0.5") + Decimal(200) * 8) / Decimal(1_000_000)
    assert channel.cost(1000, 200, 600) == expected == Decimal("0.0027")
    assert channel.cost(1000, 200) == Decimal("0.0036")
    assert channel.cost(100, 0, 500) == Decimal(100) * Decimal("0.5") / Decimal(1_000_000)  # cached capped at prompt
    assert local(team_setup["team_a"]).cost(10**6, 10**6, 0) == 0
    assert any("cached price" in warning for warning in remote(
        team_setup["team_a"], name="nodiscount", price_input_per_million=Decimal("2")).warnings)


# ------------------------------------------------------------------------------------------------ routes

@pytest.fixture
def three(team_setup):
    team = team_setup["team_a"]
    cloud = remote(team, name="cloud")
    backup = remote(team, name="backup", base_url="https://backup.example.com/v1")
    box = local(team, name="box")
    return team, cloud, backup, box


def test_local_first_puts_local_channels_first_then_the_rest_by_position(three):
    team, cloud, backup, box = three
    route = route_save(team=team, model_name="qwen", strategy=RouteStrategy.LOCAL_FIRST,
                       entries=[(cloud, 0, 1), (backup, 1, 1), (box, 2, 1)])
    assert route.ordered_channels() == [box, cloud, backup]
    Channel.objects.filter(pk=box.pk).update(enabled=False)
    assert route.ordered_channels() == [cloud, backup]


def test_priority_orders_by_position(three):
    team, cloud, backup, box = three
    route = route_save(team=team, model_name="qwen", strategy=RouteStrategy.PRIORITY,
                       entries=[(backup, 5, 1), (cloud, 7, 1), (box, 9, 1)])
    assert route.ordered_channels() == [backup, cloud, box]


def test_weighted_picks_the_first_by_weight_and_keeps_the_rest_as_fallbacks(three):
    team, cloud, backup, box = three
    route = route_save(team=team, model_name="qwen", strategy=RouteStrategy.WEIGHTED,
                       entries=[(cloud, 0, 3), (backup, 1, 1), (box, 2, 0)])
    rng = random.Random(7)
    assert sorted(channel.name for channel in route.ordered_channels(rng=rng)) == ["backup", "box", "cloud"]
    entries = route.entries()  # the same ordering the gateway applies to its cached entries
    firsts = Counter()
    for _ in range(4000):
        order = order_channels(route.strategy, entries, rng=rng)
        assert sorted(channel.pk for channel in order) == sorted([cloud.pk, backup.pk, box.pk])
        rest = order[1:]
        assert rest == sorted(rest, key=lambda channel: [cloud.pk, backup.pk, box.pk].index(channel.pk))
        firsts[order[0].name] += 1
    assert firsts["box"] == 0  # weight 0 is never first
    assert 0.70 < firsts["cloud"] / 4000 < 0.80  # 3 : 1


def test_order_channels_works_on_plain_entries_without_queries(three, django_assert_num_queries):
    team, cloud, backup, box = three
    entries = [RouteChannel(channel=cloud, position=1, weight=1), RouteChannel(channel=box, position=2, weight=1)]
    with django_assert_num_queries(0):
        assert order_channels(RouteStrategy.LOCAL_FIRST, entries) == [box, cloud]
        assert order_channels(RouteStrategy.PRIORITY, entries) == [cloud, box]


def test_route_rules_save_nothing_on_error(three, team_setup):
    team, cloud, backup, box = three
    other = remote(team_setup["team_b"], name="theirs")
    route_save(team=team, model_name="qwen", entries=[(cloud, 0, 1)])
    cases = [
        (dict(model_name="qwen", entries=[(cloud, 0, 1)]), "model_name", "already has a route"),
        (dict(model_name="has space", entries=[(cloud, 0, 1)]), "model_name", "no spaces"),
        (dict(model_name="x", entries=[]), "channels", "at least one"),
        (dict(model_name="x", entries=[(other, 0, 1)]), "channels", "another team"),
        (dict(model_name="x", entries=[(cloud, 0, 1), (cloud, 1, 1)]), "channels", "twice"),
        (dict(model_name="x", strategy=RouteStrategy.WEIGHTED, entries=[(cloud, 0, 0)]), "channels", "weight above 0"),
        (dict(model_name="x", strategy="random", entries=[(cloud, 0, 1)]), "strategy", "local_first"),
    ]
    for kwargs, field, words in cases:
        with pytest.raises(ValidationError) as caught:
            route_save(team=team, **kwargs)
        assert words in " ".join(caught.value.message_dict[field])
    assert list(Route.objects.values_list("model_name", flat=True)) == ["qwen"]
    assert RouteChannel.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_changes_bump_the_routing_version_after_commit(team_setup):
    team = team_setup["team_a"]
    before = routing_version(team.pk)
    channel = local(team)
    assert routing_version(team.pk) == before + 1
    route_save(team=team, model_name="tiny", entries=[(channel, 0, 1)])
    assert routing_version(team.pk) == before + 2
    assert routing_version(team_setup["team_b"].pk) == 0


# ------------------------------------------------------------------------------------------------ local channels


def test_local_channel_sync_creates_reenables_and_disables_idempotently(team_setup):
    team, alice = team_setup["team_a"], team_setup["alice"]
    deployment = make_deployment(team, alice, "tiny-latency")
    assert local_channel_sync(deployment) is None and Channel.objects.count() == 0  # pending: nothing to do
    set_state(deployment, "ready")
    channel = local_channel_sync(deployment)
    for _ in range(2):
        assert local_channel_sync(deployment) == channel
    channel.refresh_from_db()
    assert (channel.name, channel.kind, channel.credential_kind, channel.enabled) == (
        "local-tiny-latency", ChannelKind.LOCAL, CredentialKind.NONE, True)
    assert (channel.base_url, channel.model_id, channel.deployment) == ("http://127.0.0.1:8123/v1", "tiny-served",
                                                                        deployment)
    route = Route.objects.get(team=team)
    assert (route.model_name, route.strategy) == ("tiny-served", RouteStrategy.LOCAL_FIRST)
    assert list(route.channels.all()) == [channel] and RouteChannel.objects.count() == 1

    for state in ("stopping", "stopped"):
        set_state(deployment, state)
        local_channel_sync(deployment)
        assert Channel.objects.get(pk=channel.pk).enabled is False
    # A new deployment of the same profile takes the channel over, on another port.
    second = make_deployment(team, alice, "tiny-latency", state="ready", port=8124)
    assert local_channel_sync(second).pk == channel.pk
    channel.refresh_from_db()
    assert channel.enabled and channel.base_url.endswith(":8124/v1") and channel.deployment == second
    set_state(deployment, "failed")  # the old one failing later does not touch the channel
    local_channel_sync(deployment)
    assert Channel.objects.get(pk=channel.pk).enabled is True
    set_state(second, "failed")
    local_channel_sync(second)
    assert Channel.objects.get(pk=channel.pk).enabled is False
    assert Channel.objects.count() == 1 and Route.objects.count() == 1 and RouteChannel.objects.count() == 1


def test_local_channel_sync_joins_an_existing_route_and_avoids_a_taken_name(team_setup):
    team, alice = team_setup["team_a"], team_setup["alice"]
    cloud = remote(team, name="local-tiny-latency")  # someone named a cloud channel like that
    route = route_save(team=team, model_name="tiny-served", strategy=RouteStrategy.PRIORITY, entries=[(cloud, 0, 1)])
    deployment = make_deployment(team, alice, "tiny-latency", state="ready", attach_to_route=True)  # an admin's choice
    channel = local_channel_sync(deployment)
    assert channel.name == f"local-tiny-latency-{deployment.pk}" and channel.kind == ChannelKind.LOCAL
    assert [entry.channel for entry in route.entries()] == [cloud, channel]
    assert Route.objects.get(pk=route.pk).strategy == RouteStrategy.PRIORITY  # the team's choice is kept


def test_the_serving_code_keeps_the_local_channel_in_step(team_setup):
    from panel.jobs.services import jobs_reap
    from panel.serving.services import DeploymentHooks, deployment_stop

    team, alice = team_setup["team_a"], team_setup["alice"]
    deployment = make_deployment(team, alice, "tiny-latency", state="starting")
    DeploymentHooks(deployment).ready({"problems": []})
    channel = Channel.objects.get(team=team)
    assert channel.enabled and channel.deployment_id == deployment.pk
    assert deployment_stop(deployment=deployment, user=alice)
    assert Channel.objects.get(pk=channel.pk).enabled is False
    second = make_deployment(team, alice, "tiny-latency", state="starting", port=8200)
    DeploymentHooks(second).ready({"problems": []})
    assert Channel.objects.get(pk=channel.pk).enabled is True
    from datetime import timedelta

    from django.utils import timezone

    set_state(second, "ready", heartbeat_at=timezone.now() - timedelta(hours=1))
    assert [d.pk for d in jobs_reap(stale_after_seconds=60)] == [second.pk]
    assert Channel.objects.get(pk=channel.pk).enabled is False
    # A worker that restarts fails what its previous process left live, and the channel goes with it.
    from panel.jobs.sweep import sweep

    third = make_deployment(team, alice, "tiny-latency", state="starting", port=8201)
    DeploymentHooks(third).ready({"problems": []})
    set_state(third, "ready", worker="gpu@node-1")
    assert Channel.objects.get(pk=channel.pk).enabled is True
    sweep("gpu@node-1")
    third.refresh_from_db()
    assert third.state == "failed" and Channel.objects.get(pk=channel.pk).enabled is False
    # A channel an earlier sync failed to disable goes when someone presses Stop on the ended deployment.
    Channel.objects.filter(pk=channel.pk).update(enabled=True)
    assert deployment_stop(deployment=third, user=alice) is False
    assert Channel.objects.get(pk=channel.pk).enabled is False


@pytest.mark.django_db(transaction=True)
def test_a_deployment_and_its_local_channel_move_in_one_transaction(team_setup, monkeypatch):
    """A reader never sees a ready deployment without its channel (CI once did, between two commits)."""
    from panel.serving import models, services

    team, alice = team_setup["team_a"], team_setup["alice"]
    seen, real_sync = [], models.local_channel_sync

    def sync_inside_the_move(deployment):
        state = models.Deployment.objects.get(pk=deployment.pk).state
        seen.append((state, connection.in_atomic_block))
        return real_sync(deployment)

    monkeypatch.setattr(models, "local_channel_sync", sync_inside_the_move)
    deployment = make_deployment(team, alice, "tiny-latency", state="starting")
    services.DeploymentHooks(deployment).ready({"problems": []})
    services.deployment_stop(deployment=deployment, user=alice)
    assert seen == [("ready", True), ("stopping", True)]
    assert connection.in_atomic_block is False and Channel.objects.get(team=team).enabled is False


def test_local_channel_sync_never_raises(team_setup, caplog):
    class Gone:
        pk = 10**9

    assert local_channel_sync(Gone()) is None
    assert local_channel_sync(object()) is None
    assert "local channel sync failed" in caplog.text
