"""The usage writer (panel/usage/writer.py): rows queued when the process exits are all written (the exit hook
drains the queue beside the background thread's last batch), also when uvicorn is stopped by SIGTERM; its own
INSERT stores every kind of value as bulk_create does."""
import signal
import subprocess
import sys
import textwrap

import httpx

from panel.usage.models import RequestLog
from tests.support.environment import ROOT, panel_env
from tests.support.gateway_server import free_port
from tests.support.usage_rows import rows_written_both_ways
from tests.support.waiting import wait_until

RECORD_THEN_EXIT = textwrap.dedent("""
    import django, sys
    django.setup()
    from panel.usage import writer
    import time
    for number in range(int(sys.argv[1])):
        writer.record(endpoint="chat", model="m", status_code=200, outcome="ok", latency_ms=1.0,
                      request_id=f"r{number}")
        if number % 500 == 0:
            time.sleep(0.01)  # a steady flow: the writer thread is busy with a batch most of the time
""")


def test_every_row_queued_before_exit_is_written(transactional_db):
    from django.db import connection

    env = panel_env(DATABASE_URL=f"sqlite:///{connection.settings_dict['NAME']}")
    done = subprocess.run([sys.executable, "-c", RECORD_THEN_EXIT, "5000"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "could not write" not in done.stderr, done.stderr[-2500:]
    assert RequestLog.objects.count() == 5000
    assert len(set(RequestLog.objects.values_list("request_id", flat=True))) == 5000


HOLD_A_BATCH_THEN_EXIT = textwrap.dedent("""
    import django, threading, time
    django.setup()
    from panel.usage import writer
    writing = threading.Event()
    insert = writer._insert
    def slow_insert(rows):
        if threading.current_thread().name == "tokenwise-usage-writer":
            writing.set()
            time.sleep(1)  # the process exits while the writer thread holds this batch
        return insert(rows)
    writer._insert = slow_insert
    for number in range(300):
        writer.record(endpoint="chat", model="m", status_code=200, outcome="ok", latency_ms=1.0,
                      request_id=f"r{number}")
    assert writing.wait(10), "the writer thread never took a batch"
    for number in range(300, 350):  # queued while the thread is busy: the exit hook's to write
        writer.record(endpoint="chat", model="m", status_code=200, outcome="ok", latency_ms=1.0,
                      request_id=f"r{number}")
""")


def test_the_batch_the_writer_holds_at_exit_is_written(transactional_db):
    """The exit hook waits for the thread's batch: a daemon thread is frozen when the interpreter finalizes, and
    the 300 rows it held were lost while the hook wrote only the 50 still queued (a gateway stopped cleanly in CI
    kept none of one request's records)."""
    from django.db import connection

    env = panel_env(DATABASE_URL=f"sqlite:///{connection.settings_dict['NAME']}")
    done = subprocess.run([sys.executable, "-c", HOLD_A_BATCH_THEN_EXIT], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert RequestLog.objects.count() == 350, done.stderr[-2500:]


SERVE_HOLDING_A_BATCH = textwrap.dedent("""
    import django, sys, threading, time
    django.setup()
    import uvicorn
    from panel.usage import writer
    insert = writer._insert
    def slow_insert(rows):
        if threading.current_thread().name == "tokenwise-usage-writer":
            time.sleep(2)  # SIGTERM comes while the writer thread holds this batch
        return insert(rows)
    writer._insert = slow_insert
    for number in range(200):
        writer.record(endpoint="chat", model="m", status_code=200, outcome="ok", latency_ms=1.0,
                      request_id=f"r{number}")
    uvicorn.run("panel.asgi:application", host="127.0.0.1", port=int(sys.argv[1]), log_level="info")
""")


def test_a_server_stopped_by_sigterm_writes_the_records_it_holds(transactional_db):
    """uvicorn re-raises SIGTERM after its shutdown and the process dies of it without running atexit hooks: the
    ASGI app's lifespan shutdown writes the records instead (a gateway stopped in CI lost its last requests')."""
    from django.db import connection

    port = free_port()
    env = panel_env(DATABASE_URL=f"sqlite:///{connection.settings_dict['NAME']}")
    server = subprocess.Popen([sys.executable, "-c", SERVE_HOLDING_A_BATCH, str(port)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: server.poll() is not None or answers(f"http://127.0.0.1:{port}/login/"), seconds=60,
                   message="the server to answer")
        server.send_signal(signal.SIGTERM)
        output, _ = server.communicate(timeout=60)
    finally:
        server.kill()
    assert RequestLog.objects.count() == 200, output[-3000:]
    assert "Application shutdown complete" in output, output[-3000:]


def answers(url):
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_a_batch_whose_rule_channel_or_key_was_deleted_meanwhile_is_written_without_them(transactional_db):
    """Rows wait up to a flush before they are written: a rule, channel, route or key deleted in between is a
    reference the database refuses. The batch is written with those references empty, as their deletion would have
    left rows written before it; a row of a deleted team goes with its team. Nothing else of the batch is lost."""
    from panel.accounts.keys import key_issue
    from panel.accounts.models import Team
    from panel.channels.models import Route, RouteRule
    from panel.usage import writer
    from tests.support.channels import remote

    kept_team, gone_team = Team.objects.create(name="kept", slug="kept"), Team.objects.create(name="gone", slug="gone")
    channel = remote(kept_team, name="cloud")
    route = Route.objects.create(team=kept_team, model_name="m")
    rule = RouteRule.objects.create(route=route, name="long", position=0)
    key, _ = key_issue(team=kept_team, user=None, name="app")
    row = dict(endpoint="chat", model="m", status_code=200, outcome="ok", latency_ms=1.0)
    rows = [dict(row, team_id=kept_team.pk, key_id=key.pk, route_id=route.pk, channel_id=channel.pk,
                 route_rule_id=rule.pk, request_id="deleted-rule"),
            dict(row, team_id=kept_team.pk, route_id=route.pk, channel_id=channel.pk, request_id="untouched"),
            dict(row, team_id=gone_team.pk, request_id="deleted-team")]
    rule.delete()
    gone_team.delete()
    writer._write(rows)
    written = {log.request_id: log for log in RequestLog.objects.all()}
    assert set(written) == {"deleted-rule", "untouched"}
    assert written["deleted-rule"].route_rule_id is None and written["deleted-rule"].channel_id == channel.pk
    assert written["deleted-rule"].key_id == key.pk and written["untouched"].route_id == route.pk


def test_the_writers_insert_stores_every_value_as_bulk_create_does(db):
    by_writer, by_bulk_create = rows_written_both_ways()
    assert by_writer == by_bulk_create
    assert by_writer["attempt_trail"][0]["outcome"] == "upstream_429" and str(by_writer["cost"]) == "0.00003217"
    assert by_writer["session_id"] == "" and by_writer["gpu_cost"] is None  # absent: the field's default


def test_a_row_with_a_name_the_writer_does_not_know_is_refused_as_bulk_create_refuses_it(db):
    from panel.usage import writer

    try:
        writer._insert([dict(endpoint="chat", model="m", status_code=200, outcome="ok", latency_ms=1.0,
                             no_such_field=1)])
    except TypeError as error:
        assert "no_such_field" in str(error)
    else:
        raise AssertionError("a row with an unknown name was written")
    assert not RequestLog.objects.exists()


IDLE_THEN_RECORD = textwrap.dedent("""
    import django, time
    django.setup()
    from panel.usage import writer
    from panel.usage.models import RequestLog
    row = dict(endpoint="chat", model="m", status_code=200, outcome="ok", latency_ms=1.0)
    writer.record(request_id="first", **row)
    deadline = time.monotonic() + 10
    while not RequestLog.objects.filter(request_id="first").exists():
        assert time.monotonic() < deadline, "the first row was never written"
        time.sleep(0.05)
    takes = []
    take = writer._take
    writer._take = lambda *args: takes.append(1) or take(*args)
    time.sleep(1.0)  # five of the writer's batch times with nothing queued
    idle_takes = len(takes)
    writer.record(request_id="second", **row)
    while not RequestLog.objects.filter(request_id="second").exists():
        assert time.monotonic() < deadline + 10, "the row queued after the idle second was never written"
        time.sleep(0.05)
    print("idle takes", idle_takes)
""")


def test_an_idle_writer_sleeps_until_a_row_comes(transactional_db):
    """The writer thread does not wake every batch time for nothing: with no row queued it looks at the queue not
    once in a second, and the next row is written as soon as a batch time after it came."""
    from django.db import connection

    env = panel_env(DATABASE_URL=f"sqlite:///{connection.settings_dict['NAME']}")
    done = subprocess.run([sys.executable, "-c", IDLE_THEN_RECORD], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "idle takes 0" in done.stdout, done.stdout
