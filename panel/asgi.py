"""ASGI entry point. Static files are answered here, before Django, so no sync middleware sits in front of
the async gateway views and no extra dependency (whitenoise is WSGI-only) is needed."""
import asyncio
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "panel.settings")

from panel.env import EnvError  # noqa: E402

try:
    from django.core.asgi import get_asgi_application

    django_application = get_asgi_application()
except EnvError as error:
    sys.exit(f"tokenwise: configuration error: {error}")

from django.conf import settings  # noqa: E402

from panel.core.request_size import BodyLimit  # noqa: E402
from panel.gateway import advances  # noqa: E402
from panel.gateway.app import application as gateway_application  # noqa: E402
from panel.static_files import StaticFiles  # noqa: E402
from panel.usage import writer  # noqa: E402

panel_application = BodyLimit(StaticFiles(django_application, url_prefix=settings.STATIC_URL,
                                          root=settings.STATIC_ROOT))


async def application(scope, receive, send):
    """/v1/... goes straight to the gateway (no Django middleware on its path); the rest to the panel; the server's
    start and stop to lifespan()."""
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
    elif scope["type"] == "http" and scope["path"].startswith("/v1/"):
        await gateway_application(scope, receive, send)
    else:
        await panel_application(scope, receive, send)


async def lifespan(receive, send):
    """The server's start and stop as uvicorn announces them. At stop the usage writer writes every record it holds:
    uvicorn re-raises SIGTERM once its shutdown is done, and a process ended by that signal runs no atexit hook, so
    a gateway stopped by a supervisor lost the records of its last requests (unbilled). The advances this process holds
on keys' limits are given back first (gateway/advances.py), within seconds."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            try:
                await asyncio.wait_for(advances.give_back_all(), 3)
            except asyncio.TimeoutError:
                pass  # held until their counters expire, as a process that died holds them
            await asyncio.to_thread(writer.flush)
            await send({"type": "lifespan.shutdown.complete"})
            return
