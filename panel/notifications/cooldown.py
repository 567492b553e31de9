"""The gateway's way to say a channel cooled down, without waiting for anything: `channel_cooled_down` puts a tuple
on an in-process queue (no I/O, no lock held) and returns; one background thread records the event (at most once
per channel per WEBHOOK_COOLDOWN_REPEAT_SECONDS across every gateway process, through a Redis `add`) and queues the
deliveries. A slow database, Redis or receiver therefore never reaches a gateway request."""
import logging
import queue
import threading

from django.conf import settings
from django.core.cache import cache
from django.db import close_old_connections, transaction

from panel.notifications.models import EventKind
from panel.notifications.services import notify

log = logging.getLogger(__name__)

QUEUE_LIMIT = 1000  # a burst beyond this is dropped: the same channels are announced by the first ones

_queue = queue.Queue(maxsize=QUEUE_LIMIT)
dropped = 0
_thread = None
_lock = threading.Lock()


def channel_cooled_down(*, team_id, channel_id, channel_name, failures, seconds):
    """Announce that the gateway stopped trying `channel_id` for `seconds` after `failures` failures in a row.
    Never blocks and never raises."""
    global dropped
    try:
        _ensure_thread()
        _queue.put_nowait((team_id, channel_id, channel_name, failures, seconds))
    except Exception:  # a full queue or a thread that cannot start: the gateway goes on regardless
        dropped += 1
        if dropped % 1000 == 1:  # say so, without a log line per request in a storm
            log.warning("cooldown notices dropped (queue full): %d so far", dropped)


def _ensure_thread():
    global _thread
    if _thread is not None and _thread.is_alive():
        return
    with _lock:
        if _thread is None or not _thread.is_alive():
            _thread = threading.Thread(target=_run, name="tokenwise-cooldown-notices", daemon=True)
            _thread.start()


def cooldown_record(team_id, channel_id, channel_name, failures, seconds):
    """Record the event unless this channel was announced within WEBHOOK_COOLDOWN_REPEAT_SECONDS. Returns the
    Notification, or None when it was a repeat (or the channel belongs to no team)."""
    if team_id is None:
        return None
    if not cache.add(f"notifications:cooldown:{channel_id}", 1, timeout=settings.WEBHOOK_COOLDOWN_REPEAT_SECONDS):
        return None
    with transaction.atomic():
        return notify(team=team_id, kind=EventKind.CHANNEL_COOLED_DOWN,
                      title=f"Channel {channel_name} cooled down after {failures} failures in a row; the gateway "
                            f"tries it last for {seconds:g} s",
                      channel=channel_name, channel_id=channel_id, failures=failures, seconds=seconds)


def _run():
    while True:
        item = _queue.get()
        try:
            cooldown_record(*item)
        except Exception:
            log.exception("could not record the cooldown of channel %s", item[1])
        finally:
            close_old_connections()
