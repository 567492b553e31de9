"""The gateway's TTFT while webhooks fail (not a test; results in docs/benchmarks.md).

  .venv/bin/python bench/webhook_ttft_bench.py [--requests 2000]

The route `chat` has two channels: `flaky` first (a closed port: every try fails at once) and `fake` (the fake
streaming upstream). So the gateway keeps cooling `flaky` down (every 30 s, once it has rested) and announces it,
and with TOKENWISE_WEBHOOK_COOLDOWN_REPEAT_SECONDS=1 every cooldown is an event. TTFT at concurrency 1 (p50/p95,
after 20 warm-up requests) is measured twice against the same gateway process:
1. no webhook;
2. three webhooks that want every event, one receiver down (a closed port), one that answers after 10 s, one that
   answers 500, with a real worker delivering (and retrying, 1 s backoff) meanwhile; after `flaky`'s first cooldown
   ran out, so a new cooldown and its event fall inside the measurement.
Then the cost of `channel_cooled_down` itself, the one call the gateway makes (per call, in this process)."""
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.gateway_bench import BODY, free_port, prepare_panel, start, stop, ttft  # noqa: E402
from tests.support.fake_upstream import closed_port  # noqa: E402
from tests.support.webhook_receiver import Receiver  # noqa: E402


def shell(env, code):
    import subprocess

    return subprocess.run([sys.executable, "manage.py", "shell", "-c", code], cwd=ROOT, env=env, check=True,
                          capture_output=True, text=True).stdout.strip().splitlines()[-1]


def main():
    requests = int(sys.argv[sys.argv.index("--requests") + 1]) if "--requests" in sys.argv else 2000
    results = {}
    up_port, gw_port, redis_port = free_port(), free_port(), free_port()
    from panel.launcher import start_redis

    data_dir = Path(tempfile.mkdtemp(prefix="tokenwise-webhook-bench-"))
    redis = start_redis(port=redis_port, data_dir=data_dir / "redis")
    os.environ["REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
    upstream = start([sys.executable, "-m", "tests.support.fake_upstream", "--port", str(up_port), "--chunks", "20",
                      "--model", "fake-model"], ready_url=f"http://127.0.0.1:{up_port}/v1/models")
    env, key = prepare_panel(data_dir, f"http://127.0.0.1:{up_port}/v1")
    env.update(TOKENWISE_WEBHOOK_COOLDOWN_REPEAT_SECONDS="1", TOKENWISE_WEBHOOK_TIMEOUT_SECONDS="10")
    shell(env, f"""
from panel.channels.models import Channel, Route, RouteChannel
route = Route.objects.get(model_name="chat")
flaky = Channel.objects.create(team=route.team, name="flaky", kind="remote",
                               base_url="http://127.0.0.1:{closed_port()}/v1", model_id="m", credential_kind="none",
                               max_retries=0, timeout_seconds=5)
RouteChannel.objects.filter(route=route).update(position=2)
RouteChannel.objects.create(route=route, channel=flaky, position=1)
print("ok")""")
    gateway = start([sys.executable, "-m", "uvicorn", "panel.asgi:application", "--port", str(gw_port), "--loop",
                     "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"], env=env,
                    ready_url=f"http://127.0.0.1:{gw_port}/login/")
    url, auth = f"http://127.0.0.1:{gw_port}/v1/chat/completions", {"Authorization": f"Bearer {key}"}
    BODY["model"] = "chat"
    worker = None
    try:
        results["no_webhooks"] = ttft(url, auth, requests)
        with Receiver() as slow, Receiver() as failing:
            slow.plan = [("sleep", 10)] * 1000
            failing.plan = [("status", 500)] * 1000
            shell(env, f"""
from panel.accounts.models import Team
from panel.notifications.services import webhook_create
team = Team.objects.get(name="bench")
for name, url in (("down", "http://127.0.0.1:{closed_port()}/hook"), ("slow", {slow.url!r}),
                  ("failing", {failing.url!r})):
    webhook_create(team=team, name=name, url=url)
print("ok")""")
            worker = start([sys.executable, "-m", "workers.start", "default"], env=dict(
                env, TOKENWISE_WEBHOOK_BACKOFF_SECONDS="1"))
            # Let the cooldown that began in part 1 run out, so the first requests of part 2 fail on `flaky` again,
            # cool it down again and raise an event whose deliveries (and their retries) run during the measurement.
            time.sleep(32)
            results["failing_webhooks"] = ttft(url, auth, requests)
            counts = shell(env, """
from panel.notifications.models import Delivery, DeliveryAttempt, Notification
print(Notification.objects.count(), Delivery.objects.count(), DeliveryAttempt.objects.count())""")
            results["events_deliveries_attempts"] = [int(n) for n in counts.split()]
            results["slow_and_failing_received"] = [len(slow.received), len(failing.received)]
    finally:
        if worker is not None:
            stop(worker)
        stop(gateway)
        stop(upstream)
    os.environ.update(env)
    import django

    django.setup()
    from panel.notifications.cooldown import channel_cooled_down

    calls = 100_000
    began = time.perf_counter()
    for _ in range(calls):
        channel_cooled_down(team_id=1, channel_id=1, channel_name="flaky", failures=3, seconds=30)
    results["channel_cooled_down_us_per_call"] = round((time.perf_counter() - began) / calls * 1e6, 2)
    redis.kill()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
