"""The usage roll-up gives up a round instead of hanging (issue 29): a stalled Redis and a database locked past
SQLite's busy timeout make it return, log why and free its lock, the next run rolls up, and the lock of a run killed
at its hard time limit expires with it. Outcomes are asserted, not durations; the deadlines are generous."""
import os
import signal
import threading
from datetime import timedelta

import redis
from django.core.cache import cache
from django.db import connection
from django.utils import timezone

from panel.dashboards.rollup import LOCK_KEY, usage_rollup_run
from panel.dashboards.tasks import roll_up_usage
from panel.usage.models import RequestLog
from tests.support.environment import REDIS_URL
from tests.support.sqlite_lock import write_lock_held
from tests.support.waiting import wait_until


def record(team):
    RequestLog.objects.create(team=team, created_at=timezone.now() - timedelta(minutes=1), endpoint="chat",
                              model="x", status_code=200, outcome="ok", latency_ms=5)


def in_thread(function):
    """Run `function` in a thread of its own; `outcome(seconds)` waits for it, and fails if it has not returned."""
    outcome = {}

    def run():
        try:
            outcome["value"] = function()
        except BaseException as error:  # reported to the test's thread
            outcome["error"] = error
        finally:
            connection.close()

    thread = threading.Thread(target=run, name="test-rollup", daemon=True)
    thread.start()

    def result(seconds):
        thread.join(seconds)
        assert not thread.is_alive(), f"the roll-up was still waiting after {seconds} s"
        return outcome

    return result


def test_a_stalled_redis_skips_the_round_and_the_next_run_rolls_up(transactional_db, team_setup, redis_server,
                                                                    caplog):
    record(team_setup["team_a"])
    os.kill(redis_server.pid, signal.SIGSTOP)  # Redis stops answering; connections still open and requests queue
    try:
        outcome = in_thread(usage_rollup_run)(seconds=120)
    finally:
        os.kill(redis_server.pid, signal.SIGCONT)
    assert outcome == {"value": None}
    assert "usage roll-up skipped: Redis did not answer" in caplog.text
    # The lock request the stalled Redis reads once it runs again may set the lock; like a killed run's, it expires.
    redis.Redis.from_url(REDIS_URL).delete(cache.make_key(LOCK_KEY))
    assert usage_rollup_run() == 1


def test_a_database_locked_past_its_busy_timeout_skips_the_round_and_a_killed_runs_lock_expires(
        transactional_db, team_setup, caplog):
    record(team_setup["team_a"])
    plain = redis.Redis.from_url(REDIS_URL)
    key = cache.make_key(LOCK_KEY)
    with write_lock_held(connection.settings_dict["NAME"]):  # a writer that outlasts SQLite's busy timeout
        outcome = in_thread(usage_rollup_run)
        # While the run waits on the database it holds its lock: were it killed now, this is what it would leave.
        seconds_left = wait_until(lambda: plain.ttl(key) > 0 and plain.ttl(key), message="the run's lock")
        assert seconds_left <= roll_up_usage.time_limit  # gone by the time the killed run is
        assert outcome(seconds=120) == {"value": None}
    assert "usage roll-up skipped: the database stayed locked" in caplog.text
    assert not plain.exists(key)  # the skipped round let go of its lock
    assert usage_rollup_run() == 1
