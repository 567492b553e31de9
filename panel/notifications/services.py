"""Notifications: `notify` records an event and its deliveries in the caller's transaction (so a reader who sees the
state sees its event too) and sends them once that transaction commits; webhooks are made and changed here."""
import re
import secrets
from datetime import timedelta
from urllib.parse import urlsplit

from celery import current_app
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from panel.core import crypto, outbound
from panel.env import EnvError
from panel.notifications.models import (
    SUBSCRIBABLE,
    Delivery,
    DeliveryState,
    EventKind,
    Notification,
    Webhook,
    WebhookFormat,
)

DELIVER_TASK = "panel.notifications.tasks.deliver"
SECRET_PREFIX = "whsec_"
NAME_RE = re.compile(r"^[^\x00-\x1f\x7f]{1,100}$")


def notify(*, team, kind, title, **facts):
    """Record that `kind` happened in `team` (words in `title`, names and numbers in `facts`; never a secret) with a
    delivery for each webhook that wants it, in the current transaction; the deliveries are sent after it commits.
    Returns the Notification."""
    team_id = getattr(team, "pk", team)
    note = Notification.objects.create(team_id=team_id, kind=kind, title=str(title)[:300], facts=facts)
    now = timezone.now()
    deliveries = [Delivery(webhook=hook, notification=note, next_attempt_at=now)
                  for hook in Webhook.objects.filter(team_id=team_id, enabled=True) if hook.wants(kind)]
    if deliveries:
        ids = [delivery.pk for delivery in Delivery.objects.bulk_create(deliveries)]
        # robust: a broker hiccup must not fail the caller whose state already committed; beat sends it later
        transaction.on_commit(lambda: [delivery_send(delivery_id) for delivery_id in ids], robust=True)
    return note


def delivery_send(delivery_id, *, countdown=None):
    """Queue one delivery attempt on the default worker (beat's `deliver_due` sends anything this loses)."""
    options = {"countdown": countdown} if countdown else {}
    current_app.send_task(DELIVER_TASK, args=[delivery_id], queue="default", **options)


# ------------------------------------------------------------------------------------------------- webhooks

def url_errors(url):
    """Errors for a receiver URL: http(s), a host, no credentials (they would sit in the page and the logs)."""
    if not isinstance(url, str) or not url.strip():
        return ["Enter the receiver's URL, e.g. https://hooks.slack.com/services/… or https://ops.example/hook."]
    url = url.strip()
    if len(url) > 500:
        return ["The URL is longer than 500 characters."]
    if re.search(r"[\s\x00-\x1f\x7f]", url):
        return ["The URL contains spaces or control characters."]
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return ["The URL must start with http:// or https://."]
    try:
        host, _ = parts.hostname, parts.port
    except ValueError:
        return ["The URL has a port that is not a number from 1 to 65535."]
    if not host:
        return ["The URL has no host name."]
    if parts.username or parts.password:
        return ["Leave user names and passwords out of the URL: the signature header proves the sender."]
    refusal = outbound.url_refusal(url)
    if refusal:
        return [f"The panel does not call this address: {refusal}."]
    return []


def _checked(*, team, webhook, name, url, format, events):
    errors = {}
    name = (name or "").strip()
    if not NAME_RE.match(name):
        errors["name"] = ["Give the webhook a name of 1-100 characters."]
    elif Webhook.objects.filter(team=team, name=name).exclude(pk=getattr(webhook, "pk", None)).exists():
        errors["name"] = [f"This team already has a webhook named {name!r}."]
    problems = url_errors(url)
    if problems:
        errors["url"] = problems
    if format not in WebhookFormat.values:
        errors["format"] = ["Choose json or slack."]
    events = list(events or [])
    unknown = [kind for kind in events if kind not in SUBSCRIBABLE]
    if unknown or len(set(events)) != len(events):
        errors["events"] = [f"Events are some of {', '.join(SUBSCRIBABLE)} (none: all of them), each once."]
    if errors:
        raise ValidationError(errors)
    return name, url.strip(), sorted(events)


def _new_secret():
    raw = SECRET_PREFIX + secrets.token_urlsafe(32)
    try:
        return raw, crypto.encrypt(raw)
    except EnvError as error:
        raise ValidationError({"url": [f"The signing secret cannot be stored: {error}"]}) from None


@transaction.atomic
def webhook_create(*, team, user=None, name, url, format=WebhookFormat.JSON, events=(), enabled=True):
    """Create a webhook with a new signing secret. Returns (Webhook, secret): the secret exists in plain text only in
    this return value (it is stored encrypted, for signing)."""
    name, url, events = _checked(team=team, webhook=None, name=name, url=url, format=format, events=events)
    raw, ciphertext = _new_secret()
    hook = Webhook.objects.create(team=team, name=name, url=url, format=format, events=events, enabled=bool(enabled),
                                  secret_ciphertext=ciphertext, secret_last4=raw[-4:], created_by=user)
    return hook, raw


@transaction.atomic
def webhook_update(*, webhook, name, url, format, events, enabled):
    name, url, events = _checked(team=webhook.team, webhook=webhook, name=name, url=url, format=format,
                                 events=events)
    webhook.name, webhook.url, webhook.format, webhook.events = name, url, format, events
    webhook.enabled = bool(enabled)
    webhook.save()
    return webhook


@transaction.atomic
def webhook_secret_rotate(*, webhook):
    """A new signing secret (the old one stops at once). Returns the new secret, shown once."""
    raw, ciphertext = _new_secret()
    Webhook.objects.filter(pk=webhook.pk).update(secret_ciphertext=ciphertext, secret_last4=raw[-4:])
    webhook.secret_ciphertext, webhook.secret_last4 = ciphertext, raw[-4:]
    return raw


def webhook_delete(*, webhook):
    webhook.delete()


@transaction.atomic
def webhook_test(*, webhook, user=None):
    """Send a test message to one webhook (a real delivery, logged like any other)."""
    note = Notification.objects.create(team_id=webhook.team_id, kind=EventKind.TEST,
                                       title=f"Test message for {webhook.name}",
                                       facts={"requested_by": user.get_username() if user else ""})
    delivery = Delivery.objects.create(webhook=webhook, notification=note, next_attempt_at=timezone.now())
    transaction.on_commit(lambda: delivery_send(delivery.pk), robust=True)
    return delivery


def deliveries_of(*, team, webhook=None, limit=100):
    rows = Delivery.objects.filter(webhook__team=team).select_related("webhook", "notification")
    if webhook is not None:
        rows = rows.filter(webhook=webhook)
    return rows[:limit]


def deliveries_due(*, now=None, limit=200):
    """Ids of deliveries whose time has come: waiting and due, or claimed by a worker that never finished."""
    now = now or timezone.now()
    waiting = Delivery.objects.filter(state=DeliveryState.PENDING, next_attempt_at__lte=now)
    lost = Delivery.objects.filter(state=DeliveryState.SENDING, claimed_until__lt=now)
    return list(waiting.values_list("pk", flat=True)[:limit]) + list(lost.values_list("pk", flat=True)[:limit])


def backoff_seconds(attempts, base):
    """Wait after the `attempts`-th failed attempt: base, 3×base, 9×base … (at most a day)."""
    return min(base * 3 ** max(attempts - 1, 0), 86_400)


def retry_at(attempts, base, now=None):
    return (now or timezone.now()) + timedelta(seconds=backoff_seconds(attempts, base))
