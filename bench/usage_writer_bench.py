"""The usage writer's CPU per row: its own INSERT (panel/usage/writer.py `_insert`) against Django's bulk_create,
in the web process's terms (the writer thread's CPU time, user + system; the database server's not counted).
Not a test; results in docs/benchmarks.md.

  .venv/bin/python bench/usage_writer_bench.py [--database-url postgres://postgres@127.0.0.1:5432/postgres]

A fresh database (SQLite in a temporary folder unless --database-url names a PostgreSQL server, where a database
of its own is made and dropped) is migrated; then batches of 1 and of 8 rows shaped like a streamed chat request's
are written by each way in turns, --rounds times, and the medians are printed as JSON."""
import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MEASURE = """
import json, os, statistics, time
from decimal import Decimal
from django.utils import timezone
from panel.accounts.models import Team
from panel.usage import writer
from panel.usage.models import RequestLog

team = Team.objects.create(name="bench")
row = dict(team_id=team.pk, key_id=None, route_id=None, channel_id=None, attempts=1, rate_limited_attempts=0,
           fell_back=False, attempt_trail=[{"channel": "fake", "channel_id": 1, "outcome": "ok", "ms": 7.1,
                                            "status": 200}],
           request_id="0123456789abcdef", endpoint="chat", model="chat", stream=True, json_requested=False,
           system_prompt_hash="", system_prompt_shape_hash="", prompt_head_hash="a1b2c3d4e5f60718", tags=None,
           status_code=200, outcome="ok", error_kind="", prompt_tokens=12, completion_tokens=20, cached_tokens=0,
           ttft_ms=7.2, latency_ms=110.5, cost=Decimal("0.00003200"), session_id="p-0123456789abcdef",
           session_turn=1, repeated_share=0.0)
ways = {"bulk_create": lambda rows: RequestLog.objects.bulk_create([RequestLog(**r) for r in rows]),
        "insert": writer._insert}
rounds, batches = int(os.environ["BENCH_ROUNDS"]), int(os.environ["BENCH_BATCHES"])
found = {}
for size in (1, 8):
    for _ in range(rounds):
        for name, write in ways.items():
            for _ in range(5):  # warm: the statement prepared, the caches filled
                write([dict(row, created_at=timezone.now()) for _ in range(size)])
            began = time.thread_time()
            for _ in range(batches):
                write([dict(row, created_at=timezone.now()) for _ in range(size)])
            found.setdefault(f"{name}, batch of {size}", []).append(
                (time.thread_time() - began) / (batches * size) * 1e6)
print(json.dumps({name: round(statistics.median(values), 1) for name, values in found.items()}))
"""


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--database-url", help="a PostgreSQL server's URL (a database of its own is made on it)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as data_dir:
        env = dict(os.environ, TOKENWISE_DATA_DIR=data_dir, SECRET_KEY=secrets.token_urlsafe(50),
                   DJANGO_SETTINGS_MODULE="panel.settings", PYTHONDONTWRITEBYTECODE="")
        env.pop("DATABASE_URL", None)
        name = None
        if args.database_url:
            import psycopg
            name = f"tokenwise_bench_{secrets.token_hex(4)}"
            with psycopg.connect(args.database_url, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{name}"')
            env["DATABASE_URL"] = args.database_url.rsplit("/", 1)[0] + "/" + name
        try:
            subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
            out = subprocess.run([sys.executable, "manage.py", "shell", "-c", MEASURE], cwd=ROOT, check=True,
                                 env=dict(env, BENCH_ROUNDS=str(args.rounds), BENCH_BATCHES=str(args.batches)),
                                 capture_output=True, text=True)
        finally:
            if name:
                with psycopg.connect(args.database_url, autocommit=True) as admin:
                    admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["database"] = "postgresql" if name else "sqlite"
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
