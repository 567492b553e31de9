"""Settings come from the environment; a bad value stops start-up with one clear line naming the variable."""
import subprocess
import sys

import pytest

from panel.env import EnvError, database_from_url, envbool, envint
from tests.support.environment import ROOT, panel_env


def manage_check(**env_changes):
    env = panel_env(**env_changes)
    return subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


def server_start(**env_changes):
    """The web server's entry point (what uvicorn imports). manage.py falls back on the secrets `make run` keeps in
    the data folder; a server started on its own has no such fallback."""
    env = panel_env(**env_changes)
    return subprocess.run([sys.executable, "-c", "import panel.asgi"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("start, changes, variable", [
    (server_start, {"SECRET_KEY": ""}, "SECRET_KEY"),
    (server_start, {"SECRET_KEY": None}, "SECRET_KEY"),
    (manage_check, {"SECRET_KEY": "django-insecure-abc"}, "SECRET_KEY"),
    (server_start, {"SECRET_KEY": "django-insecure-abc"}, "SECRET_KEY"),
    (manage_check, {"DEBUG": "perhaps"}, "DEBUG"),
    (manage_check, {"DATABASE_URL": "mysql://db/tokenwise"}, "DATABASE_URL"),
    (manage_check, {"DATABASE_URL": "postgres://user:hunter2@db:notaport/x"}, "DATABASE_URL"),
    (manage_check, {"TOKENWISE_JOB_HEARTBEAT_SECONDS": "soon"}, "TOKENWISE_JOB_HEARTBEAT_SECONDS"),
    (manage_check, {"TOKENWISE_DATA_DIR": "/proc/tokenwise"}, "TOKENWISE_DATA_DIR"),
])
def test_it_stops_with_one_line_naming_the_variable(start, changes, variable):
    result = start(**changes)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("tokenwise: configuration error:")
    assert variable in lines[0]
    assert "Traceback" not in result.stderr
    assert "hunter2" not in result.stderr  # a password in a URL never reaches a message


def test_it_starts_with_good_values():
    result = manage_check()
    assert result.returncode == 0, result.stderr


def test_it_parses_database_urls(tmp_path):
    sqlite = database_from_url("DATABASE_URL", "sqlite:///panel.db", data_dir=str(tmp_path))
    assert sqlite["NAME"] == str(tmp_path / "panel.db")
    assert "journal_mode=WAL" in sqlite["OPTIONS"]["init_command"]
    absolute = database_from_url("DATABASE_URL", "sqlite:////var/x.db", data_dir=str(tmp_path))
    assert absolute["NAME"] == "/var/x.db"
    postgres = database_from_url("DATABASE_URL", "postgres://tw:p%40ss@db.local:5433/tokenwise", data_dir="/x")
    assert postgres["ENGINE"] == "django.db.backends.postgresql"
    assert (postgres["USER"], postgres["PASSWORD"], postgres["HOST"], postgres["PORT"], postgres["NAME"]) == (
        "tw", "p@ss", "db.local", "5433", "tokenwise")


def test_it_reads_booleans_and_numbers_strictly(monkeypatch):
    monkeypatch.setenv("X_FLAG", "yes")
    assert envbool("X_FLAG", False) is True
    monkeypatch.setenv("X_FLAG", "2")
    with pytest.raises(EnvError, match="X_FLAG"):
        envbool("X_FLAG", False)
    monkeypatch.setenv("X_NUM", "0")
    with pytest.raises(EnvError, match="X_NUM=0 is out of range"):
        envint("X_NUM", 5, minimum=1)


def test_it_uses_sqlite_with_wal_by_default(db):
    from django.conf import settings
    from django.db import connection

    assert settings.DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"
    assert settings.CELERY_TASK_SERIALIZER == "json" and settings.CELERY_ACCEPT_CONTENT == ["json"]
    assert settings.CELERY_WORKER_PREFETCH_MULTIPLIER == 1
    assert settings.CELERY_TASK_ACKS_LATE and settings.CELERY_TASK_REJECT_ON_WORKER_LOST
    assert settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"] > settings.JOB_HARD_TIME_LIMIT
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        # the test database is created fresh; WAL is set by the connection's init command
        assert cursor.fetchone()[0].lower() == "wal"
