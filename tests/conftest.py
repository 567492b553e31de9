"""Test set-up: a private data dir, a private Redis (a real redis-server), a SQLite test database in a file
so that real worker processes share it, and fixtures that start real Celery workers. The plain helpers live in
tests/support/ (environment, waiting, workers)."""
import os
import signal
from pathlib import Path

import pytest

from tests.support.environment import DATA_DIR, REDIS_PORT, REDIS_URL
from tests.support.teams import teams_create
from tests.support.waiting import wait_until
from tests.support.workers import WorkerProcess


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


@pytest.fixture(scope="module")
def module_gateways(django_db_setup, django_db_blocker):
    """The gateway processes this module's tests share (tests/support/gateway_server.py, ModuleGateways)."""
    from django.db import connection

    from tests.support.gateway_server import ModuleGateways

    gateways = ModuleGateways(connection.settings_dict["NAME"])
    yield gateways
    gateways.stop()


@pytest.fixture
def team_setup(db):
    """Two teams; `alice` owns team A, `vera` is a viewer in A, `bob` owns team B."""
    return teams_create()


@pytest.fixture
def start_worker(transactional_db):
    """Start real workers for a test; they are stopped afterwards."""
    from django.db import connection

    started = []

    def start(kind="gpu", argv_prefix=(), **extra_env):
        worker = WorkerProcess(kind, connection.settings_dict["NAME"], extra_env, argv_prefix)
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
def shared_engine(tmp_path_factory):
    """This worker's one running tiny engine (tests/support/shared_engine.py), started at its first use."""
    from tests.support.shared_engine import SharedEngine

    engine = SharedEngine(tmp_path_factory.mktemp("shared-engine")).wait_ready()
    yield engine
    engine.stop()


@pytest.fixture
def shared_deployment(shared_engine, transactional_db):
    """`shared_deployment(team)`: a ready deployment of the team on the shared engine, with its local channel."""
    return shared_engine.deployment


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


def pytest_sessionstart(session):
    """Under pytest-xdist, the controller builds the run's demo model before it starts the workers, on every core
    (its training uses two threads): otherwise the first two workers to need it would wait on one another, one
    training on its single core (tests/settings.py pins each worker) while the other idled on the build's lock."""
    config = session.config
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return
    if "not engine" in (config.option.markexpr or ""):
        return
    import tempfile

    from panel.registry.demo_model import DemoModelError, build_demo_model

    try:
        with tempfile.TemporaryDirectory(prefix="demo-model-", dir=DATA_DIR) as scratch:
            build_demo_model(Path(scratch) / "tiny")
    except DemoModelError:
        pass  # no engine venv, or a failed build: the tests that need the model say so, each in its own words


def pytest_collection_modifyitems(session, config, items):
    """Mark every test by its fixtures (below), then put the files of engine tests first, the other slow or browser
    files next: xdist hands whole files to the workers in this order (`make test` turns off its own reordering),
    so the longest files start early and the many short ones even out the end of the run."""
    mark_by_fixtures(items)
    shared_engine_files_check(items)
    weight = {}
    for item in items:
        file = item.nodeid.split("::")[0]
        heavy = 0 if item.get_closest_marker("engine") else 1 if item.get_closest_marker("slow") else 2
        browser = 0 if item.get_closest_marker("browser") else 1
        weight[file] = min(weight.get(file, (2, 1)), (heavy, browser))
    items.sort(key=lambda item: weight[item.nodeid.split("::")[0]])
    listed = os.environ.get("TOKENWISE_ENGINE_FILES")
    if listed and hasattr(config, "workerinput"):  # every worker collects the same: the last write is as good
        engine = sorted(file for file, (heavy, _) in weight.items() if heavy == 0)
        scratch = Path(f"{listed}.{config.workerinput['workerid']}")
        scratch.write_text("\n".join(engine))
        scratch.replace(listed)


# Markers by the fixtures a test uses (its whole fixture closure), so that a new test is marked by what it needs:
# `make test-fast` runs `not engine and not browser`. A test that needs the engine venv without one of these
# fixtures (it starts a gpu worker, runs ENGINE_PYTHON or builds the demo model itself) carries the marker
# explicitly, as a module-level `pytestmark` or on the test; so does a test over ~20 s without the engine (`slow`).
# The demo model is built by the engine venv.
ENGINE_FIXTURES = {"launch_tiny", "shared_engine", "demo_model", "demo_model_path", "demo_model_cache"}
BROWSER_FIXTURES = {"page", "chromium"}  # tests/support/browser.py
SLOW_FIXTURES = {"launch_tiny"}  # an engine start, ~40 s


def mark_by_fixtures(items):
    for item in items:
        names = set(item.fixturenames)
        if names & ENGINE_FIXTURES:
            item.add_marker(pytest.mark.engine)
        if names & BROWSER_FIXTURES:
            item.add_marker(pytest.mark.browser)
        if names & SLOW_FIXTURES:
            item.add_marker(pytest.mark.slow)


def shared_engine_files_check(items):
    """A test on the shared engine lives in a file the scheduler below hands to one worker with the others."""
    from tests.support.shared_engine import SHARED_ENGINE_FILES

    stray = sorted({item.nodeid.split("::")[0] for item in items if "shared_engine" in item.fixturenames}
                   - set(SHARED_ENGINE_FILES))
    if stray:
        raise pytest.UsageError(f"{', '.join(stray)} use the shared engine: add them to SHARED_ENGINE_FILES "
                                "(tests/support/shared_engine.py)")


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with the files of the shared engine's tests as one unit: one worker starts that engine.
    Files of engine tests go only to the workers pinned to cores of their own (tests/settings.py); a worker past
    those takes the first file without engine tests, and waits idle when only engine files are left."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    from tests.settings import engine_workers
    from tests.support.shared_engine import SHARED_ENGINE_FILES

    count = config.getvalue("numprocesses")
    pinned = engine_workers(count if isinstance(count, int) else 1, len(os.sched_getaffinity(0)))

    class SharedEngineTogether(LoadFileScheduling):
        def _split_scope(self, nodeid):
            file = super()._split_scope(nodeid)
            return "shared-engine" if file in SHARED_ENGINE_FILES else file

        def _assign_work_unit(self, node):
            if int(node.workerinput["workerid"].removeprefix("gw")) >= pinned:
                engine = engine_files()
                light = next((scope for scope in self.workqueue
                              if scope not in engine and scope != "shared-engine"), None)
                if light is None:
                    return
                self.workqueue.move_to_end(light, last=False)
            super()._assign_work_unit(node)

    return SharedEngineTogether(config, log)


def engine_files():
    """The files holding engine tests, as the workers' collection wrote them (pytest_collection_modifyitems)."""
    path = os.environ.get("TOKENWISE_ENGINE_FILES")
    try:
        return set(Path(path).read_text().split()) if path else set()
    except OSError:
        return set()


def pytest_configure(config):
    """The controller of an xdist run names the file where the workers write which files hold engine tests."""
    if not hasattr(config, "workerinput") and "TOKENWISE_ENGINE_FILES" not in os.environ:
        os.environ["TOKENWISE_ENGINE_FILES"] = str(DATA_DIR / "engine-files.txt")


# One Chromium for the whole run: the fixtures live here, not in each browser test module, because a second
# session-scoped Playwright started by another module would find the first one's event loop running.
from tests.support.browser import chromium, page  # noqa: E402,F401

# The run's converted SmolLM2, made once per worker that needs it (tests/support/smollm2.py).
from tests.support.smollm2 import smollm2  # noqa: E402,F401
