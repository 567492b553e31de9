"""A Celery worker forks its pool's processes from the process its heartbeat thread writes from: a fork waits for
the beat in flight, so a child never starts with SQLite's locks copied as held (issue 29: a roll-up whose first query
waited past its soft time limit and was killed at its hard limit)."""
import os
import signal
import sqlite3
from types import SimpleNamespace

from django.db import connection

from panel.hosts import heartbeat
from panel.hosts.models import WorkerHost
from tests.support.sqlite_lock import write_lock_held
from tests.support.waiting import wait_until

NODE = "default@testhost"


def row_seen_by_a_forked_child(path):
    """Fork as a worker's pool does; the child reads the worker's row through its own connection. Its exit code:
    0 when the row is there, 3 when not, SIGALRM when it waited on the database for a minute."""
    pid = os.fork()
    if pid == 0:
        code = 4
        try:
            signal.alarm(60)  # its default action ends a child stuck inside SQLite
            with sqlite3.connect(path, timeout=30) as database:
                found = database.execute(f"SELECT count(*) FROM {WorkerHost._meta.db_table} WHERE name = ?",
                                         (NODE,)).fetchone()[0]
            code = 0 if found else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_fork_waits_for_the_heartbeat_in_the_database(transactional_db):
    path = connection.settings_dict["NAME"]
    with write_lock_held(path, seconds=5):  # the first beat waits in the database until this writer is done
        heartbeat.start(SimpleNamespace(task_consumer=None, hostname=NODE))
        try:
            wait_until(heartbeat.beating.locked, message="the first beat")
            assert row_seen_by_a_forked_child(path) == 0  # forked after the beat had written and closed
        finally:
            heartbeat.stop(SimpleNamespace(hostname=NODE))
    assert WorkerHost.objects.filter(name=NODE).exists()
