"""The floor for the gateway's added TTFT: a bare streaming proxy on the gateway's own server and client stack
(uvicorn with uvloop and httptools in, the gateway's HTTP client out: panel/gateway/http_client.py), with no key,
route, admission or record. What it adds to a direct call is what any proxy process in Python on this stack adds on
this machine (two more loopback hops and process wake-ups); the gateway's own work is what it adds beyond that. Not
part of the panel.

    UPSTREAM=http://127.0.0.1:PORT/v1 python -m uvicorn bare_proxy:application --app-dir bench --loop uvloop \
        --http httptools --port N
"""
import json
import os
import sys
from pathlib import Path

from django.conf import settings

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
settings.configure(OUTBOUND_ALLOW_CIDRS=[])  # all the outbound policy reads; the upstream is on loopback

from panel.gateway import http_client  # noqa: E402

UPSTREAM = os.environ.get("UPSTREAM", "")


async def lifespan(receive, send):
    while True:
        message = await receive()
        await send({"type": message["type"] + ".complete"})
        if message["type"] == "lifespan.shutdown":
            return


async def upstream_payload(receive):
    """The client's JSON body, for the fake upstream's model."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    payload = json.loads(body or b"{}")
    payload["model"] = "fake-model"
    return payload


async def application(scope, receive, send):
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    payload = await upstream_payload(receive)
    response = await http_client.post(UPSTREAM + "/chat/completions", json.dumps(payload).encode(),
                                      {"content-type": "application/json"}, loopback_ok=True)
    await send({"type": "http.response.start", "status": response.status,
                "headers": [(b"content-type", b"text/event-stream")]})
    pending = b""
    while block := await response.content.readany():
        *lines, pending = (pending + block).split(b"\n")
        if lines:
            await send({"type": "http.response.body", "body": b"\n".join(lines) + b"\n", "more_body": True})
    response.release()
    await send({"type": "http.response.body", "body": pending, "more_body": False})
