"""Usage records are written in batches by one background thread, so the gateway never waits on the database.
Records still queued when the process exits are written by an atexit hook."""
import atexit
import logging
import queue
import threading

from django.db import close_old_connections

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


def _take(timeout):
    rows = []
    try:
        rows.append(_queue.get(timeout=timeout))
        while len(rows) < BATCH:
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
    finally:
        close_old_connections()


def _run():
    while True:
        _write(_take(FLUSH_SECONDS))


@atexit.register
def flush():
    rows = []
    while True:
        try:
            rows.append(_queue.get_nowait())
        except queue.Empty:
            break
    _write(rows)
