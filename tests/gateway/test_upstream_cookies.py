"""The gateway's upstream client keeps no cookies: a channel that sets one (a CDN's bot cookie, a provider's
session) must not see it come back on the next request, which may be another team's."""
import asyncio
import concurrent.futures

from aiohttp import web

from panel.channels.routing import Target
from panel.gateway import upstream


def test_a_cookie_an_upstream_sets_is_not_sent_back():
    seen = []

    async def handler(request):
        seen.append(request.headers.get("cookie"))
        response = web.json_response({"ok": True})
        response.set_cookie("session", "team-a-secret", path="/")
        return response

    async def run():
        # By name, not by address: aiohttp keeps no cookies of a bare IP address anyway.
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        target = Target(id=1, name="cookie-setter", base_url=f"http://localhost:{port}/v1", model_id="m", api_key="k",
                        credential_error="", timeout=10, max_retries=0, backoff=0, channel=None, loopback_ok=True)
        limits = upstream.Limits(first_byte=5, total=10)
        try:
            for _ in range(2):
                response = await upstream.send_request(target, "/chat/completions", {"model": "m"}, limits)
                assert response.status == 200 and "team-a-secret" in response.headers.get("set-cookie", "")
                await response.read()
                response.release()
        finally:
            await upstream.connections_close()
            await runner.cleanup()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # its own event loop, whatever this thread runs
        pool.submit(asyncio.run, run()).result(timeout=30)
    assert seen == [None, None]
