"""DATABASE_URL=postgres://... works: migrations apply, a job is claimed exactly once, a lock wait or a
transaction left open has a deadline, and the usage writer's own INSERT stores what bulk_create stores, on
PostgreSQL."""
import secrets
import subprocess
import sys

import psycopg
import pytest

from tests.support.environment import ROOT, panel_env

ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"

CLAIM_TWICE = """
from panel.accounts.models import Team
from panel.hosts.models import EngineCheck, WorkerHost
from panel.jobs.services import job_claim
team = Team.objects.create(name="pg")
host = WorkerHost.objects.create(name="gpu@pg", host="pg", kind="gpu")
check = EngineCheck.objects.create(team=team, host=host)
print("claims", job_claim(check, worker="a"), job_claim(EngineCheck.objects.get(pk=check.pk), worker="b"))
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute("SHOW lock_timeout")
    lock = cursor.fetchone()[0]
    cursor.execute("SHOW idle_in_transaction_session_timeout")
    print("timeouts", lock, cursor.fetchone()[0])
from tests.support.usage_rows import rows_written_both_ways
by_writer, by_bulk_create = rows_written_both_ways()
print("usage rows agree", by_writer == by_bulk_create, by_writer["attempt_trail"][1]["ms"], by_writer["cost"])
"""


@pytest.fixture
def postgres_url():
    name = f"tokenwise_test_{secrets.token_hex(4)}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield f"postgres://postgres@127.0.0.1:5432/{name}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_it_migrates_and_claims_once_on_postgres(postgres_url):
    env = panel_env(DATABASE_URL=postgres_url)
    migrate = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=180)
    assert migrate.returncode == 0, migrate.stderr
    shell = subprocess.run([sys.executable, "manage.py", "shell", "-c", CLAIM_TWICE], cwd=ROOT, env=env,
                           capture_output=True, text=True, timeout=120)
    assert shell.returncode == 0, shell.stderr
    assert "claims True False" in shell.stdout
    assert "timeouts 20s 10min" in shell.stdout  # a lock wait and a forgotten transaction both end
    assert "usage rows agree True 7.25 0.00003217" in shell.stdout
