"""Attack tests for the security review's low findings (issue 26, item 7): a token count that ignored the key's
limits and budgets, a key cache that unknown keys flushed, client user ids stored as sent, a symlink alias of
another team's model folder, /metrics open behind a same-host proxy, metric labels from refused model names, data
files readable by every local user, and the launcher's Redis without a password."""
import asyncio
import json
import os
import pathlib
import pickle
import secrets
import signal
import socket
import subprocess
import sys

import httpx
import psutil
import pytest
import redis

from panel.accounts.keys import key_issue
from panel.budgets.counters import counter_keys, month_of
from panel.budgets.models import Budget
from tests.support.environment import REDIS_URL, ROOT
from tests.support.fake_messages_upstream import FakeMessagesUpstream
from tests.support.gateway import channel, route_to
from tests.support.messages_gateway import gateway  # noqa: F401 (fixture)
from tests.support.safetensors import write_safetensors
from tests.support.waiting import run_coroutine

COUNT = {"model": "claude", "messages": [{"role": "user", "content": "Review the change in src/app.py please"}]}


@pytest.fixture
def counting_route(team_setup):
    with FakeMessagesUpstream(models=("claude-fake",), api_key="sk-ant-0000", apis="messages") as fake:
        team = team_setup["team_a"]
        route_to(team, "claude", channel(team, "claude", fake, "claude-fake", key="sk-ant-0000", apis="messages"))
        yield fake


def count_tokens(gateway, raw):
    return httpx.post(f"{gateway.url}/v1/messages/count_tokens", json=COUNT, timeout=10,
                      headers={"x-api-key": raw, "anthropic-version": "2023-06-01"})


def test_count_tokens_keeps_to_the_keys_rate_limit(gateway, team_setup, counting_route):
    _, raw = key_issue(team=team_setup["team_a"], user=team_setup["alice"], name="agent", rpm_limit=2)
    assert [count_tokens(gateway, raw).status_code for _ in range(2)] == [200, 200]
    refused = count_tokens(gateway, raw)
    assert refused.status_code == 429 and "requests per minute" in refused.text
    assert int(refused.headers["retry-after"]) >= 1
    assert len(counting_route.requests) == 2  # the third never reached the provider


def test_count_tokens_is_refused_when_a_budget_is_spent_and_costs_nothing(gateway, team_setup, counting_route):
    team = team_setup["team_a"]
    key, raw = key_issue(team=team, user=team_setup["alice"], name="agent")
    Budget.objects.create(team=team, tokens_per_month=100)
    tokens = counter_keys(month_of(), "team", team.id)[1]
    store = redis.Redis.from_url(REDIS_URL)
    store.set(tokens, 99)
    answer = count_tokens(gateway, raw)
    assert answer.status_code == 200 and answer.json()["input_tokens"] > 0
    assert int(store.get(tokens)) == 99  # a count is not charged
    store.set(tokens, 100)
    refused = count_tokens(gateway, raw)
    assert refused.status_code == 402 and "budget" in refused.json()["error"]["message"]
    Budget.objects.all().delete()
    Budget.objects.create(team=team, key=key, tokens_per_month=5)
    store.set(counter_keys(month_of(), "key", key.id)[1], 5)
    assert count_tokens(gateway, raw).status_code == 402
    assert len(counting_route.requests) == 1


@pytest.mark.django_db(transaction=True)
def test_a_flood_of_unknown_keys_does_not_evict_a_known_key_from_the_gateway_cache(team_setup, settings, monkeypatch):
    from panel.accounts.models import TeamKey
    from panel.gateway import keys

    settings.KEY_CACHE_SECONDS = 600
    monkeypatch.setattr(keys, "CACHE", keys.KeyCache())
    key, raw = key_issue(team=team_setup["team_a"], user=team_setup["alice"], name="agent")
    assert run_coroutine(keys.key_lookup(raw)).id == key.id
    for _ in range(60_000):  # what key_lookup does with each random key an attacker sends
        keys.CACHE.put(secrets.token_hex(32), None)
    # The row no longer matches: only the cache can still answer for the key.
    TeamKey.objects.filter(id=key.id).update(key_hash="0" * 64)
    served = run_coroutine(keys.key_lookup(raw))
    assert served is not None and served.id == key.id
    assert len(keys.CACHE.unknown) <= keys.UNKNOWN_KEYS_CACHED


USER_ID = "user_5f2c_account_ada@example.com_session_81e4"


def admit_as(key, user_id, text="review main.py"):
    from panel.core import redis_client
    from panel.gateway import admission

    async def one():
        redis_client._client = None  # a client of this call's own event loop
        answer = await admission.admit(key, headers=[], body={
            "model": "claude", "max_tokens": 10, "metadata": {"user_id": user_id},
            "messages": [{"role": "user", "content": text}]})
        # A key without limits or budgets looks its session up once the first byte is on its way.
        if answer.session_lookup is None:
            return answer.session
        return await admission.session_fields(asyncio.ensure_future(answer.session_lookup()))
    return run_coroutine(one())


@pytest.mark.django_db(transaction=True)
def test_metadata_user_id_is_stored_as_a_keyed_hash_grouping_the_same_sessions(team_setup, monkeypatch):
    from panel.core import redis_client
    from panel.gateway.keys import KeyInfo

    monkeypatch.setattr(redis_client, "_client", None)
    issued, _ = key_issue(team=team_setup["team_a"], user=team_setup["alice"], name="agent")
    key = KeyInfo(id=issued.id, team_id=issued.team_id, allowed_models=(), rpm_limit=None, tpm_limit=None,
                  expires_at=None, revoked=False)
    first, second = admit_as(key, USER_ID), admit_as(key, USER_ID, "and now the tests")
    other = admit_as(key, USER_ID.replace("ada", "bob"))
    stored = first["session_id"]
    assert "example.com" not in stored and "account" not in stored and "user_" not in stored
    assert second["session_id"] == stored and (first["session_turn"], second["session_turn"]) == (1, 2)
    assert other["session_id"] != stored and other["session_turn"] == 1
    held = b" ".join(key + b" " + (redis.Redis.from_url(REDIS_URL).get(key) or b"")
                     for key in redis.Redis.from_url(REDIS_URL).keys("*"))
    assert b"example.com" not in held and b"account" not in held


def test_the_migration_hashes_client_named_session_ids_on_old_rows(team_setup):
    import importlib

    from django.apps import apps

    from panel.gateway.sessions import user_session_id
    from panel.usage.models import RequestLog

    migration = importlib.import_module("panel.usage.migrations.0006_session_ids_hashed")
    for session_id in (USER_ID, USER_ID, "p-0123456789abcdef", ""):
        RequestLog.objects.create(team=team_setup["team_a"], endpoint="messages", model="claude", status_code=200,
                                  outcome="ok", latency_ms=5, session_id=session_id)
    migration.hash_client_named_ids(apps, None)
    stored = list(RequestLog.objects.order_by("id").values_list("session_id", flat=True))
    assert stored == [user_session_id(USER_ID)] * 2 + ["p-0123456789abcdef", ""]


def test_a_symlink_alias_of_another_teams_model_folder_is_refused(team_setup, settings, tmp_path):
    from django.core.exceptions import ValidationError

    from panel.registry.models import RegisteredModel
    from panel.registry.services import model_register

    settings.MODEL_ROOTS = [str(tmp_path)]
    folder = tmp_path / "b-real"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4,
        "num_hidden_layers": 1, "max_position_embeddings": 512, "torch_dtype": "float16"}))
    write_safetensors(folder / "model.safetensors", {"model.layers.0.mlp.up_proj.weight": ("F16", [64, 64])})
    (tmp_path / "b-link").symlink_to(tmp_path / "b-real")
    (tmp_path / "a-alias").symlink_to(tmp_path / "b-link")  # a chain of links to team B's folder
    model_register(team=team_setup["team_b"], user=None, source=str(tmp_path / "b-link"), name="b-model")
    for alias in ("b-real", "a-alias", "b-real/../b-link"):
        with pytest.raises(ValidationError) as caught:
            model_register(team=team_setup["team_a"], user=None, source=str(tmp_path / alias), name=alias)
        assert caught.value.messages[0] == f"{tmp_path / alias} does not exist"  # the words of a missing folder
    assert not RegisteredModel.objects.filter(team=team_setup["team_a"]).exists()
    assert model_register(team=team_setup["team_b"], user=None, source=str(tmp_path / "b-real"), name="again").pk


def test_metrics_need_the_token_on_a_loopback_bind_behind_a_same_host_proxy(client, settings):
    settings.METRICS_TOKEN, settings.PANEL_BIND, settings.METRICS_PUBLIC = "", "127.0.0.1", False
    # A proxy on the same host makes every outside request arrive from loopback.
    refused = client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.9")
    assert refused.status_code == 403 and "TOKENWISE_METRICS_TOKEN" in refused.content.decode()
    assert "tokenwise_gateway" not in refused.content.decode()
    settings.METRICS_TOKEN = "s3cret-token"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-token").status_code == 200
    settings.METRICS_TOKEN, settings.METRICS_PUBLIC = "", True  # the operator's explicit choice
    assert client.get("/metrics").status_code == 200


def test_refused_model_names_do_not_become_metric_labels(gateway, team_setup):
    _, raw = key_issue(team=team_setup["team_a"], user=team_setup["alice"], name="agent", allowed_models=("chat",))
    for index in range(5):
        answer = httpx.post(f"{gateway.url}/v1/chat/completions", timeout=10,
                            headers={"authorization": f"Bearer {raw}"},
                            json={"model": f"flood-{index}", "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 403 and answer.json()["error"]["code"] == "model_not_allowed"
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    assert "flood" not in metrics
    assert 'tokenwise_gateway_requests_total{endpoint="chat",model="(refused)",outcome="error"} 5.0' in metrics


def modes(root, *names):
    return {name: oct((root / name).stat().st_mode & 0o777) for name in names}


def test_make_run_keeps_the_data_dir_to_its_own_user(tmp_path):
    from tests.support.launcher import launcher_env, run_launcher

    with socket.socket() as taken:  # the launcher stops at the web port, after preparing the data dir
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = launcher_env(tmp_path, TOKENWISE_PORT=str(taken.getsockname()[1]))
        assert run_launcher(env).returncode != 0  # a fresh install
        data = tmp_path / "data"
        assert modes(data, ".", "secrets", "secrets/secret_key", "logs", "models", "jobs") == {
            ".": "0o700", "secrets": "0o700", "secrets/secret_key": "0o600", "logs": "0o700", "models": "0o700",
            "jobs": "0o700"}
        # An install from before: readable by every local user.
        for name in ("logs/web.log", "tokenwise.sqlite3", "tokenwise.sqlite3-wal"):
            (data / name).write_text("x")
            (data / name).chmod(0o644)
        for name in (".", "logs", "secrets"):
            (data / name).chmod(0o755)
        (data / "secrets" / "secret_key").chmod(0o644)
        assert run_launcher(env).returncode != 0
        assert set(modes(data, ".", "logs", "secrets").values()) == {"0o700"}
        assert set(modes(data, "logs/web.log", "tokenwise.sqlite3", "tokenwise.sqlite3-wal",
                         "secrets/secret_key").values()) == {"0o600"}


class Planted:
    """What a local user could write into the cache's Redis: a pickle that runs code when it is read."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (pathlib.Path.touch, (self.path,))


def test_the_django_cache_never_unpickles_what_redis_holds(tmp_path):
    from django.core.cache import cache

    ran = pathlib.Path(tmp_path / "code-ran")
    redis.Redis.from_url(REDIS_URL).set(cache.make_and_validate_key("signin:planted"), pickle.dumps(Planted(ran)))
    with pytest.raises(ValueError):
        cache.get("signin:planted")
    assert not ran.exists()
    cache.set("plain", {"count": 3, "names": ["a", "b"]})
    cache.add("counter", 1)
    cache.incr("counter")
    assert cache.get("plain") == {"count": 3, "names": ["a", "b"]} and cache.get("counter") == 2


def test_the_launchers_redis_needs_its_generated_password(tmp_path):
    from panel.launcher import start_redis
    from tests.support.launcher import free_port, launcher_env

    port = free_port()
    env = launcher_env(tmp_path, TOKENWISE_REDIS_PORT=str(port))
    script = ("from panel.launcher import prepare_environment; import os; prepare_environment(); "
              "print(os.environ['REDIS_URL'])")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=60)
    url = done.stdout.split()[-1]
    stored = tmp_path / "data" / "secrets" / "redis_password"
    password = stored.read_text().strip()
    assert len(password) >= 32 and oct(stored.stat().st_mode & 0o777) == "0o600"
    assert url == f"redis://:{password}@127.0.0.1:{port}/0"
    process = start_redis(port=port, data_dir=tmp_path / "redis", password=password)
    try:
        assert password not in " ".join(psutil.Process(process.pid).cmdline())  # not in `ps` for local users
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=port).ping()
        assert redis.Redis.from_url(url).ping()
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
