"""A private panel for a benchmark script (`python -m bench.x`), set up as the test run sets up its own: the test
settings (a fresh data dir), a private Redis, an SQLite file migrated here, the two teams of tests/support/teams.py,
and real Celery workers and a gateway under uvicorn on that database. Everything it started is stopped on the way
out, also after an error.

    with bench_panel() as panel:
        team = panel.teams["team_a"]
        panel.start_worker("gpu")
        gateway = panel.start_gateway()
"""
import contextlib
import os
import signal
import tempfile
from pathlib import Path


class BenchPanel:
    def __init__(self, database_path, data_dir, teams):
        self.database_path = database_path
        self.teams = teams
        self.tmp_path = Path(tempfile.mkdtemp(prefix="bench-", dir=data_dir))
        self._started = []

    def start_worker(self, kind="gpu", **extra_env):
        """A real worker (`python -m workers.start KIND`) on this panel's database, once it is ready."""
        from tests.support.workers import WorkerProcess

        worker = WorkerProcess(kind, self.database_path, extra_env)
        self._started.append(worker)
        return worker.wait_ready()

    def start_gateway(self, **env_changes):
        """The panel under uvicorn (pages and the gateway at /v1) on this panel's database."""
        from tests.support.gateway_server import GatewayServer

        server = GatewayServer(self.database_path, **env_changes)
        self._started.append(server)
        return server

    def stop(self):
        for process in reversed(self._started):
            process.stop()
        self._started.clear()


def django_setup():
    """Django on the test settings; a script calls it before it imports the panel's models."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()


@contextlib.contextmanager
def bench_panel():
    django_setup()
    from django.core.management import call_command
    from django.db import connection

    from panel.launcher import start_redis
    from tests.support.environment import DATA_DIR, REDIS_PORT
    from tests.support.teams import teams_create

    redis = start_redis(port=REDIS_PORT, data_dir=DATA_DIR / "redis", log_path=DATA_DIR / "redis.log")
    panel = None
    try:
        call_command("migrate", verbosity=0)
        panel = BenchPanel(connection.settings_dict["NAME"], DATA_DIR, teams_create())
        yield panel
    finally:
        if panel is not None:
            panel.stop()
        os.killpg(redis.pid, signal.SIGKILL)
        redis.wait()
