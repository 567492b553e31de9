"""The usage writer (panel/usage/writer.py): rows queued when the process exits are all written (the exit hook
drains the queue beside the background thread's last batch)."""
import subprocess
import sys
import textwrap

from panel.usage.models import RequestLog
from tests.support.environment import ROOT, panel_env

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
