"""ASGI entry point. Static files are answered here, before Django, so no sync middleware sits in front of
the async gateway views and no extra dependency (whitenoise is WSGI-only) is needed."""
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
from panel.gateway.app import application as gateway_application  # noqa: E402
from panel.static_files import StaticFiles  # noqa: E402

panel_application = BodyLimit(StaticFiles(django_application, url_prefix=settings.STATIC_URL,
                                          root=settings.STATIC_ROOT))


async def application(scope, receive, send):
    """/v1/... goes straight to the gateway (no Django middleware on its path); the rest to the panel."""
    if scope["type"] == "http" and scope["path"].startswith("/v1/"):
        await gateway_application(scope, receive, send)
    else:
        await panel_application(scope, receive, send)
