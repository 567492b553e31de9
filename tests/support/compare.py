"""Compare test helpers: a channel on a fake provider and the panel as uvicorn serves it."""
import json
import time

import httpx
from django.test import Client

from panel.channels.models import Channel
from tests.support.gateway_server import GatewayServer

CSRF = "c" * 32


def channel(team, name, base_url, *, model="fake-model", timeout=5, **fields):
    return Channel.objects.create(team=team, name=name, kind=fields.pop("kind", "remote"), base_url=base_url,
                                  model_id=model, credential_kind="none", timeout_seconds=timeout, max_retries=2,
                                  **fields)


class Panel:
    """The panel as uvicorn serves it (the ASGI path streams), with a signed-in session and a CSRF token."""

    def __init__(self, user):
        from django.db import connection

        client = Client()
        client.force_login(user)
        self.server = GatewayServer(connection.settings_dict["NAME"])
        self.http = httpx.Client(base_url=self.server.url, timeout=30, headers={"X-CSRFToken": CSRF},
                                 cookies={"sessionid": client.cookies["sessionid"].value, "csrftoken": CSRF})

    def post(self, path, data):
        return self.http.post(path, json=data)

    def events(self, path, data=None, *, on_event=None):
        found = []
        with self.http.stream("POST", path, json=data or {}) as response:
            assert response.status_code == 200, response.read()
            assert response.headers["content-type"] == "application/x-ndjson"
            for line in response.iter_lines():
                if line.strip():
                    found.append(json.loads(line))
                    if on_event:
                        on_event(found[-1], time.monotonic())
        return found

    def close(self):
        self.http.close()
        self.server.stop()
