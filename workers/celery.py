"""The Celery app. Workers start through `python -m workers.start {default,gpu,beat}`; Celery's Django fixup
sets Django up in each worker process."""
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
app.conf.include = ["workers.tasks", "panel.dashboards.tasks", "panel.benchmarks.tasks", "panel.advisor.tasks",
                    "panel.budgets.tasks", "panel.compare.tasks"]


@worker_ready.connect
def _announce(sender, **_):
    from django.db import close_old_connections

    from workers import heartbeat, sweep

    sweep.sweep(sender.hostname)
    close_old_connections()
    heartbeat.start(sender)


@worker_shutdown.connect
def _farewell(sender, **_):
    from workers import heartbeat

    heartbeat.stop(sender)
