"""Test set-up: a private data dir, a private Redis (a real redis-server), a SQLite test database in a file
so that real worker processes share it, and helpers to start real Celery workers."""
import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = Path(os.environ["TOKENWISE_DATA_DIR"])
REDIS_URL = os.environ["REDIS_URL"]
REDIS_PORT = int(REDIS_URL.rsplit(":", 1)[1].split("/")[0])


def panel_env(**changes):
    """The environment for a subprocess of the panel (manage.py, a worker): the real settings module."""
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="panel.settings", PYTHONUNBUFFERED="1")
    env.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


@pytest.fixture(scope="session", autouse=True)
def redis_server():
    from panel.launcher import start_redis

    process = start_redis(port=REDIS_PORT, data_dir=DATA_DIR / "redis", log_path=DATA_DIR / "redis.log")
    yield process
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.fixture(autouse=True)
def _clean_redis(redis_server):
    import redis

    redis.Redis.from_url(REDIS_URL).flushdb()


@pytest.fixture
def team_setup(db, django_user_model):
    """Two teams; `alice` owns team A, `vera` is a viewer in A, `bob` owns team B."""
    from panel.accounts.models import Role
    from panel.accounts.services import membership_add, team_create

    alice = django_user_model.objects.create_user("alice", password="pw-alice-123")
    bob = django_user_model.objects.create_user("bob", password="pw-bob-123")
    vera = django_user_model.objects.create_user("vera", password="pw-vera-123")
    team_a = team_create(name="Team A", owner=alice)
    team_b = team_create(name="Team B", owner=bob)
    membership_add(team=team_a, user=vera, role=Role.VIEWER)
    return {"alice": alice, "bob": bob, "vera": vera, "team_a": team_a, "team_b": team_b}


class WorkerProcess:
    """A real Celery worker (`python -m workers.start KIND`) against the test database and Redis."""

    def __init__(self, kind, database_path, extra_env=None):
        self.kind = kind
        self.log_path = DATA_DIR / f"worker-{kind}-{time.monotonic_ns()}.log"
        env = panel_env(DATABASE_URL=f"sqlite:///{database_path}", **(extra_env or {}))
        self.log_file = open(self.log_path, "wb")
        self.process = subprocess.Popen([sys.executable, "-m", "workers.start", kind], cwd=ROOT, env=env,
                                        stdout=self.log_file, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, seconds=60):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"worker exited early:\n{self.log()}")
            if (b"beat: Starting" if self.kind == "beat" else b"ready.") in self.log_path.read_bytes():
                return self
            time.sleep(0.2)
        raise AssertionError(f"worker not ready after {seconds} s:\n{self.log()}")

    def log(self):
        return self.log_path.read_text(errors="replace")[-4000:]

    def child_pids(self):
        import psutil

        try:
            return [child.pid for child in psutil.Process(self.process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill(self):
        """SIGKILL the whole worker (main process and pool children), as a lost host would."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log_file.close()


@pytest.fixture
def start_worker(transactional_db):
    """Start real workers for a test; they are stopped afterwards."""
    from django.db import connection

    started = []

    def start(kind="gpu", **extra_env):
        worker = WorkerProcess(kind, connection.settings_dict["NAME"], extra_env)
        started.append(worker)
        return worker.wait_ready()

    yield start
    if started:
        stop_deployments()
    for worker in started:
        worker.stop()


def stop_deployments(seconds=60):
    """Stop every deployment a test left running, as a user would, before its workers are stopped: a worker that is
    told to shut down waits for its running tasks, and a deployment's task runs as long as its engine (20 s of grace
    per worker, then a kill, on every engine test's teardown)."""
    from panel.serving.models import Deployment
    from panel.serving.services import deployment_stop

    for deployment in Deployment.objects.filter(state__in=list(Deployment.ACTIVE_STATES)):
        deployment_stop(deployment=deployment, reason="the test ended")
    try:
        wait_until(lambda: not Deployment.objects.filter(state__in=list(Deployment.LIVE_STATES)).exists(),
                   seconds=seconds, interval=0.2, message="the test's deployments to stop")
    except AssertionError:
        pass  # a worker that is already gone: stopping it below ends what is left


@pytest.fixture
def launch_tiny(start_worker, tmp_path):
    """Start the tiny demo model on the real CPU engine for a team, through a real gpu worker, and wait until the
    deployment is ready (~40 s). Profile fields can be overridden: launch_tiny(team, enable_prefix_caching=True)."""
    from panel.hosts.models import WorkerHost
    from panel.registry.demo_model import build_demo_model
    from panel.registry.services import model_register
    from panel.serving.models import Deployment, DeploymentState, ServingProfile
    from panel.serving.services import deployment_launch

    def launch(team, **profile_fields):
        path = tmp_path / "tiny"
        build_demo_model(path)
        model = model_register(team=team, user=None, source=str(path), name="tiny")
        fields = dict(name="tiny-cpu", served_model_name="tiny-chat", max_model_len=2048, block_size=32,
                      max_num_seqs=8, max_num_batched_tokens=2048, extra_args="--enforce-eager")
        profile = ServingProfile.objects.create(team=team, model=model, **{**fields, **profile_fields})
        start_worker("gpu")
        wait_until(lambda: WorkerHost.objects.filter(kind="gpu", last_seen__isnull=False).exists(), message="worker")
        launched = deployment_launch(team=team, user=None, profile=profile)
        wait_until(lambda: Deployment.objects.get(pk=launched.pk).state in (DeploymentState.READY,
                                                                            DeploymentState.FAILED),
                   seconds=240, interval=0.5, message="the deployment")
        launched.refresh_from_db()
        assert launched.state == DeploymentState.READY, launched.failure_reason
        return launched

    return launch


@pytest.fixture(scope="session")
def demo_model_cache():
    """The run's one trained build of the demo model (panel/registry/demo_model.py caches it under the data dir);
    `seed(data_dir)` copies it into another data dir's cache, so a process started on that dir (the launcher) copies
    it instead of training it again (about 100 s on these machines)."""
    import shutil
    import tempfile

    from panel.registry.demo_model import build_demo_model, cache_path

    with tempfile.TemporaryDirectory(prefix="demo-model-", dir=DATA_DIR) as scratch:
        build_demo_model(Path(scratch) / "tiny")
    cached = cache_path()

    def seed(data_dir):
        target = Path(data_dir) / "cache" / cached.name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(cached, target)
        return target

    return seed


def bind_credential_env(monkeypatch, variable, *urls, teams=()):
    """Bind an environment variable to the origins of `urls` (and to `teams`' slugs) for one test, as the operator's
    TOKENWISE_CREDENTIAL_ENV_BINDINGS does."""
    from django.conf import settings

    from panel.env import CredentialBinding, url_origin

    binding = CredentialBinding(origins=frozenset(url_origin(url) for url in urls), teams=frozenset(teams))
    monkeypatch.setattr(settings, "CREDENTIAL_ENV_BINDINGS", {**settings.CREDENTIAL_ENV_BINDINGS, variable: binding})


def wait_until(predicate, *, seconds=30, interval=0.2, message="condition"):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {seconds} s waiting for {message}")


def run_coroutine(coroutine):
    """asyncio.run in a thread of its own: the session's Playwright (tests/browser.py) keeps an event loop running in
    the main thread once a browser test has run, and asyncio.run refuses to start beside it."""
    outcome = {}

    def run():
        try:
            outcome["value"] = asyncio.run(coroutine)
        except BaseException as error:  # re-raised in the test's thread
            outcome["error"] = error

    worker = threading.Thread(target=run, name="test-coroutine")
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


# One Chromium for the whole run: the fixtures live here, not in each browser test module, because a second
# session-scoped Playwright started by another module would find the first one's event loop running.
from tests.browser import chromium, page  # noqa: E402,F401
