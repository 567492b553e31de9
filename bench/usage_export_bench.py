"""The API's usage export at scale (not a test; results in docs/benchmarks.md).

  .venv/bin/python bench/usage_export_bench.py --records 10000000 --database sqlite:////tmp/usage10m.sqlite3
  .venv/bin/python bench/usage_export_bench.py --records 10000000 --database postgres://postgres@127.0.0.1/usagebench

Seeds N usage records over 30 days for one team (`seed_usage`'s SQL seeding, `--reuse` keeps them), then times
GET /api/v1/usage through Django's test client with a personal access token (authentication, the role check, the
query, serialisation: the server-side time) for: the first page, a page half way through (by its cursor), the last
page, the first page of a one-hour window in the middle of the month, a page filtered by one key and by one model,
and walking 50 consecutive pages. p50/p95 over --repeat requests each, 1,000 records a page."""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.dashboards_bench import setup  # noqa: E402


def timed(client, url, headers, repeat):
    times, answer = [], None
    for _ in range(repeat):
        began = time.perf_counter()
        answer = client.get(url, **headers)
        times.append((time.perf_counter() - began) * 1000)
        assert answer.status_code == 200, answer.content[:500]
    times.sort()
    return {"p50_ms": round(statistics.median(times), 1), "p95_ms": round(times[int(0.95 * (len(times) - 1))], 1),
            "items": len(answer.json()["items"])}, answer.json()


def run(args):
    from datetime import datetime, timedelta, timezone
    from urllib.parse import urlencode

    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client

    from panel.accounts.models import Membership, Team, TeamKey
    from panel.accounts.services import team_create
    from panel.accounts.tokens import token_issue
    from panel.api.usage import cursor_encode
    from panel.dashboards.seed import usage_seed_sql
    from panel.usage.models import RequestLog

    user = get_user_model().objects.filter(username="bench").first() or \
        get_user_model().objects.create_user("bench", password="bench-pw-123")
    team = Team.objects.filter(name="Bench").first() or team_create(name="Bench", owner=user)
    result = {"database": connection.vendor, "records": args.records}
    if not (args.reuse and RequestLog.objects.exists()):
        began = time.monotonic()
        usage_seed_sql(team=team, count=args.records, on_progress=lambda done: print(
            f"  seeded {done:,} in {time.monotonic() - began:.0f} s", flush=True))
        result["seed_seconds"] = round(time.monotonic() - began, 1)
    raw = token_issue(membership=Membership.objects.get(user=user, team=team), name="bench")[1]
    headers = {"HTTP_AUTHORIZATION": f"Bearer {raw}"}
    client = Client()
    base = "/api/v1/usage"
    rows = RequestLog.objects.filter(team=team)
    low, high = rows.order_by("id").values_list("id", flat=True).first(), rows.order_by("-id").values_list(
        "id", flat=True).first()
    result["records"] = high - low + 1
    measured = {}
    measured["first page"], _ = timed(client, f"{base}?limit=1000", headers, args.repeat)
    middle = cursor_encode(low + (high - low) // 2, high)
    measured["page half way (cursor)"], _ = timed(client, f"{base}?limit=1000&cursor={middle}", headers, args.repeat)
    last = cursor_encode(high - 500, high)
    measured["last page (cursor)"], _ = timed(client, f"{base}?limit=1000&cursor={last}", headers, args.repeat)
    mid_time = datetime.now(timezone.utc) - timedelta(days=15)
    window = urlencode({"since": mid_time.isoformat(), "until": (mid_time + timedelta(hours=1)).isoformat(),
                        "limit": 1000})
    measured["one-hour window, first page"], _ = timed(client, f"{base}?{window}", headers, args.repeat)
    key = TeamKey.objects.filter(team=team).order_by("id").first()
    measured["one key, first page"], _ = timed(client, f"{base}?limit=1000&key={key.pk}", headers, args.repeat)
    model = rows.order_by("-id").values_list("model", flat=True).first()
    measured["one model, first page"], _ = timed(client, f"{base}?{urlencode({'limit': 1000, 'model': model})}",
                                                 headers, args.repeat)
    began, cursor, pages = time.perf_counter(), middle, 0
    for _ in range(50):
        answer = client.get(f"{base}?limit=1000&cursor={cursor}", **headers).json()
        pages += 1
        cursor = answer["next_cursor"]
        if cursor is None:
            break
    measured["50 consecutive pages (walk)"] = {"seconds": round(time.perf_counter() - began, 2), "pages": pages,
                                               "records_per_second": round(pages * 1000 / (time.perf_counter()
                                                                                           - began))}
    result["measured"] = measured
    return result


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--database", required=True)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--reuse", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    redis = setup(args.database)
    try:
        result = run(args)
    finally:
        redis.kill()
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
