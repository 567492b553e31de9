"""The Celery app. Workers start through `python -m workers.start {default,long,gpu,beat}`; Celery's Django fixup
sets Django up in each worker process. Every app's tasks live in its own `tasks.py` (found by autodiscovery);
services send them by name (`panel.jobs.services.job_enqueue`)."""
import os

from celery import Celery
from celery.signals import worker_ready, worker_shutdown

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "panel.settings")

app = Celery("tokenwise")
# Shared tasks resolve "the current app" per thread, and a thread that did not create this app (a web server's
# request threads, Django's live server) would get Celery's fallback app and its default broker
# (amqp://localhost): as the default app, this one is found from every thread.
app.set_default()
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_ready.connect
def _announce(sender, **_):
    from django.db import close_old_connections

    from panel.hosts import heartbeat
    from panel.jobs import sweep

    sweep.sweep(sender.hostname)
    close_old_connections()
    heartbeat.start(sender)


@worker_shutdown.connect
def _farewell(sender, **_):
    from panel.hosts import heartbeat

    heartbeat.stop(sender)
