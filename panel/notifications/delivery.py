"""One attempt to deliver a notification: claim the row, POST the signed body, record the answer, and either finish
or wait for the next attempt (backoff). Runs in a Celery task on `default`, never in a web request.

The signature: `X-Tokenwise-Signature: sha256=<hex>` is HMAC-SHA256 with the webhook's secret over
`<X-Tokenwise-Timestamp>.<raw body>`; a receiver recomputes it, compares in constant time and refuses a timestamp
more than a few minutes old (a replay)."""
import hashlib
import hmac
import json
import logging
import time
from datetime import timedelta

import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from panel.core import crypto, outbound
from panel.core.crypto import CredentialError
from panel.env import EnvError
from panel.notifications.models import Delivery, DeliveryAttempt, DeliveryState, WebhookFormat
from panel.notifications.services import delivery_send, retry_at

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Tokenwise-Signature"
TIMESTAMP_HEADER = "X-Tokenwise-Timestamp"
EVENT_HEADER = "X-Tokenwise-Event"
DELIVERY_HEADER = "X-Tokenwise-Delivery"
USER_AGENT = "Tokenwise-Webhook/1"
MAX_ANSWER_BYTES = 4096


def signature(secret, timestamp, body):
    """The value of X-Tokenwise-Signature for `body` (bytes) sent at `timestamp` (the header's text)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def payload(delivery):
    """The JSON body for a delivery, in its webhook's format."""
    note, hook = delivery.notification, delivery.webhook
    if hook.format == WebhookFormat.SLACK:
        lines = [f"*Tokenwise · {note.team.name}*: {note.title}"]
        lines += [f"• {name}: {value}" for name, value in note.facts.items() if value not in ("", None)]
        return {"text": "\n".join(lines)}
    return {"id": delivery.pk, "event": note.kind, "team": {"id": note.team_id, "name": note.team.name},
            "title": note.title, "facts": note.facts, "created_at": note.created_at.isoformat()}


def _claim(delivery_id, now):
    """Take the delivery for this attempt (one conditional UPDATE: a duplicate message or a second worker loses)."""
    lease = now + timedelta(seconds=settings.WEBHOOK_TIMEOUT_SECONDS + 60)
    due = (Delivery.objects.filter(pk=delivery_id, state=DeliveryState.PENDING, next_attempt_at__lte=now)
           | Delivery.objects.filter(pk=delivery_id, state=DeliveryState.SENDING, claimed_until__lt=now))
    return Delivery.objects.filter(pk__in=due.values("pk")).update(state=DeliveryState.SENDING,
                                                                   claimed_until=lease) == 1


def _post(delivery):
    """(status or None, error words, duration ms) for one POST."""
    hook = delivery.webhook
    started = time.perf_counter()
    try:
        secret = crypto.decrypt(hook.secret_ciphertext)
    except (CredentialError, EnvError) as error:
        return None, f"not sent: the signing secret cannot be read ({error})"[:300], 0.0
    body = json.dumps(payload(delivery), separators=(",", ":"), ensure_ascii=False).encode()
    timestamp = str(int(time.time()))
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, TIMESTAMP_HEADER: timestamp,
               EVENT_HEADER: delivery.notification.kind, DELIVERY_HEADER: str(delivery.pk),
               SIGNATURE_HEADER: signature(secret, timestamp, body)}
    timeout = httpx.Timeout(settings.WEBHOOK_TIMEOUT_SECONDS)
    try:  # to the address the outbound policy checked, resolved now (no DNS rebinding since the save)
        url, pinned_headers, extensions = outbound.pinned(hook.url)
    except outbound.OutboundRefused as error:
        return None, f"not sent: the panel does not call this address: {error}"[:300], 0.0
    headers.update(pinned_headers)
    try:
        # One deadline for the whole exchange: a receiver that trickles its answer is cut off too.
        with httpx.Client(timeout=timeout, follow_redirects=False,
                          transport=httpx.HTTPTransport(retries=0)) as client:
            with client.stream("POST", url, content=body, headers=headers, extensions=extensions) as answer:
                deadline = started + settings.WEBHOOK_TIMEOUT_SECONDS
                read = 0
                for chunk in answer.iter_raw():  # never decoded: a small gzip answer can decode to gigabytes
                    read += len(chunk)
                    if read > MAX_ANSWER_BYTES or time.perf_counter() > deadline:
                        break
                status = answer.status_code
    except httpx.TimeoutException:
        return None, f"no answer within {settings.WEBHOOK_TIMEOUT_SECONDS} s", _ms(started)
    except httpx.HTTPError as error:
        return None, f"{type(error).__name__}: could not reach the receiver"[:300], _ms(started)
    if 200 <= status < 300:
        return status, "", _ms(started)
    return status, f"the receiver answered HTTP {status}", _ms(started)


def _ms(started):
    return round((time.perf_counter() - started) * 1000, 1)


def delivery_attempt(delivery_id):
    """Make one attempt if the delivery is due. Returns the delivery's state afterwards, or None if it was not due
    (already delivered, given up, or another worker holds it)."""
    now = timezone.now()
    if not _claim(delivery_id, now):
        return None
    delivery = Delivery.objects.select_related("webhook__team", "notification__team").get(pk=delivery_id)
    status, error, duration = _post(delivery)
    attempts = delivery.attempts + 1
    with transaction.atomic():
        DeliveryAttempt.objects.create(delivery=delivery, status=status, error=error, duration_ms=duration)
        fields = {"attempts": attempts, "last_status": status, "last_error": error, "claimed_until": None}
        if not error:
            fields.update(state=DeliveryState.DELIVERED, delivered_at=timezone.now())
        elif attempts >= settings.WEBHOOK_MAX_ATTEMPTS:
            fields.update(state=DeliveryState.FAILED)
        else:
            fields.update(state=DeliveryState.PENDING,
                          next_attempt_at=retry_at(attempts, settings.WEBHOOK_BACKOFF_SECONDS))
        Delivery.objects.filter(pk=delivery.pk, state=DeliveryState.SENDING).update(**fields)
    if fields["state"] == DeliveryState.PENDING:
        wait = (fields["next_attempt_at"] - timezone.now()).total_seconds()
        transaction.on_commit(lambda: delivery_send(delivery.pk, countdown=max(wait, 0.1)), robust=True)
        log.info("webhook %s: delivery %s attempt %s failed (%s); next in %.0f s", delivery.webhook_id, delivery.pk,
                 attempts, error, wait)
    elif fields["state"] == DeliveryState.FAILED:
        log.warning("webhook %s: delivery %s gave up after %s attempts (%s)", delivery.webhook_id, delivery.pk,
                    attempts, error)
    return fields["state"]
