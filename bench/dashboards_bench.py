"""Dashboard speed at scale (not a test; results in docs/benchmarks.md).

  .venv/bin/python bench/dashboards_bench.py --records 1000000 --database sqlite:////tmp/dash.sqlite3
  .venv/bin/python bench/dashboards_bench.py --records 1000000 --database postgres://postgres@127.0.0.1:5432/dashbench

1. Seeds N usage records over 30 days (`seed_usage`'s code) into an empty database, and 30 days of engine samples
   at 10 s for the seeded deployment (259,200 rows), unless the database already holds them (--reuse).
2. Times the rollup job over all of them (the first run after an upgrade), the compaction of the engine samples,
   and one steady-state rollup run after 10,000 new records (about ten seconds of traffic at 1,000 requests/s).
3. Requests every dashboard endpoint (4 pages, their JSON, a CSV per tab) for each range (1h, 24h, 7d, 30d)
   `--repeat` times through Django's test client (middleware, session, view, template: the server-side time)
   and prints p50/p95 per endpoint. Writes the numbers as JSON with --out."""
import argparse
import json
import os
import platform
import secrets
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def setup(database):
    data_dir = tempfile.mkdtemp(prefix="dashbench-")
    os.environ.update(DATABASE_URL=database, TOKENWISE_DATA_DIR=data_dir, DEBUG="0",
                      SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="testserver",
                      TOKENWISE_ENCRYPTION_KEYS="uoCEune358PVvLlqWgU70DAPPWRL6mXgdqx-IrL8uVg=",
                      DJANGO_SETTINGS_MODULE="panel.settings")
    port = free_port()
    os.environ["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
    from panel.launcher import start_redis

    redis = start_redis(port=port, data_dir=Path(data_dir) / "redis")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return redis


def seed_engine(deployment, *, days=30, every=10):
    """Raw scrapes as the scraper would have stored them, before compaction."""
    from datetime import datetime, timedelta, timezone
    import random

    from panel.dashboards.models import EngineSample

    rng = random.Random(3)
    now = datetime.now(timezone.utc)
    count = days * 86400 // every
    batch = []
    for i in range(count):
        queries = rng.randint(2000, 9000)
        fast = rng.randint(0, 8)
        batch.append(EngineSample(
            deployment=deployment, team_id=deployment.team_id, at=now - timedelta(seconds=every * i), seconds=every,
            prefix_queries=queries, prefix_hits=int(queries * rng.uniform(0.3, 0.7)), prompt_tokens=queries,
            generation_tokens=rng.randint(200, 2000), kv_cache_usage=rng.uniform(0.1, 0.6), running=rng.randint(0, 8),
            waiting=rng.randint(0, 2), ttft={"le": {"0.05": fast, "0.1": fast + 3, "0.25": fast + 6, "+Inf": fast + 7},
                                              "count": fast + 7, "sum": 0.08 * (fast + 7)},
            itl={"le": {"0.01": 40, "0.025": 90, "+Inf": 100}, "count": 100, "sum": 1.5}))
        if len(batch) == 5000:
            EngineSample.objects.bulk_create(batch)
            batch = []
    EngineSample.objects.bulk_create(batch)
    return count


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--database", required=True)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--reuse", action="store_true", help="keep what the database holds")
    parser.add_argument("--sql-seed", action="store_true",
                        help="generate the records inside the database (minutes for 10 M instead of half an hour)")
    parser.add_argument("--out")
    args = parser.parse_args()
    redis = setup(args.database)
    try:
        result = run(args)
    finally:
        redis.kill()
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


def run(args):
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.urls import reverse

    from panel.accounts.models import Team
    from panel.accounts.services import team_create
    from panel.dashboards.compaction import engine_samples_compact
    from panel.dashboards.models import EngineSample, UsageRollup
    from panel.dashboards.pages import TABS
    from panel.dashboards.rollup import usage_rollup_run
    from panel.dashboards.seed import usage_seed, usage_seed_fixtures, usage_seed_sql
    from panel.usage.models import RequestLog

    result = {"machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
                         f"Python {platform.python_version()}", "database": connection.vendor,
              "records": args.records}
    user = get_user_model().objects.filter(username="bench").first() or \
        get_user_model().objects.create_user("bench", password="bench-pw-123")
    team = Team.objects.filter(name="Bench").first() or team_create(name="Bench", owner=user)
    if not (args.reuse and RequestLog.objects.exists()):
        began = time.monotonic()
        seed = usage_seed_sql if args.sql_seed else usage_seed
        result["seed"] = "SQL INSERT ... SELECT" if args.sql_seed else "ORM bulk_create"
        seed(team=team, count=args.records, on_progress=lambda done: done % 200_000 == 0 and print(
            f"  seeded {done:,} in {time.monotonic() - began:.0f} s", flush=True))
        result["seed_seconds"] = round(time.monotonic() - began, 1)
        local, _, _ = usage_seed_fixtures(team=team)
        began = time.monotonic()
        result["engine_samples_raw"] = seed_engine(local.deployment)
        result["engine_seed_seconds"] = round(time.monotonic() - began, 1)
        began = time.monotonic()
        read = usage_rollup_run(lock=False)
        result["rollup_full"] = {"records": read, "seconds": round(time.monotonic() - began, 1)}
        began = time.monotonic()
        engine_samples_compact()
        result["compaction_seconds"] = round(time.monotonic() - began, 1)
        print(f"  rollup of {read:,} records: {result['rollup_full']['seconds']} s; compaction "
              f"{result['compaction_seconds']} s", flush=True)
    # Steady state: ten seconds of traffic at 1,000 requests/s arrive, then the rollup job runs once.
    usage_seed(team=team, count=10_000, seed=int(time.time()), days=10 / 86400)
    began = time.monotonic()
    read = usage_rollup_run(lock=False)
    result["rollup_incremental"] = {"records": read, "seconds": round(time.monotonic() - began, 2)}
    result["rollup_rows"] = UsageRollup.objects.count()
    result["engine_samples"] = EngineSample.objects.count()
    result["request_logs"] = RequestLog.objects.count()
    print(f"  incremental rollup of {read:,} records: {result['rollup_incremental']['seconds']} s; "
          f"{result['rollup_rows']:,} rollup rows, {result['engine_samples']:,} engine samples, "
          f"{result['request_logs']:,} records", flush=True)

    client = Client()
    client.force_login(user)
    pages = {"overview": "dashboards", "latency": "dashboards_latency", "cache": "dashboards_cache",
             "cost": "dashboards_cost"}
    csv_table = {"overview": "keys", "latency": "latency", "cache": "cache", "cost": "cost"}
    timings = {}
    for range_ in ("1h", "24h", "7d", "30d"):
        for tab in TABS:
            endpoints = {f"page {tab}": (reverse(pages[tab]), {"range": range_}),
                         f"json {tab}": (reverse("dashboards_data"), {"tab": tab, "range": range_}),
                         f"csv {tab}.{csv_table[tab]}": (reverse("dashboards_csv"),
                                                        {"tab": tab, "table": csv_table[tab], "range": range_})}
            for name, (url, params) in endpoints.items():
                samples = []
                for attempt in range(args.repeat + 1):
                    began = time.perf_counter()
                    response = client.get(url, params)
                    took = (time.perf_counter() - began) * 1000
                    assert response.status_code == 200, (name, response.status_code, response.content[:300])
                    if attempt:  # the first request warms caches and connections
                        samples.append(took)
                samples.sort()
                p95 = samples[min(len(samples) - 1, int(round(0.95 * (len(samples) - 1))))]
                timings[f"{name} {range_}"] = {"p50": round(statistics.median(samples), 1), "p95": round(p95, 1)}
                print(f"  {name:24} {range_:>4}: p50 {statistics.median(samples):7.1f} ms  p95 {p95:7.1f} ms",
                      flush=True)
    result["timings_ms"] = timings
    result["worst_p95_ms"] = max(timing["p95"] for timing in timings.values())
    print(f"worst p95: {result['worst_p95_ms']} ms", flush=True)
    return result


if __name__ == "__main__":
    main()
