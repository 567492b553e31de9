"""Settings for the test run: the environment a test run needs, then the real settings module.

Values are set with setdefault, so a subprocess that inherits this environment sees the same ones."""
import os
import secrets
import socket
import tempfile


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


for _name in ("DATABASE_URL", "ENGINE_PYTHON"):
    if "TOKENWISE_TEST_RUN" not in os.environ:
        os.environ.pop(_name, None)
os.environ.setdefault("TOKENWISE_TEST_RUN", "1")


def _own_slot_for_this_xdist_worker():
    """Under pytest-xdist (`make test` runs two workers), each worker process gets its own data dir (so its own
    SQLite test database), Redis and panel port; the demo model's cache stays the run's one (built under a lock,
    panel/registry/demo_model.py). A subprocess of a worker (a Celery worker, manage.py) inherits the slot."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker or os.environ.get("TOKENWISE_TEST_SLOT") == worker or "TOKENWISE_DATA_DIR" not in os.environ:
        return
    shared_cache = os.path.join(os.environ["TOKENWISE_DATA_DIR"], "cache")
    os.makedirs(shared_cache, exist_ok=True)
    data_dir = tempfile.mkdtemp(prefix=f"tokenwise-test-{worker}-")
    os.symlink(shared_cache, os.path.join(data_dir, "cache"))
    os.environ.update(TOKENWISE_TEST_SLOT=worker, TOKENWISE_DATA_DIR=data_dir,
                      REDIS_URL=f"redis://127.0.0.1:{_free_port()}/0", TOKENWISE_PORT=str(_free_port()))
    _own_cores(int(worker.removeprefix("gw")), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


def _own_cores(index, count):
    """The first workers, one per core at most (`engine_workers`), each run with everything they start (engines,
    Celery workers, Chromium inherit the affinity) on their own share of the cores, and a vLLM engine binds its
    OpenMP threads to that share: two engines on two cores then take about as long side by side as one alone, where
    unpinned their spinning threads slowed each other many-fold (docs/benchmarks.md). A worker past those runs on
    every core and gets no file of engine tests (tests/conftest.py): the files it runs mostly wait (on timeouts,
    worker starts, a browser), and it fills the cores the engine workers leave idle."""
    cores = sorted(os.sched_getaffinity(0))
    workers = engine_workers(count, len(cores))
    if workers < 2 or index >= workers:
        return
    share = len(cores) // workers
    mine = cores[index * share:(index + 1) * share]
    os.sched_setaffinity(0, mine)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, mine))


def engine_workers(count, cores):
    """How many of `count` xdist workers run files of engine tests: one per core at most."""
    return min(count, cores)


_own_slot_for_this_xdist_worker()
os.environ.setdefault("DEBUG", "0")
os.environ.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
os.environ.setdefault("TOKENWISE_DATA_DIR", tempfile.mkdtemp(prefix="tokenwise-test-"))
os.environ.setdefault("REDIS_URL", f"redis://127.0.0.1:{_free_port()}/0")
os.environ.setdefault("TOKENWISE_HOST_NAME", "testhost")
os.environ.setdefault("TOKENWISE_ENCRYPTION_KEYS", "uoCEune358PVvLlqWgU70DAPPWRL6mXgdqx-IrL8uVg=")  # fixed test key
os.environ.setdefault("TOKENWISE_HOST_HEARTBEAT_SECONDS", "1")
os.environ.setdefault("TOKENWISE_JOB_HEARTBEAT_SECONDS", "1")
# The suite's fake providers listen on 127.0.0.1; the panel under test is not at the default port 8000, which the
# tests use as an engine's address. The outbound policy's tests set these back to the strict defaults.
os.environ.setdefault("TOKENWISE_OUTBOUND_ALLOW", "127.0.0.0/8")
os.environ.setdefault("TOKENWISE_PORT", str(_free_port()))
os.environ.setdefault("TOKENWISE_MODEL_ROOTS", tempfile.gettempdir())  # tests build models in tmp_path
# No starter model by default: a test that bootstraps would queue a pip fetch; its own tests turn it on.
os.environ.setdefault("TOKENWISE_STARTER_MODEL", "")
os.environ.setdefault("ALLOWED_HOSTS", "127.0.0.1,localhost,testserver")
# Tests read the panel's /metrics without a token; the tests of the token set this back
# (tests/system/test_security_low.py).
os.environ.setdefault("TOKENWISE_METRICS_PUBLIC", "1")
# Playwright's sync API runs an event loop in the test thread; the ORM calls made by fixtures are safe.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

from panel.settings import *  # noqa: E402,F401,F403
