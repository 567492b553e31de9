"""The web server, as `make run` and compose start it: uvicorn serving the panel and the gateway (panel.asgi) in
TOKENWISE_WEB_PROCESSES processes, by default one per core this process may run on but one (at least one): the
Celery workers, Redis and the database that `make run` starts beside it need a core, and on a 2-core host one web
process served as many streams as two at a third less CPU per request (docs/benchmarks.md, issue 50).

Every process serves every path; what a process keeps for itself is either shared through Redis or safe to keep
per process (docs/ARCHITECTURE.md, "Several web processes"). The Prometheus counters are the one thing that needs
the processes' help: each writes its own into PROMETHEUS_MULTIPROC_DIR and /metrics adds them up, so a scrape
sees the whole server whichever process answers it. The folder is emptied at every start (the counters of a
previous run are not this run's).

    python -m panel.web --host 127.0.0.1 --port 8000 [more uvicorn options]"""
import os
import shutil
import sys
from pathlib import Path

from panel.env import EnvError, envint

BASE_DIR = Path(__file__).resolve().parent.parent


def default_processes():
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores - 1)


def metrics_dir():
    named = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if named:
        return Path(named)
    return Path(os.environ.get("TOKENWISE_DATA_DIR") or BASE_DIR / "data") / "prometheus"


def command(options):
    """The uvicorn command line for the web server, and the environment it needs."""
    processes = envint("TOKENWISE_WEB_PROCESSES", default_processes(), minimum=1, maximum=64)
    folder = metrics_dir()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(folder))
    argv = [sys.executable, "-m", "uvicorn", "panel.asgi:application", "--workers", str(processes), "--loop",
            "uvloop", "--http", "httptools", "--no-access-log", "--timeout-graceful-shutdown", "5", *options]
    return argv, env


def main():
    try:
        argv, env = command(sys.argv[1:])
    except EnvError as error:
        sys.exit(f"tokenwise: configuration error: {error}")
    os.execve(argv[0], argv, env)


if __name__ == "__main__":
    main()
