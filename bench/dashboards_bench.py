"""Dashboard speed at scale (not a test; results in docs/benchmarks.md).

  .venv/bin/python bench/dashboards_bench.py --records 1000000 --database sqlite:////tmp/dash.sqlite3
  .venv/bin/python bench/dashboards_bench.py --records 1000000 --database postgres://postgres@127.0.0.1:5432/dashbench

1. Seeds N usage records over 30 days (`seed_usage`'s code) into an empty database, and 30 days of engine samples
   at 10 s for the seeded deployment (259,200 rows), unless the database already holds them (--reuse).
2. Times the rollup job over all of them (the first run after an upgrade), the compaction of the engine samples,
   and one steady-state rollup run after 10,000 new records (about ten seconds of traffic at 1,000 requests/s).
3. Starts the real web server (uvicorn on panel.asgi, as `make run` does), signs in over HTTP like a browser
   (login form, CSRF token, session cookie) and requests every dashboard endpoint (4 pages, their live JSON, a
   CSV per tab) for each range (1h, 24h, 7d, 30d) `--repeat` times over a keep-alive connection with a browser's
   headers, timing each from sending the request to the last byte of the answer. Meanwhile a writer adds usage
   records at `--write-rate` records/s (what the gateway writes under load) and the rollup job runs every 10 s
   (as beat runs it), so the reads meet concurrent writes. Prints p50/p95/p99 per endpoint (p95 of at least 100
   samples by default). Writes the numbers as JSON with --out."""
import argparse
import json
import os
import platform
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
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
                      SECRET_KEY=secrets.token_urlsafe(50), ALLOWED_HOSTS="127.0.0.1,testserver",
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
    import random
    from datetime import datetime, timedelta, timezone

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
    parser.add_argument("--repeat", type=int, default=100, help="timed requests per endpoint and range")
    parser.add_argument("--write-rate", type=int, default=200, help="usage records written per second meanwhile")
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

    pages = {"overview": "dashboards", "latency": "dashboards_latency", "cache": "dashboards_cache",
             "cost": "dashboards_cost"}
    csv_table = {"overview": "keys", "latency": "latency", "cache": "cache", "cost": "cost"}
    server, port = start_server()
    writer = Writer(team, rate=args.write_rate)
    timings = {}
    try:
        browser = Browser(port)
        browser.sign_in("bench", "bench-pw-123")
        writer.start()
        for range_ in ("1h", "24h", "7d", "30d"):
            for tab in TABS:
                endpoints = {f"page {tab}": (reverse(pages[tab]), {"range": range_}, "text/html"),
                             f"json {tab}": (reverse("dashboards_data"), {"tab": tab, "range": range_},
                                             "application/json"),
                             f"csv {tab}.{csv_table[tab]}": (reverse("dashboards_csv"),
                                                            {"tab": tab, "table": csv_table[tab], "range": range_},
                                                            "text/csv")}
                for name, (url, params, accept) in endpoints.items():
                    samples = []
                    for attempt in range(args.repeat + 1):
                        took = browser.get(url, params, accept=accept)
                        if attempt:  # the first request warms caches and connections
                            samples.append(took)
                    figures = {"p50": round(percentile(samples, 50), 1), "p95": round(percentile(samples, 95), 1),
                               "p99": round(percentile(samples, 99), 1), "samples": len(samples)}
                    timings[f"{name} {range_}"] = figures
                    print(f"  {name:24} {range_:>4}: p50 {figures['p50']:7.1f} ms  p95 {figures['p95']:7.1f} ms  "
                          f"p99 {figures['p99']:7.1f} ms", flush=True)
    finally:
        writer.stop()
        server.terminate()
        server.wait(timeout=20)
    result["http"] = {"server": "uvicorn panel.asgi:application --loop uvloop --http httptools (one process)",
                      "client": "HTTP/1.1 keep-alive, session cookie, browser headers, gzip accepted",
                      "concurrent_writes": {"records_per_s": args.write_rate, "written": writer.written,
                                            "rollup_runs": writer.rollups, "write_errors": writer.errors}}
    print(f"  meanwhile: {writer.written:,} records written, {writer.rollups} rollup runs, "
          f"{writer.errors} write errors", flush=True)
    result["timings_ms"] = timings
    result["worst_p95_ms"] = max(timing["p95"] for timing in timings.values())
    print(f"worst p95: {result['worst_p95_ms']} ms", flush=True)
    return result


def percentile(values, p):
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def start_server():
    """The panel's web server as `make run` starts it, in its own process, on a free port."""
    import http.client

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "uvicorn", "panel.asgi:application", "--host", "127.0.0.1",
                               "--port", str(port), "--loop", "uvloop", "--http", "httptools", "--no-access-log"],
                              cwd=ROOT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET", "/login/")
            connection.getresponse().read()
            return server, port
        except OSError:
            if server.poll() is not None:
                raise RuntimeError("the web server exited") from None
            time.sleep(0.3)
    server.kill()
    raise RuntimeError("the web server did not answer within 60 s")


class Browser:
    """One browser tab: a keep-alive HTTP/1.1 connection, its cookies, and the headers Chromium sends."""

    HEADERS = {"User-Agent": "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) "
                             "Chrome/120.0 Safari/537.36", "Accept-Encoding": "gzip, deflate, br",
               "Accept-Language": "en-US,en;q=0.9", "Connection": "keep-alive"}

    def __init__(self, port):
        import http.client

        self.port = port
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.cookies = {}

    def _send(self, method, path, *, body=None, headers=None):
        from http.cookies import SimpleCookie

        all_headers = dict(self.HEADERS, **(headers or {}))
        if self.cookies:
            all_headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        began = time.perf_counter()
        self.connection.request(method, path, body=body, headers=all_headers)
        response = self.connection.getresponse()
        data = response.read()
        took = (time.perf_counter() - began) * 1000
        for header in response.headers.get_all("Set-Cookie") or []:
            for name, morsel in SimpleCookie(header).items():
                self.cookies[name] = morsel.value
        return response, data, took

    def sign_in(self, username, password):
        import re
        from urllib.parse import urlencode

        response, page, _ = self._send("GET", "/login/", headers={"Accept": "text/html"})
        token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1).decode()
        body = urlencode({"csrfmiddlewaretoken": token, "username": username, "password": password})
        response, _, _ = self._send("POST", "/login/", body=body, headers={
            "Content-Type": "application/x-www-form-urlencoded", "Referer": f"http://127.0.0.1:{self.port}/login/",
            "Origin": f"http://127.0.0.1:{self.port}", "Accept": "text/html"})
        assert response.status == 302 and "sessionid" in self.cookies, (response.status, self.cookies)

    def get(self, path, params, *, accept):
        from urllib.parse import urlencode

        response, data, took = self._send("GET", f"{path}?{urlencode(params)}", headers={"Accept": accept})
        assert response.status == 200, (path, params, response.status, data[:300])
        return took


class Writer(threading.Thread):
    """What the gateway and beat do while people read the dashboards: usage records at `rate` per second, in
    batches every 0.5 s, and the rollup job every 10 s."""

    def __init__(self, team, *, rate):
        super().__init__(daemon=True)
        self.team, self.rate = team, rate
        self.halt = threading.Event()
        self.written = self.rollups = self.errors = 0

    def run(self):
        from django.db import close_old_connections

        from panel.dashboards.rollup import usage_rollup_run
        from panel.dashboards.seed import usage_seed

        last_rollup = time.monotonic()
        batch = max(self.rate // 2, 1)
        while not self.halt.wait(0.5):
            try:
                usage_seed(team=self.team, count=batch, seed=self.written + 7, days=1 / 86400)
                self.written += batch
                if time.monotonic() - last_rollup >= 10:
                    usage_rollup_run(lock=False)
                    self.rollups += 1
                    last_rollup = time.monotonic()
            except Exception as error:  # counted and reported; the reads go on
                self.errors += 1
                print(f"  writer: {type(error).__name__}: {error}", flush=True)
            finally:
                close_old_connections()

    def stop(self):
        self.halt.set()
        self.join(timeout=30)


if __name__ == "__main__":
    main()
