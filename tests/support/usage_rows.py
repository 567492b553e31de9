"""A usage row with a value of every kind RequestLog stores, written by the usage writer's own INSERT and by Django's
bulk_create, read back from the database: the two must agree field by field (SQLite in the tests' own database,
PostgreSQL in tests/system/test_postgres.py)."""
from datetime import datetime, timezone
from decimal import Decimal

from django.forms.models import model_to_dict


def rows_written_both_ways():
    """(as the writer wrote it, as bulk_create wrote it): the same row, read back as dicts without their ids."""
    from panel.accounts.models import Team
    from panel.usage import writer
    from panel.usage.models import RequestLog

    team = Team.objects.create(name="rows", slug="rows-both-ways")
    row = dict(team_id=team.pk, created_at=datetime(2026, 12, 7, 3, 4, 5, 678901, tzinfo=timezone.utc),
               endpoint="chat", model="m — ünïcode", stream=True, status_code=200, outcome="ok",
               attempts=2, rate_limited_attempts=1, fell_back=True,
               attempt_trail=[{"channel": "a", "channel_id": 3, "outcome": "upstream_429", "ms": 1.5, "status": 429},
                              {"channel": "b", "outcome": "ok", "ms": 7.25, "status": 200}],
               prompt_tokens=12, completion_tokens=20, cached_tokens=4, cache_write_tokens=None,
               tokens_estimated="completion", ttft_ms=7.5, latency_ms=110.25, cost=Decimal("0.00003217"),
               gpu_cost=None, json_requested=True, json_valid=False, system_prompt_hash="0123456789abcdef",
               prompt_head_hash="fedcba9876543210", spilled=None, canary=False, session_turn=3,
               repeated_share=0.75, tags="|batch|nightly|")
    writer._insert([dict(row, request_id="by-writer")])
    RequestLog.objects.bulk_create([RequestLog(**row, request_id="by-bulk-create")])
    written = {log.request_id: model_to_dict(log, exclude=["id", "request_id"])
               for log in RequestLog.objects.filter(team=team)}
    return written["by-writer"], written["by-bulk-create"]
