"""Start a Tokenwise Celery process: `python -m workers.start default|long|gpu|beat`.

default: short periodic tasks (the reaper, scraping, rollups, canary checks, budgets, webhooks).
long:    work a member starts that runs for minutes or hours (evaluation runs, benchmarks, ladders, sweeps), 2 at a
         time unless TOKENWISE_LONG_CONCURRENCY says otherwise; never in front of the periodic tasks.
gpu:     quantization jobs and vLLM deployments; listens on `gpu` and on `gpu.<host>`, one job at a time
         (3 slots unless TOKENWISE_GPU_CONCURRENCY says otherwise;
         a deployment holds one for its life).
beat:    the schedule."""
import os
import sys


def argv_for(kind):
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "panel.settings")
    from django.conf import settings

    from panel.env import envint

    if kind == "default":
        concurrency = envint("TOKENWISE_WORKER_CONCURRENCY", 2, minimum=1)
        return ["worker", "-n", f"default@{settings.HOST_NAME}", "-Q", "default", "-c", str(concurrency),
                "--without-gossip", "--without-mingle", "-l", "INFO"]
    if kind == "long":
        concurrency = envint("TOKENWISE_LONG_CONCURRENCY", 2, minimum=1)
        return ["worker", "-n", f"long@{settings.HOST_NAME}", "-Q", "long", "-c", str(concurrency),
                "--without-gossip", "--without-mingle", "-l", "INFO"]
    if kind == "gpu":
        # Each deployment holds a slot for as long as its engine runs; jobs take the others.
        concurrency = envint("TOKENWISE_GPU_CONCURRENCY", 3, minimum=1)
        queues = f"gpu,gpu.{settings.HOST_NAME}"
        return ["worker", "-n", f"gpu@{settings.HOST_NAME}", "-Q", queues, "-c", str(concurrency),
                "--without-gossip", "--without-mingle", "-l", "INFO"]
    if kind == "beat":
        schedule = settings.DATA_DIR / "celerybeat-schedule"
        return ["beat", "-s", str(schedule), "-l", "INFO"]
    raise SystemExit(f"usage: python -m workers.start default|long|gpu|beat (got {kind!r})")


def main():
    from panel.env import EnvError

    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m workers.start default|long|gpu|beat")
    try:
        arguments = argv_for(sys.argv[1])
    except EnvError as error:
        raise SystemExit(f"tokenwise: configuration error: {error}") from None
    from workers.celery import app

    app.start(argv=arguments)


if __name__ == "__main__":
    main()
