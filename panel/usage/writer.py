"""Usage records are written in batches by one background thread, so the gateway never waits on the database.
At exit the hook stops that thread, waits for the batch it holds (a daemon thread is frozen mid-write when the
interpreter finalizes, and its batch was lost), then writes what is still queued. The same thread keeps the traffic
samples of routes that opted in (panel/usage/samples.py): deciding, redacting and encrypting one is work the
request's event loop does not do."""
import atexit
import logging
import queue
import threading
import time
from functools import lru_cache

from django.db import IntegrityError, close_old_connections, connection, models, transaction
from django.utils import timezone

from panel.accounts.models import TeamKey
from panel.usage import samples
from panel.usage.models import RequestLog

log = logging.getLogger(__name__)

FLUSH_SECONDS = 0.2
BATCH = 500
EXIT_WAIT_SECONDS = 30  # the longest the exit hook waits for the thread's batch before writing the rest itself
KEY_USED_EVERY_SECONDS = 60  # a key's last_used_at is written at most this often (per process)

_queue = queue.Queue()
_samples = queue.Queue()
MAX_QUEUED_SAMPLES = 1000  # drafts waiting beyond this are dropped: a sample is never worth the gateway's memory
_thread = None
_lock = threading.Lock()
_stop = threading.Event()
_queued = threading.Event()  # set by the first row or sample after the thread took the last batch
_key_used = {}  # key id -> when this process last wrote its last_used_at (monotonic)


def record(**fields):
    """Queue one RequestLog row (never blocks)."""
    _ensure_thread()
    _queue.put(fields)
    _wake()


def record_sample(**draft):
    """Queue one answered request of a sampling route for `samples.sample_keep` (never blocks)."""
    if _samples.qsize() >= MAX_QUEUED_SAMPLES:
        return
    _ensure_thread()
    _samples.put(draft)
    _wake()


def _wake():
    """Wake the thread for the first row or sample since its last batch (the later ones cost one flag read)."""
    if not _queued.is_set():
        _queued.set()


def _keep_samples():
    while True:
        try:
            draft = _samples.get_nowait()
        except queue.Empty:
            return
        try:
            samples.sample_keep(**draft)
        except Exception:
            log.exception("could not keep a traffic sample of route %s", draft["plan"].route_id)
            connection.close()


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


def _without_dangling(rows):
    """`rows` as their foreign keys' on_delete would have left them had they been written before what they refer to
    was deleted (a key, route, channel or rule deleted between a request and its batch): a reference to a deleted
    row set to None (SET_NULL), a row of a deleted team left out (CASCADE)."""
    for field in RequestLog._meta.concrete_fields:
        if not field.is_relation:
            continue
        ids = {row.get(field.attname) for row in rows} - {None}
        if not ids:
            continue
        gone = ids - set(field.related_model.objects.filter(pk__in=ids).values_list("pk", flat=True))
        if not gone:
            continue
        if field.remote_field.on_delete is models.SET_NULL:
            for row in rows:
                if row.get(field.attname) in gone:
                    row[field.attname] = None
        else:
            rows = [row for row in rows if row.get(field.attname) not in gone]
    return rows


def _insert(rows):
    """INSERT `rows` (dicts of RequestLog's attribute names) in one transaction, through one statement text for
    every batch, which the driver keeps prepared (psycopg after its fifth use, sqlite3 in its statement cache): each
    value is prepared by its field as bulk_create prepares it, without building a model instance per row (141
    against about 100 µs a row, docs/benchmarks.md). A row with any other name goes through bulk_create."""
    columns = _columns()
    if any(not columns.names.issuperset(row) for row in rows):
        RequestLog.objects.bulk_create([RequestLog(**row) for row in rows])
        return
    values = [tuple(field.get_db_prep_save(row[field.attname] if field.attname in row else field.get_default(),
                                           connection) for field in columns.fields) for row in rows]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.executemany(columns.sql, values)


class _Columns:
    """RequestLog's columns but the id, their attribute names, and its INSERT statement for this connection."""

    def __init__(self):
        self.fields = [field for field in RequestLog._meta.concrete_fields if not field.primary_key]
        self.names = frozenset(field.attname for field in self.fields)
        quote = connection.ops.quote_name
        self.sql = (f"INSERT INTO {quote(RequestLog._meta.db_table)} "
                    f"({', '.join(quote(field.column) for field in self.fields)}) "
                    f"VALUES ({', '.join(['%s'] * len(self.fields))})")


@lru_cache(maxsize=1)
def _columns():
    return _Columns()


def _write(rows):
    if not rows:
        return
    try:
        try:
            _insert(rows)
        except IntegrityError:  # a key, route, channel, rule or team deleted since: not a reason to lose the batch
            rows = _without_dangling(rows)
            _insert(rows)
        _keys_used(rows)
    except Exception:
        log.exception("could not write %d usage records", len(rows))
        connection.close()  # the next batch on a fresh connection
    else:
        # Kept open between batches (closed at CONN_MAX_AGE only where that is set): on SQLite, CONN_MAX_AGE 0,
        # a new connection per batch was the gateway's largest CPU item after the relay (docs/benchmarks.md).
        if connection.settings_dict["CONN_MAX_AGE"]:
            close_old_connections()


def _run():
    while not _stop.is_set():
        # Asleep until a row comes (an idle process does not wake for nothing), then the rows wait in the queue
        # (where the exit hook finds them) and go in one batch per FLUSH_SECONDS: writing on the first row wrote
        # batches of one or two rows, a transaction each, most of a row's cost (docs/benchmarks.md).
        _queued.wait()
        _stop.wait(FLUSH_SECONDS)
        _queued.clear()
        while not _stop.is_set() and (rows := _take(BATCH)):
            _write(rows)
        _keep_samples()


def _keys_used(rows):
    """Stamp the keys of `rows` as used now: one UPDATE for the keys not stamped in the last minute."""
    now = time.monotonic()
    due = {row["key_id"] for row in rows
           if row.get("key_id") and now - _key_used.get(row["key_id"], float("-inf")) >= KEY_USED_EVERY_SECONDS}
    if due:
        TeamKey.objects.filter(pk__in=due).update(last_used_at=timezone.now())
        _key_used.update(dict.fromkeys(due, now))


@atexit.register
def flush():
    """Stop the thread after its current batch, then write every row still queued."""
    _stop.set()
    _queued.set()
    thread = _thread
    if thread is not None and thread.is_alive():
        thread.join(EXIT_WAIT_SECONDS)
        if thread.is_alive():
            log.error("the usage writer still holds a batch after %d s; writing the queued rows beside it",
                      EXIT_WAIT_SECONDS)
    _write(_take())
    _keep_samples()
