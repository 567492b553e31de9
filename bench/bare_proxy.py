"""The floor for the gateway's added TTFT: a bare streaming proxy on the gateway's own server and client stack
(uvicorn with uvloop and httptools in, one pooled aiohttp session out), with no key, route, admission or record.
What it adds to a direct call is what any proxy process in Python on this stack adds on this machine (two more
loopback hops and process wake-ups); the gateway's own work is what it adds beyond that. Not part of the panel.

    UPSTREAM=http://127.0.0.1:PORT/v1 python -m uvicorn bare_proxy:application --app-dir bench --loop uvloop \
        --http httptools --port N
"""
import json
import os

import aiohttp

UPSTREAM = os.environ.get("UPSTREAM", "")
_session = None


async def application(scope, receive, send):
    global _session
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if _session is None:
        _session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
    payload = json.loads(body or b"{}")
    payload["model"] = "fake-model"
    async with _session.post(UPSTREAM + "/chat/completions", data=json.dumps(payload).encode(),
                             headers={"content-type": "application/json"}) as response:
        await send({"type": "http.response.start", "status": response.status,
                    "headers": [(b"content-type", b"text/event-stream")]})
        async for line in response.content:
            await send({"type": "http.response.body", "body": line, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
