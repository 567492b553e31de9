"""The seeds' settings.json in both formats: import (validated fully, all or nothing, errors with their JSON path),
export (never a stored secret) and the round trip; hostile input and hypothesis fuzzing of the importers."""
import json

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from panel.channels import settings_json
from panel.channels.models import Channel, ChannelKind, CredentialKind, Route, RouteChannel, RouteStrategy
from panel.channels.services import channel_create, channel_update, route_save
from panel.channels.settings_export import export_a, export_b
from panel.channels.settings_json import parse, settings_import
from tests.support.credential_env import bind_credential_env
from tests.support.environment import FIXTURES

SEED_A = (FIXTURES / "seed_settings_a.json").read_text()
SEED_B = (FIXTURES / "seed_settings_b.json").read_text()


def counts():
    return Channel.objects.count(), Route.objects.count(), RouteChannel.objects.count()


def problems_of(text, **kwargs):
    with pytest.raises(ValidationError) as caught:
        if kwargs:
            settings_import(text=text, **kwargs)
        else:
            parse(text)
    return caught.value.messages


# ------------------------------------------------------------------------------------------------ the seeds' files

def test_it_imports_the_seeds_format_a(team_setup, monkeypatch):
    team = team_setup["team_a"]
    monkeypatch.setenv("TAOTOKEN_API_KEY", "sk-from-the-environment")
    result = settings_import(team=team, user=team_setup["alice"], text=SEED_A)
    assert result.format == "A" and result.warnings == []
    local, cloud = result.channels
    assert (local.name, local.kind, local.base_url, local.credential_kind, local.model_id) == (
        "local_vllm", ChannelKind.LOCAL, "http://127.0.0.1:8000/v1", CredentialKind.NONE, "qwen2.5-14b-instruct")
    assert (cloud.name, cloud.kind, cloud.base_url, cloud.credential_kind, cloud.credential_env) == (
        "taotoken", ChannelKind.REMOTE, "https://taotoken.net/api/v1", CredentialKind.ENV, "TAOTOKEN_API_KEY")
    for channel in (local, cloud):
        assert (channel.timeout_seconds, channel.max_retries, channel.retry_backoff) == (120, 3, 1.5)
        # the file's one timeout is the total; a hang is cut by the first-byte budget, so it falls back in seconds
        assert (channel.connect_timeout_seconds, channel.first_byte_timeout_seconds,
                channel.idle_timeout_seconds) == (5, 10, 15)
    route = Route.objects.get(team=team)
    assert (route.model_name, route.strategy, route.fallback_on_error) == (
        "qwen2.5-14b-instruct", RouteStrategy.LOCAL_FIRST, True)
    assert route.ordered_channels() == [local, cloud]


def test_it_imports_the_seeds_format_b_with_a_warning_for_the_missing_v1(team_setup, monkeypatch):
    team = team_setup["team_a"]
    monkeypatch.setenv("TAOTOKEN_API_KEY", "sk-from-the-environment")
    result = settings_import(team=team, text=SEED_B)
    assert result.format == "B"
    assert result.warnings == [w for w in result.warnings if w.startswith("$.channels.taotoken_cloud.base_url: ")]
    assert len(result.warnings) == 1 and "https://taotoken.net/api/v1" in result.warnings[0]
    local, cloud = result.channels
    assert (local.name, local.kind, local.credential_kind, local.model_id) == (
        "local_awq", ChannelKind.LOCAL, CredentialKind.NONE, "Qwen/Qwen2.5-7B-Instruct-AWQ")
    assert (cloud.name, cloud.kind, cloud.credential_kind, cloud.credential_env, cloud.model_id) == (
        "taotoken_cloud", ChannelKind.REMOTE, CredentialKind.ENV, "TAOTOKEN_API_KEY", "qwen2.5-7b-instruct")
    assert cloud.api_key() == "sk-from-the-environment"
    route = Route.objects.get(team=team)
    assert (route.model_name, route.strategy) == ("Qwen/Qwen2.5-7B-Instruct-AWQ", RouteStrategy.PRIORITY)
    assert route.ordered_channels() == [local, cloud]


def test_an_import_says_what_the_channel_form_would_say_of_each_channel_once(team_setup, monkeypatch):
    """The checks a channel gets when it is saved from its form (a key's variable not set where the panel runs, a
    remote provider without a key) are said by the import too, with the channel's path, and not twice where the
    file's own check said the same (the missing /v1)."""
    monkeypatch.delenv("TAOTOKEN_API_KEY", raising=False)
    result = settings_import(team=team_setup["team_a"], user=team_setup["alice"], text=SEED_A)
    assert result.warnings == [
        "$.endpoints.cloud_fallback: TAOTOKEN_API_KEY is not set in the panel's environment: the gateway reports "
        "this channel as misconfigured until it is set where the panel runs."]
    result = settings_import(team=team_setup["team_b"], text=SEED_B)
    assert [w.split(": ")[0] for w in result.warnings] == ["$.channels.taotoken_cloud.base_url",
                                                           "$.channels.taotoken_cloud"]
    assert sum("/v1" in warning for warning in result.warnings) == 1
    assert "TAOTOKEN_API_KEY is not set" in result.warnings[1]


def test_the_default_channel_goes_first(team_setup):
    data = json.loads(SEED_B)
    data["default_channel"] = "taotoken_cloud"
    settings_import(team=team_setup["team_a"], text=json.dumps(data))
    route = Route.objects.get()
    assert route.model_name == "qwen2.5-7b-instruct"
    assert [channel.name for channel in route.ordered_channels()] == ["taotoken_cloud", "local_awq"]


@pytest.mark.parametrize("seed, export", [(SEED_A, "a"), (SEED_B, "b")])
def test_export_round_trips_the_seeds_files_exactly(team_setup, seed, export):
    team = team_setup["team_a"]
    settings_import(team=team, text=seed)
    route = Route.objects.get(team=team)
    text = export_a(route=route) if export == "a" else export_b(team=team, route=route)
    assert json.loads(text) == json.loads(seed)
    assert list(json.loads(text)) == list(json.loads(seed))  # the seeds' key order too
    assert export_b(team=team) == export_b(team=team, route=route)


def test_export_never_writes_a_stored_key(team_setup, monkeypatch):
    team = team_setup["team_a"]
    secret = "sk-very-secret-key-4321"
    data = {"channels": {"box": {"base_url": "http://127.0.0.1:8000/v1", "api_key": "EMPTY", "model_id": "tiny"},
                         "cloud": {"base_url": "https://api.example.com/v1", "api_key": secret, "model_id": "tiny"}},
            "default_channel": "box"}
    result = settings_import(team=team, text=json.dumps(data))
    assert any("$.channels.cloud.api_key: a literal key" in warning for warning in result.warnings)
    cloud = Channel.objects.get(name="cloud")
    assert cloud.credential_kind == CredentialKind.STORED and cloud.api_key() == secret
    assert secret not in cloud.credential_ciphertext
    route = Route.objects.get()
    for text in (export_b(team=team), export_b(team=team, route=route), export_a(route=route)):
        assert secret not in text and "4321" not in text and cloud.credential_ciphertext[:20] not in text
        assert "TOKENWISE_UPSTREAM_CLOUD" in text and "stored encrypted" in json.loads(text)["_note"]
    exported = json.loads(export_b(team=team))
    assert exported["channels"]["cloud"]["api_key"] == "${TOKENWISE_UPSTREAM_CLOUD}"
    # The export imports again (into another team): the placeholder becomes an environment reference, once the
    # operator binds the variable to the provider.
    bind_credential_env(monkeypatch, "TOKENWISE_UPSTREAM_CLOUD", "https://api.example.com")
    settings_import(team=team_setup["team_b"], text=export_b(team=team))
    assert Channel.objects.get(team=team_setup["team_b"], name="cloud").credential_env == "TOKENWISE_UPSTREAM_CLOUD"


def test_export_a_notes_what_format_a_cannot_hold(team_setup):
    team = team_setup["team_a"]
    box = channel_create(team=team, name="box", kind=ChannelKind.LOCAL, base_url="http://127.0.0.1:8000/v1",
                         model_id="tiny-served", credential_kind=CredentialKind.NONE)
    box2 = channel_create(team=team, name="box2", kind=ChannelKind.LOCAL, base_url="http://127.0.0.1:8001/v1",
                          model_id="tiny", credential_kind=CredentialKind.NONE)
    route = route_save(team=team, model_name="tiny", entries=[(box, 0, 1), (box2, 1, 1)])
    document = json.loads(export_a(route=route))
    assert document["endpoints"] == {"local_vllm": "http://127.0.0.1:8000/v1"} and "provider" not in document
    assert "box: tiny-served" in document["_note"] and "not in this file: box2" in document["_note"]
    assert parse(export_a(route=route)).format == "A"  # still importable


POOL_FILE = {"channels": {
    "fleet": {"base_url": "http://127.0.0.1:8100/v1", "api_key": "EMPTY", "model_id": "qwen",
              "pool": {"scrape_urls": ["http://127.0.0.1:8101/metrics", "http://127.0.0.1:8102/metrics"],
                       "gpu_count": 4, "price_per_gpu_hour": 1.75, "batch_slots": 64}},
    "cloud": {"base_url": "https://api.example.com/v1", "api_key": "${TAOTOKEN_API_KEY}", "model_id": "qwen"}},
    "default_channel": "fleet"}


def test_a_vllm_pool_round_trips_through_format_b_without_its_scrape_token(team_setup, monkeypatch):
    team = team_setup["team_a"]
    bind_credential_env(monkeypatch, "TAOTOKEN_API_KEY", "https://api.example.com")
    result = settings_import(team=team, text=json.dumps(POOL_FILE))
    fleet = Channel.objects.get(team=team, name="fleet")
    assert [channel.name for channel in result.channels] == ["fleet", "cloud"]
    assert (fleet.kind, fleet.scrape_url_list(), fleet.gpu_count, str(fleet.price_per_gpu_hour), fleet.batch_slots) \
        == (ChannelKind.POOL, ["http://127.0.0.1:8101/metrics", "http://127.0.0.1:8102/metrics"], 4, "1.750000", 64)
    assert Channel.objects.get(team=team, name="cloud").kind == ChannelKind.REMOTE
    route = Route.objects.get(team=team)
    assert json.loads(export_b(team=team, route=route)) == POOL_FILE  # exactly what was imported

    token = "scrape-token-that-stays-9876"
    channel_update(channel=fleet, scrape_token=token)
    text = export_b(team=team)
    assert token not in text and "9876" not in text and "fleet: its scrape token" in json.loads(text)["_note"]
    settings_import(team=team, text=text, replace=True)  # the stored token is kept on replace
    assert Channel.objects.get(pk=fleet.pk).scrape_token_last4 == "9876"
    assert "not in this file: fleet" in json.loads(export_a(route=route))["_note"]


@pytest.mark.parametrize("pool, expected", [
    ([], "$.channels.fleet.pool: must be an object {scrape_urls, gpu_count, price_per_gpu_hour, batch_slots}"),
    ({"gpu_count": 1}, "$.channels.fleet.pool.scrape_urls: must be a list of the /metrics URLs"),
    ({"scrape_urls": "http://127.0.0.1:8101/metrics"}, "$.channels.fleet.pool.scrape_urls: must be a list"),
    ({"scrape_urls": ["http://127.0.0.1:8101/metrics"], "gpu_count": "4"},
     "$.channels.fleet.pool.gpu_count: must be a whole number, not a string"),
    ({"scrape_urls": ["http://127.0.0.1:8101/metrics"], "price_per_gpu_hour": "1.75"},
     "$.channels.fleet.pool.price_per_gpu_hour: must be a number or null"),
    ({"scrape_urls": ["http://127.0.0.1:8101/metrics"], "batch_slots": 1.5},
     "$.channels.fleet.pool.batch_slots: must be a whole number or null"),
    ({"scrape_urls": ["http://127.0.0.1:8101/metrics"], "scrape_token": "x"},
     "$.channels.fleet.pool.scrape_token: unknown key"),
])
def test_a_pools_errors_name_their_json_path(pool, expected):
    document = json.loads(json.dumps(POOL_FILE))
    document["channels"]["fleet"]["pool"] = pool
    assert any(message.startswith(expected) for message in problems_of(json.dumps(document))), expected


@pytest.mark.parametrize("pool, expected", [
    ({"scrape_urls": ["file:///etc/passwd"]}, "$.channels.fleet.pool.scrape_urls: "),
    ({"scrape_urls": ["http://127.0.0.1:8101/metrics"], "gpu_count": -1}, "$.channels.fleet.pool.gpu_count: "),
    ({"scrape_urls": ["http://127.0.0.1:8101/metrics"], "price_per_gpu_hour": 1e12},
     "$.channels.fleet.pool.price_per_gpu_hour: "),
])
def test_a_pool_the_channel_rules_refuse_saves_nothing(team_setup, monkeypatch, pool, expected):
    bind_credential_env(monkeypatch, "TAOTOKEN_API_KEY", "https://api.example.com")
    document = json.loads(json.dumps(POOL_FILE))
    document["channels"]["fleet"]["pool"] = pool
    before = counts()
    messages = problems_of(json.dumps(document), team=team_setup["team_a"])
    assert any(message.startswith(expected) for message in messages), messages
    assert counts() == before


# ------------------------------------------------------------------------------------------------ refusals

def test_a_second_import_is_refused_unless_replace_is_ticked(team_setup):
    team = team_setup["team_a"]
    settings_import(team=team, text=SEED_A)
    before = counts()
    problems = problems_of(SEED_A, team=team)
    assert "$.endpoints.local_vllm: this team already has a channel named 'local_vllm'" in problems[0]
    assert any(problem.startswith("$.default_model: this team already has a route") for problem in problems)
    assert counts() == before
    changed = json.loads(SEED_A)
    changed["timeout_seconds"], changed["endpoints"]["local_vllm"] = 30, "http://127.0.0.1:9000/v1"
    settings_import(team=team, text=json.dumps(changed), replace=True)
    assert counts() == before
    local = Channel.objects.get(name="local_vllm")
    assert local.timeout_seconds == 30 and local.base_url == "http://127.0.0.1:9000/v1"
    changed["timeout_seconds"] = 4  # shorter than the default budgets: they are cut to it
    settings_import(team=team, text=json.dumps(changed), replace=True)
    local = Channel.objects.get(name="local_vllm")
    assert (local.connect_timeout_seconds, local.first_byte_timeout_seconds, local.idle_timeout_seconds,
            local.timeout_seconds) == (4, 4, 4, 4)


def test_a_late_error_saves_nothing(team_setup):
    team = team_setup["team_a"]
    channel_create(team=team, name="taotoken_cloud", kind=ChannelKind.REMOTE, base_url="https://x.example.com/v1",
                   model_id="m", credential_kind=CredentialKind.NONE)
    before = counts()
    problems = problems_of(SEED_B, team=team)  # local_awq would be created, then the name clash is found
    assert problems == ["$.channels.taotoken_cloud: this team already has a channel named 'taotoken_cloud' (tick "
                        "\"replace\" to overwrite it)"]
    assert counts() == before and not Channel.objects.filter(name="local_awq").exists()


@pytest.mark.parametrize("change, expected", [
    (lambda d: d.update(surprise=1), "$.surprise: unknown key"),
    (lambda d: d["endpoints"].update(backup="http://x/v1"), "$.endpoints.backup: unknown key"),
    (lambda d: d["routing"].update(strategy="round_robin"), "$.routing.strategy: must be one of"),
    (lambda d: d["routing"].update(fallback_on_error="yes"), "$.routing.fallback_on_error: must be true or false"),
    (lambda d: d.update(timeout_seconds="120"), "$.timeout_seconds: must be a number, not a string"),
    (lambda d: d.update(timeout_seconds=10**9), "$.timeout_seconds: must be from 0.1 to 3600"),
    (lambda d: d.update(max_retries=2.5), "$.max_retries: must be a whole number"),
    (lambda d: d.update(max_retries=True), "$.max_retries: must be a number, not true/false"),
    (lambda d: d.update(api_key_env="${TAOTOKEN_API_KEY}"), "$.api_key_env: write the variable's name without"),
    (lambda d: d.update(default_model="two words"), "$.default_model: Enter the model id"),
    (lambda d: d.pop("default_model"), "$.default_model: is missing"),
    (lambda d: d.update(endpoints={}), "$.endpoints: names no endpoint"),
    (lambda d: d["endpoints"].update(local_vllm="http://127.0.0.1:8000/v1/v1"), "$.endpoints.local_vllm: The base "
                                                                               "URL ends in /v1/v1"),
    (lambda d: d["endpoints"].update(cloud_fallback="https://taotoken.net/api/v1/chat/completions"),
     "$.endpoints.cloud_fallback: The base URL ends in /chat/completions"),
    (lambda d: d.update(provider="no spaces please"), "$.provider: A channel name is"),
])
def test_format_a_errors_name_their_json_path(change, expected):
    data = json.loads(SEED_A)
    change(data)
    problems = problems_of(json.dumps(data))
    assert any(problem.startswith(expected) for problem in problems), problems


@pytest.mark.parametrize("change, expected", [
    (lambda d: d.update(extra=[]), "$.extra: unknown key"),
    (lambda d: d["channels"]["local_awq"].update(api_base="x"), "$.channels.local_awq.api_base: unknown key"),
    (lambda d: d["channels"]["local_awq"].pop("model_id"), "$.channels.local_awq.model_id: is missing"),
    (lambda d: d["channels"]["local_awq"].update(api_key="Bearer sk-abcdefghijkl"),
     "$.channels.local_awq.api_key: Enter the key without \"Bearer\""),
    (lambda d: d["channels"]["local_awq"].update(api_key="$TAOTOKEN_API_KEY"),
     "$.channels.local_awq.api_key: an environment variable is written ${NAME}"),
    (lambda d: d["channels"]["local_awq"].update(api_key=""), "$.channels.local_awq.api_key: is empty"),
    (lambda d: d["channels"]["local_awq"].update(base_url=8000), "$.channels.local_awq.base_url: must be a string"),
    (lambda d: d["channels"].update({"bad name": {}}), "$.channels[\"bad name\"]: A channel name is"),
    (lambda d: d["channels"].update(third=[]), "$.channels.third: must be an object"),
    (lambda d: d.update(default_channel="nope"), "$.default_channel: \"nope\" is not one of the channels"),
    (lambda d: d.pop("default_channel"), "$.default_channel: is missing"),
    (lambda d: d.update(channels={}), "$.channels: is empty"),
    (lambda d: d.update(channels={f"c{i}": {} for i in range(51)}), "$.channels: holds 51 channels"),
])
def test_format_b_errors_name_their_json_path(change, expected):
    data = json.loads(SEED_B)
    change(data)
    problems = problems_of(json.dumps(data))
    assert any(problem.startswith(expected) for problem in problems), problems


@pytest.mark.parametrize("text, expected", [
    ("", "is empty"),
    ("{\"channels\": ", "is not valid JSON"),
    ("[1, 2]", "must be a JSON object, not a list"),
    ("{\"hello\": 1}", "not a settings.json"),
    ("{\"default_model\": \"x\", \"timeout_seconds\": 1" + "0" * 5000 + "}", "more than 15 digits"),
    ("{\"default_model\": \"x\", \"timeout_seconds\": 1e999}", "too large"),
    ("{\"default_model\": \"x\", \"timeout_seconds\": NaN}", "NaN is not a number"),
    ("{\"channels\": {}, \"channels\": {}}", "appears twice"),
    ("[" * 100000 + "]" * 100000, "nested more than 8 levels"),
    ("{\"a\": " * 50 + "1" + "}" * 50, "nested more than 8 levels"),
    ("{\"_note\": \"" + "x" * (1024 * 1024) + "\"}", "larger than 256 KB"),
    (b"\xff\xfe{}", "not UTF-8"),
])
def test_hostile_input_is_a_clear_error(text, expected):
    problems = problems_of(text)
    assert len(problems) == 1 and expected in problems[0], problems


# ------------------------------------------------------------------------------------------------ fuzzing

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20)
known_keys = st.sampled_from(settings_json.KEYS_A + settings_json.KEYS_B + ("local_vllm", "cloud_fallback", "x"))
near_miss = st.dictionaries(known_keys, json_values, max_size=8)


@given(st.one_of(st.text(max_size=300), st.binary(max_size=300)))
@settings(max_examples=300, deadline=None)
def test_parse_never_fails_otherwise_on_any_text(text):
    try:
        parse(text)
    except ValidationError as error:
        assert error.messages and all(isinstance(message, str) and message for message in error.messages)


@given(st.one_of(json_values, near_miss))
@settings(max_examples=400, deadline=None)
def test_parse_never_fails_otherwise_on_any_json(value):
    try:
        plan = parse(json.dumps(value))
    except ValidationError as error:
        assert all(message.startswith("$") or "settings.json" in message for message in error.messages)
    else:
        assert plan.format in ("A", "B") and plan.channels


def _mutations():
    """The seeds' files with one value replaced by anything."""
    def replace(document, path, value):
        data = json.loads(document)
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return json.dumps(data)

    paths_a = [("provider",), ("base_url",), ("api_key_env",), ("default_model",), ("timeout_seconds",),
               ("max_retries",), ("retry_backoff",), ("endpoints",), ("endpoints", "local_vllm"),
               ("endpoints", "cloud_fallback"), ("routing",), ("routing", "strategy"), ("routing", "fallback_on_error")]
    paths_b = [("channels",), ("default_channel",), ("channels", "local_awq"), ("channels", "local_awq", "base_url"),
               ("channels", "local_awq", "api_key"), ("channels", "taotoken_cloud", "model_id"),
               ("channels", "taotoken_cloud", "api_key")]
    return st.one_of(
        st.tuples(st.sampled_from(paths_a), json_values).map(lambda item: replace(SEED_A, *item)),
        st.tuples(st.sampled_from(paths_b), json_values).map(lambda item: replace(SEED_B, *item)))


@given(_mutations())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_import_is_all_or_nothing_on_mutated_seeds(team_setup, text):
    team = team_setup["team_a"]
    with transaction.atomic():
        before = counts()
        try:
            result = settings_import(team=team, text=text, replace=True)
        except ValidationError as error:
            assert all(message.startswith("$") for message in error.messages), error.messages
            assert counts() == before
        else:
            route = Route.objects.get(team=team, model_name=result.route.model_name)
            assert [entry.channel for entry in route.entries()] == result.channels
            assert all(channel.misconfigured == "" or channel.credential_kind == CredentialKind.ENV
                       for channel in result.channels)
        transaction.set_rollback(True)


names = st.from_regex(r"\A[a-z][a-z0-9_]{0,15}\Z")
hosts = st.sampled_from(["127.0.0.1:8000", "93.184.215.14:8001", "taotoken.net/api", "api.example.com"])
keys = st.one_of(st.just("EMPTY"), st.from_regex(r"\A\$\{TOKENWISE_UPSTREAM_[A-Z0-9_]{1,10}\}\Z"),
                 st.from_regex(r"\Ask-[A-Za-z0-9]{12,30}\Z"))
model_ids = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._/-]{0,30}\Z")
format_b = st.dictionaries(names, st.fixed_dictionaries({
    "base_url": hosts.map(lambda host: f"http://{host}/v1"), "api_key": keys, "model_id": model_ids}),
    min_size=1, max_size=5).flatmap(lambda channels: st.fixed_dictionaries({
        "channels": st.just(channels), "default_channel": st.sampled_from(sorted(channels))}))


@given(format_b)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_valid_format_b_imports_and_exports_back_without_secrets(team_setup, monkeypatch, document):
    team = team_setup["team_a"]
    for spec in document["channels"].values():  # the operator binds each variable to the channels' servers
        if spec["api_key"].startswith("${"):
            variable = spec["api_key"][2:-1]
            bound = [other["base_url"] for other in document["channels"].values()
                     if other["api_key"] == spec["api_key"]]
            bind_credential_env(monkeypatch, variable, *bound)
    with transaction.atomic():
        settings_import(team=team, text=json.dumps(document))
        route = Route.objects.get(team=team)
        exported = json.loads(export_b(team=team, route=route))
        assert exported["default_channel"] == document["default_channel"]
        assert set(exported["channels"]) == set(document["channels"])
        for name, spec in document["channels"].items():
            out = exported["channels"][name]
            assert (out["base_url"], out["model_id"]) == (spec["base_url"], spec["model_id"])
            if spec["api_key"].startswith("sk-"):
                assert out["api_key"] == "${TOKENWISE_UPSTREAM_" + name.upper() + "}"
                assert spec["api_key"] not in json.dumps(exported)
            else:
                assert out["api_key"] == spec["api_key"]
        transaction.set_rollback(True)
