"""A task sent from any thread goes to the configured broker. Shared tasks resolve "the current app" per thread; a
web server's request threads did not create the Celery app, so they get Celery's default app, and if anything asked
for the current app before `workers.celery` was imported, that default is Celery's fallback app with its broker
amqp://localhost (on a machine running RabbitMQ the message even vanishes there without an error)."""
import subprocess
import sys

from tests.support.environment import ROOT, panel_env

PROBE = """
import threading
import celery
import django

celery.current_app.conf  # something asks for the current app before the panel's app exists
django.setup()
from panel.benchmarks import tasks as benchmark_tasks
from panel.hosts import tasks
from workers.celery import app

seen = {}

def probe():
    seen["engine_check"] = tasks.run_engine_check.app.main
    seen["benchmark"] = benchmark_tasks.run_benchmark.app.main
    seen["broker"] = tasks.run_engine_check.app.conf.broker_url

thread = threading.Thread(target=probe)
thread.start()
thread.join()
print(seen["engine_check"], seen["benchmark"], seen["broker"])
"""


def test_it_resolves_every_task_to_the_tokenwise_app_from_another_thread():
    from django.conf import settings

    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=panel_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["tokenwise", "tokenwise", settings.CELERY_BROKER_URL]


def test_it_sends_long_work_to_the_long_worker_and_keeps_default_for_the_periodic_tasks():
    from django.conf import settings

    from workers.celery import app
    from workers.start import argv_for

    def routed(task):
        return app.amqp.router.route({}, task)["queue"].name

    assert {routed(entry["task"]) for entry in settings.CELERY_BEAT_SCHEDULE.values()} == {"default"}
    for task in ("panel.evaluations.tasks.run_evaluation", "panel.benchmarks.tasks.run_benchmark",
                 "panel.benchmarks.tasks.run_ladder", "panel.benchmarks.tasks.run_sweep"):
        assert routed(task) == "long", task
    default, long = argv_for("default"), argv_for("long")
    assert default[default.index("-Q") + 1] == "default" and long[long.index("-Q") + 1] == "long"
    assert long[long.index("-n") + 1] == f"long@{settings.HOST_NAME}"
