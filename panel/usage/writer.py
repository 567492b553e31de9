"""Usage records are written in batches by one background thread, so the gateway never waits on the database.
Records still queued when the process exits are written by an atexit hook."""
import atexit
import logging
import queue
import threading
import time

from django.db import close_old_connections, connection

from panel.usage.models import RequestLog

log = logging.getLogger(__name__)

FLUSH_SECONDS = 0.2
BATCH = 500

_queue = queue.Queue()
_thread = None
_lock = threading.Lock()


def record(**fields):
    """Queue one RequestLog row (never blocks)."""
    _ensure_thread()
    _queue.put(fields)


def _ensure_thread():
    global _thread
    if _thread is not None and _thread.is_alive():
        return
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="tokenwise-usage-writer", daemon=True)
            _thread.start()


def _take(limit=None):
    """The rows queued now, at most `limit`."""
    rows = []
    try:
        while limit is None or len(rows) < limit:
            rows.append(_queue.get_nowait())
    except queue.Empty:
        pass
    return rows


def _write(rows):
    if not rows:
        return
    try:
        RequestLog.objects.bulk_create([RequestLog(**row) for row in rows])
    except Exception:
        log.exception("could not write %d usage records", len(rows))
        connection.close()  # the next batch on a fresh connection
    else:
        # Kept open between batches (closed at CONN_MAX_AGE only where that is set): on SQLite, CONN_MAX_AGE 0,
        # a new connection per batch was the gateway's largest CPU item after the relay (docs/benchmarks.md).
        if connection.settings_dict["CONN_MAX_AGE"]:
            close_old_connections()


def _run():
    while True:
        # Rows wait in the queue (where the exit hook finds them) and go in one batch per FLUSH_SECONDS: waking on
        # the first row wrote batches of one or two rows, a transaction each, most of a row's cost (benchmarks.md).
        time.sleep(FLUSH_SECONDS)
        while rows := _take(BATCH):
            _write(rows)


@atexit.register
def flush():
    _write(_take())
