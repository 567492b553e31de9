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

from panel.static_files import StaticFiles  # noqa: E402

application = StaticFiles(django_application, url_prefix=settings.STATIC_URL, root=settings.STATIC_ROOT)
