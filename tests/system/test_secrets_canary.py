"""Planted canary secrets (a channel's upstream key and a team key) never appear in anything the panel produces:
rendered pages, exports, error pages, gateway answers, Celery messages, logs, audit rows, the database or Redis.

How to extend it: pages need nothing, they are found by walking the URL patterns like tests/system/test_permissions.py
(give a new URL keyword a real id in `url_ids` to get the real page rather than a 404). Anything else that turns
data into text (an export with query parameters, a task, a log file, a store) is one more function decorated with
`@surface`: it exercises a feature and hands what came out to `seen.add(where, text)`. Surfaces run in the order
they are declared; the stores (logs, database, Redis, files) come last so they hold what the others did."""
import json
import logging
import re
import secrets
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import redis
from celery.signals import before_task_publish
from django.apps import apps
from django.conf import settings
from django.db import transaction
from django.test import RequestFactory
from django.urls import reverse
from django.views.defaults import server_error

from panel.accounts.keys import key_issue
from panel.accounts.models import Membership, TeamKey
from panel.audit.models import AuditEvent
from panel.budgets.services import budget_set
from panel.channels.models import Channel, Route, RouteChannel
from tests.support.environment import DATA_DIR
from tests.support.fake_upstream import FakeUpstream
from tests.support.gateway_server import GatewayServer
from tests.support.url_gates import PUBLIC, gated_patterns
from tests.support.waiting import wait_until

# Shaped unlike "sk-..." on purpose: the generic key pattern of the redaction must not be what hides it.
CHANNEL_KEY = "canarychan" + secrets.token_hex(16)
DESTRUCTIVE = re.compile(r"delete|revoke|remove|stop|cancel|logout")
SURFACES = []


def surface(function):
    SURFACES.append(function)
    return function


class Seen:
    """Every text a surface produced, with where it came from."""

    def __init__(self):
        self.items = []

    def add(self, where, text):
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", "replace")
        self.items.append((where, str(text)))

    def add_response(self, where, response):
        headers = "\n".join(f"{name}: {value}" for name, value in response.items()) if hasattr(response, "items") \
            else "\n".join(f"{name}: {value}" for name, value in response.headers.items())
        body = getattr(response, "content", b"") if not getattr(response, "streaming", False) \
            else b"".join(response.streaming_content)
        self.add(where, f"{getattr(response, 'status_code', '')}\n{headers}\n\n{body.decode('utf-8', 'replace')}")

    def leaks(self, canaries):
        """[(where, canary name, fragment)] for each text holding a canary or a long piece of one."""
        found = []
        for name, canary in canaries.items():
            # The whole secret, and its middle (a truncated echo such as "canarychan1f2e...") — the last four
            # characters alone are shown on purpose.
            fragments = {canary, canary[3:-4]}
            for where, text in self.items:
                for fragment in fragments:
                    if fragment in text:
                        found.append((where, name, fragment))
        return found


class EchoUpstream:
    """A hostile provider: every answer is a 401 whose message repeats the Authorization header it got, the way
    some providers echo (part of) a wrong key."""

    def __init__(self):
        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                said = self.headers.get("authorization", "")
                body = json.dumps({"error": {"message": f"Incorrect API key provided: {said}",
                                             "type": "invalid_request_error", "code": "invalid_api_key"}}).encode()
                self.send_response(401)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_port}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def channel_post(name, base_url, *, api_key, **changes):
    data = {"name": name, "kind": "remote", "base_url": base_url, "model_id": "up-model", "enabled": "on",
            "credential_kind": "stored", "api_key": api_key, "credential_env": "", "timeout_seconds": "5",
            "max_retries": "0", "retry_backoff": "1.5", "priority": "0", "weight": "1",
            "price_input_per_million": "1", "price_output_per_million": "2", "price_cached_per_million": "1"}
    data.update(changes)
    return data


@pytest.fixture
def world(client, team_setup, transactional_db, caplog):
    """The canaries planted the way users plant them: the channel key through the channel form, the team key
    issued by the service (the one page that shows a new key, once, is the keys test's business)."""
    from django.db import connection

    caplog.set_level(getattr(logging, settings.LOGGING["root"]["level"]))
    published = []

    def capture(sender=None, body=None, headers=None, routing_key=None, **_):
        published.append((sender, json.dumps([body, headers, routing_key], default=str)))

    before_task_publish.connect(capture, weak=False)
    seen = Seen()
    with FakeUpstream(models=("up-model",), api_key=CHANNEL_KEY) as fake, EchoUpstream() as echo:
        client.force_login(team_setup["alice"])
        bad = client.post(reverse("channel_create"), channel_post("cloud", "not a url", api_key=CHANNEL_KEY))
        assert bad.status_code == 400
        seen.add_response("channel form with an error", bad)
        made = client.post(reverse("channel_create"), channel_post("cloud", fake.base_url, api_key=CHANNEL_KEY))
        assert made.status_code == 302, made.content.decode()[:2000]
        seen.add_response("channel form saved", made)
        made = client.post(reverse("channel_create"), channel_post("echo", echo.base_url, api_key=CHANNEL_KEY))
        assert made.status_code == 302
        cloud, hostile = Channel.objects.get(name="cloud"), Channel.objects.get(name="echo")
        assert cloud.api_key() == CHANNEL_KEY and CHANNEL_KEY not in str(cloud.credential_ciphertext)
        routes = {}
        for model_name, channel in (("chat", cloud), ("echoed", hostile)):
            routes[model_name] = Route.objects.create(team=team_setup["team_a"], model_name=model_name,
                                                      strategy="local_first")
            RouteChannel.objects.create(route=routes[model_name], channel=channel, position=1)
        key, raw = key_issue(team=team_setup["team_a"], user=team_setup["alice"], name="canary app")
        budget_set(team=team_setup["team_a"], key=key, tokens_per_month=10**9)
        gateway = GatewayServer(connection.settings_dict["NAME"])
        try:
            yield {**team_setup, "client": client, "seen": seen, "fake": fake, "echo": echo, "cloud": cloud,
                   "hostile": hostile, "routes": routes, "key": key, "raw_key": raw, "gateway": gateway,
                   "published": published, "caplog": caplog, "db_path": connection.settings_dict["NAME"]}
        finally:
            gateway.stop()
            before_task_publish.disconnect(capture)


def url_ids(world):
    """Real ids for the URL keywords the walk meets; any other keyword gets an id that exists nowhere (a 404)."""
    return {"channel_id": world["cloud"].pk, "route_id": world["routes"]["chat"].pk, "key_id": world["key"].pk,
            "membership_id": Membership.objects.get(user=world["vera"], team=world["team_a"]).pk, "kind": "toml"}


def walk_urls(world):
    ids = url_ids(world)
    for name, pattern, _ in gated_patterns():
        keywords = re.findall(r"<(?:(\w+):)?(\w+)>", pattern)
        kwargs = {key: ids.get(key, 999999) for _, key in keywords}
        yield name, reverse(name, kwargs=kwargs) if kwargs else reverse(name)


@surface
def channel_pages_and_forms(world, seen):
    client, cloud = world["client"], world["cloud"]
    seen.add_response("channel edit form", client.get(reverse("channel_edit", args=[cloud.pk])))
    kept = client.post(reverse("channel_edit", args=[cloud.pk]), channel_post("cloud", cloud.base_url, api_key=""))
    seen.add_response("channel edit keeping the key", kept)
    assert Channel.objects.get(pk=cloud.pk).api_key() == CHANNEL_KEY
    bad = client.post(reverse("channel_edit", args=[cloud.pk]),
                      channel_post("cloud", cloud.base_url, api_key=CHANNEL_KEY, timeout_seconds="-3"))
    assert bad.status_code == 400
    seen.add_response("channel edit with an error and the key retyped", bad)


@surface
def channel_test_button(world, seen):
    for channel in (world["cloud"], world["hostile"]):
        response = world["client"].post(reverse("channel_test", args=[channel.pk]), follow=True)
        seen.add_response(f"Test button of {channel.name}", response)
    assert Channel.objects.get(pk=world["cloud"].pk).last_test["ok"]
    assert not Channel.objects.get(pk=world["hostile"].pk).last_test["ok"]


@surface
def gateway_answers(world, seen):
    gateway, raw = world["gateway"], world["raw_key"]
    url = f"{gateway.url}/v1/chat/completions"
    auth = {"Authorization": f"Bearer {raw}"}
    chat = {"model": "chat", "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 5}
    asks = {
        "chat": (url, chat, auth),
        "stream": (url, {**chat, "stream": True, "stream_options": {"include_usage": True}}, auth),
        "echoing upstream": (url, {**chat, "model": "echoed"}, auth),
        "echoing upstream, streamed": (url, {**chat, "model": "echoed", "stream": True}, auth),
        "unknown model": (url, {**chat, "model": "nope"}, auth),
        "bad body": (url, "{not json", auth),
        "wrong key": (url, chat, {"Authorization": f"Bearer {raw}x"}),
        "malformed header": (url, chat, {"Authorization": f"Bearer{raw}"}),
        "unknown endpoint": (f"{gateway.url}/v1/embeddings", chat, auth),
    }
    for where, (target, body, headers) in asks.items():
        content = body if isinstance(body, str) else json.dumps(body)
        response = httpx.post(target, content=content, headers={**headers, "content-type": "application/json"},
                              timeout=30)
        seen.add(f"gateway: {where}", f"{response.status_code}\n{response.headers}\n\n{response.text}")
        if where == "echoing upstream":  # the provider's words reach the client, without the key
            assert "Incorrect API key provided: Bearer ****" in response.text, response.text
    world["fake"].behave("status_503", times=1)
    response = httpx.post(url, json=chat, headers=auth, timeout=30)
    seen.add("gateway: upstream 503", f"{response.status_code}\n{response.text}")
    models = httpx.get(f"{gateway.url}/v1/models", headers=auth, timeout=30)
    assert models.status_code == 200
    seen.add("gateway: models", models.text)
    assert [r.headers.get("authorization") for r in world["fake"].requests][-1] == f"Bearer {CHANNEL_KEY}"


@surface
def every_page(world, seen):
    """GET every URL pattern as the owner and as a viewer, and POST an empty form to each that destroys nothing."""
    client, viewer = world["client"], type(world["client"])()
    viewer.force_login(world["vera"])
    for name, url in walk_urls(world):
        for who, session in (("owner", client), ("viewer", viewer)):
            seen.add_response(f"GET {url} as {who} ({name})", session.get(url))
        if not DESTRUCTIVE.search(name) and name not in PUBLIC:
            seen.add_response(f"POST {url} ({name})", client.post(url, {}))
    exports = [reverse("settings_export") + "?format=b",
               reverse("settings_export") + f"?format=a&route={world['routes']['chat'].pk}",
               reverse("audit_csv"), reverse("audit_csv") + "?action=credential_changed"]
    for url in exports:
        response = client.get(url)
        assert response.status_code == 200, url
        seen.add_response(f"export {url}", response)


@surface
def error_pages(world, seen):
    client, viewer = world["client"], type(world["client"])()
    viewer.force_login(world["vera"])
    seen.add_response("404", client.get("/no-such-page/"))
    seen.add_response("403", viewer.post(reverse("channel_edit", args=[world["cloud"].pk]),
                                         channel_post("cloud", world["cloud"].base_url, api_key=CHANNEL_KEY)))
    seen.add_response("400", client.get(reverse("audit") + "?since=yesterday"))
    request = RequestFactory().get(reverse("channel_detail", args=[world["cloud"].pk]))
    seen.add_response("500", server_error(request))


@surface
def api_responses(world, seen):
    """The management API as the owner's and the viewer's tokens see it: every GET with real ids, the channel made and
    its key rotated with the canary in the body, a bad body echoing it back, and the refusals."""
    from panel.accounts.tokens import token_issue
    from tests.support.url_gates import API_OPERATIONS

    client = world["client"]
    owner = Membership.objects.get(user=world["alice"], team=world["team_a"])
    viewer = Membership.objects.get(user=world["vera"], team=world["team_a"])
    tokens = {who: token_issue(membership=membership, name=f"canary {who}")[1]
              for who, membership in (("owner", owner), ("viewer", viewer))}
    ids = {**url_ids(world), "webhook_id": world.get("webhook_id", 999999)}

    def call(method, path, who="owner", body=None):
        url = re.sub(r"\{(\w+)\}", lambda match: str(ids.get(match.group(1), 999999)), path)
        response = client.generic(method, url, json.dumps(body) if body is not None else "",
                                  content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {tokens[who]}")
        seen.add_response(f"API {method} {url} as {who}", response)
        return response

    for method, path, _ in API_OPERATIONS:
        if method == "GET":
            for who in tokens:
                call(method, path, who)
    made = call("POST", "/api/v1/channels", body={**channel_post("api-made", world["fake"].base_url,
                                                                 api_key=CHANNEL_KEY), "enabled": True})
    assert made.status_code == 201, made.content
    assert Channel.objects.get(name="api-made").api_key() == CHANNEL_KEY
    ids["channel_id"] = made.json()["id"]
    assert call("POST", "/api/v1/channels/{channel_id}/credential", body={"api_key": CHANNEL_KEY}).status_code == 200
    bad = call("POST", "/api/v1/channels", body={"name": "bad", "base_url": "nope", "api_key": "Bearer " + CHANNEL_KEY,
                                                 "model_id": "m", "credential_kind": "stored", "kind": "remote"})
    assert bad.status_code == 400
    call("PATCH", "/api/v1/channels/{channel_id}", "viewer", {"api_key": CHANNEL_KEY})
    call("POST", "/api/v1/channels/{channel_id}/test")
    assert call("GET", "/api/v1/openapi.json").status_code == 200
    world["api_tokens"] = tokens


@surface
def celery_messages_and_worker(world, seen, start_worker):
    """Every task message sent during the test (captured as it is published, and what is still queued in Redis),
    then a real worker that runs them, and its log."""
    import workers  # noqa: F401  (the web process's Celery app, with the broker settings)
    from panel.budgets.tasks import reconcile_budgets

    reconcile_budgets.delay()
    queued = redis.Redis.from_url(settings.REDIS_URL)
    for name in queued.keys("*"):
        if queued.type(name) == b"list":
            seen.add(f"Redis queue {name.decode()}", b"\n".join(queued.lrange(name, 0, -1)))
    for task, message in world["published"]:
        seen.add(f"task message {task}", message)
    assert any(task == reconcile_budgets.name for task, _ in world["published"])
    worker = start_worker("default")
    wait_until(lambda: "reconcile_budgets" in worker.log() and "succeeded" in worker.log(), seconds=60,
               message="the worker to run the budget task")
    seen.add("worker log", worker.log_path.read_bytes())


@surface
def webhook_payloads(world, seen, start_worker):
    """Events about the canary channel and its route, delivered by a real worker to a receiver in both formats: the
    bodies and headers it got. (After the Celery surface, whose worker must be the one that runs its task.)"""
    from panel.notifications.models import Delivery, DeliveryState
    from panel.notifications.services import notify, webhook_create
    from tests.support.webhook_receiver import Receiver

    with Receiver() as plain, Receiver() as slack:
        webhook_create(team=world["team_a"], name="canary json", url=plain.url)
        webhook_create(team=world["team_a"], name="canary slack", url=slack.url, format="slack")
        cloud = Channel.objects.get(pk=world["cloud"].pk)
        with transaction.atomic():  # an event about the channel whose key is the canary, its Test result included
            notify(team=world["team_a"], kind="channel.cooled_down", title=f"Channel {cloud.name} cooled down",
                   channel=cloud.name, last_test=cloud.last_test)
        from panel.channels.canary import canary_rollback, canary_start

        route = canary_start(route=world["routes"]["chat"], channel=world["hostile"])
        canary_rollback(route=route, reason="errors above the threshold")
        start_worker("default")
        wait_until(lambda: not Delivery.objects.exclude(state=DeliveryState.DELIVERED).exists()
                   and len(plain.received) >= 2 and len(slack.received) >= 2, seconds=60,
                   message="the webhook deliveries")
        for name, receiver in (("json", plain), ("slack", slack)):
            for item in receiver.received:
                seen.add(f"webhook {name} payload", f"{item['headers']}\n\n{item['body'].decode()}")


@surface
def audit_rows(world, seen):
    rows = list(AuditEvent.objects.values())
    assert any(row["action"] == "credential_changed" for row in rows)
    seen.add("audit rows", json.dumps(rows, default=str))


@surface
def database(world, seen):
    """Every row of every table, read through the ORM (ciphertext included: it must not hold the plaintext)."""
    for model in apps.get_models():
        rows = list(model.objects.values_list()) if model is not AuditEvent else list(model.objects.values_list())
        seen.add(f"table {model._meta.db_table}", json.dumps(rows, default=str))
    assert TeamKey.objects.filter(pk=world["key"].pk).exists()


@surface
def redis_contents(world, seen):
    store = redis.Redis.from_url(settings.REDIS_URL)
    for name in store.keys("*"):
        kind = store.type(name)
        value = {b"string": lambda: store.get(name), b"list": lambda: store.lrange(name, 0, -1),
                 b"hash": lambda: store.hgetall(name), b"set": lambda: store.smembers(name),
                 b"zset": lambda: store.zrange(name, 0, -1)}.get(kind, lambda: b"")()
        seen.add(f"Redis {name.decode()}", repr(value))


@surface
def logs_and_files(world, seen):
    """The test's own log records, the gateway's and workers' logs, and every file in the data folder (the SQLite
    database file included, free pages and all, with its WAL)."""
    seen.add("log records (caplog)", "\n".join(
        f"{record.name} {record.levelname} {record.getMessage()} {record.exc_text or ''}"
        for record in world["caplog"].records))
    seen.add("gateway log", world["gateway"].log())
    paths = [path for path in Path(DATA_DIR).rglob("*") if path.is_file() and "models" not in path.parts
             and path.suffix != ".png" and path.stat().st_size < 50 * 1024 * 1024]
    paths += [Path(world["db_path"] + suffix) for suffix in ("", "-wal") if Path(world["db_path"] + suffix).exists()]
    for path in paths:
        # Read by another process: closing a file descriptor of the SQLite database in this process would drop
        # every POSIX lock this process's own connection holds on it (SQLite's documented corruption trap).
        read = subprocess.run(["cat", str(path)], capture_output=True)
        if read.returncode and not path.exists():
            continue  # a temporary file (Redis writes its dump through one) that went away meanwhile
        assert read.returncode == 0, read.stderr
        seen.add(f"file {path}", read.stdout)
    assert any("gateway-" in str(path) for path in paths)


def test_it_never_shows_the_canary_secrets_anywhere(world, start_worker):
    seen = world["seen"]
    for function in SURFACES:
        arguments = {"start_worker": start_worker} if "start_worker" in function.__code__.co_varnames else {}
        function(world, seen, **arguments)
    wheres = {where.split(" ")[0] for where, _ in seen.items}
    pages = [text for where, text in seen.items if where.startswith("GET ") and text.startswith("200")]
    assert len(pages) > 40 and any(world["cloud"].name in text and "••••" + CHANNEL_KEY[-4:] in text for text in pages)
    assert {"GET", "POST", "gateway:", "export", "task", "worker", "table", "file", "API", "webhook"} <= wheres
    canaries = {"channel key": CHANNEL_KEY, "team key": world["raw_key"]}
    leaks = seen.leaks(canaries)
    assert leaks == [], "canary secrets leaked:\n" + "\n".join(f"  {name} in {where}" for where, name, _ in leaks)
