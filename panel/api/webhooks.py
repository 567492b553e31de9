"""Webhooks (as on Webhooks): receivers, their signing secrets (shown once), a test message, and the delivery log."""
import datetime
from typing import Literal

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from ninja import Field, Router, Schema, Status

from panel.api.auth import gate
from panel.api.errors import errors
from panel.api.form_bodies import schema_from_form, validated
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.notifications.forms import WebhookForm
from panel.notifications.models import SUBSCRIBABLE, Webhook
from panel.notifications.services import (
    deliveries_of,
    webhook_create,
    webhook_delete,
    webhook_secret_rotate,
    webhook_test,
    webhook_update,
)

router = Router(tags=["webhooks"], auth=gate("webhooks.manage"))  # every operation here

Event = Literal[tuple(SUBSCRIBABLE)]


class WebhookOut(Schema):
    id: int
    name: str
    url: str
    format: str
    events: list[str]
    secret: str = Field(description="The signing secret's last four characters only.")
    enabled: bool
    created_at: datetime.datetime


class WebhookWithSecret(WebhookOut):
    signing_secret: str = Field(description="The whole signing secret: shown once, never again.")


WebhookIn = schema_from_form(WebhookForm, "WebhookIn", exclude=("events",), extra={
    "events": (list[Event], Field([], max_length=len(SUBSCRIBABLE), description="None: every event."))})
WebhookChange = schema_from_form(WebhookForm, "WebhookChange", exclude=("events",), partial=True, extra={
    "events": (list[Event] | None, Field(None, max_length=len(SUBSCRIBABLE)))})


class AttemptOut(Schema):
    at: datetime.datetime
    status: int | None
    error: str
    duration_ms: float


class DeliveryOut(Schema):
    id: int
    webhook_id: int
    event: str
    title: str
    state: str
    attempts: int
    last_status: int | None
    last_error: str
    next_attempt_at: datetime.datetime
    delivered_at: datetime.datetime | None
    created_at: datetime.datetime
    attempt_log: list[AttemptOut]


def webhook_out(hook):
    return {"id": hook.pk, "name": hook.name, "url": hook.url, "format": hook.format, "events": list(hook.events),
            "secret": f"whsec_…{hook.secret_last4}", "enabled": hook.enabled, "created_at": hook.created_at}


def delivery_out(delivery):
    return {"id": delivery.pk, "webhook_id": delivery.webhook_id, "event": delivery.notification.kind,
            "title": delivery.notification.title, "state": delivery.state, "attempts": delivery.attempts,
            "last_status": delivery.last_status, "last_error": delivery.last_error,
            "next_attempt_at": delivery.next_attempt_at, "delivered_at": delivery.delivered_at,
            "created_at": delivery.created_at,
            "attempt_log": [{"at": attempt.at, "status": attempt.status, "error": attempt.error,
                             "duration_ms": attempt.duration_ms} for attempt in delivery.attempt_log.all()]}


def _hook(request, webhook_id):
    return get_object_or_404(Webhook, pk=webhook_id, team=request.team)


@router.get("/webhooks", response=errors({200: list[WebhookOut]}))
def webhooks_list(request):
    return [webhook_out(hook) for hook in Webhook.objects.filter(team=request.team)]


@router.post("/webhooks", response=errors({201: WebhookWithSecret}))
def webhooks_create(request, body: WebhookIn, response: HttpResponse):
    response["Cache-Control"] = "no-store"  # the secret is in this answer only
    data = validated(WebhookForm, body).cleaned_data
    hook, secret = webhook_create(team=request.team, user=request.user, **data)
    audit_record(action=AuditAction.WEBHOOK_CHANGED, request=request, target=hook.name, created=True)
    return Status(201, {**webhook_out(hook), "signing_secret": secret})


@router.patch("/webhooks/{webhook_id}", response=errors({200: WebhookOut}))
def webhooks_change(request, webhook_id: int, body: WebhookChange):
    hook = _hook(request, webhook_id)
    current = {"name": hook.name, "url": hook.url, "format": hook.format, "events": hook.events,
               "enabled": hook.enabled}
    data = validated(WebhookForm, {**current, **body.dict(exclude_unset=True, exclude_none=True)}).cleaned_data
    webhook_update(webhook=hook, **data)
    audit_record(action=AuditAction.WEBHOOK_CHANGED, request=request, target=hook.name)
    return webhook_out(hook)


@router.post("/webhooks/{webhook_id}/secret", response=errors({200: WebhookWithSecret}),
             summary="A new signing secret (the old one stops at once)")
def webhooks_secret(request, webhook_id: int, response: HttpResponse):
    response["Cache-Control"] = "no-store"
    hook = _hook(request, webhook_id)
    secret = webhook_secret_rotate(webhook=hook)
    audit_record(action=AuditAction.WEBHOOK_CHANGED, request=request, target=hook.name, secret_rotated=True)
    return {**webhook_out(hook), "signing_secret": secret}


@router.post("/webhooks/{webhook_id}/test", response=errors({202: DeliveryOut}),
             summary="Send a test message (a real, logged delivery)")
def webhooks_test(request, webhook_id: int):
    return Status(202, delivery_out(webhook_test(webhook=_hook(request, webhook_id), user=request.user)))


@router.delete("/webhooks/{webhook_id}", response=errors({204: None}))
def webhooks_delete(request, webhook_id: int):
    hook = _hook(request, webhook_id)
    webhook_delete(webhook=hook)
    audit_record(action=AuditAction.WEBHOOK_CHANGED, request=request, target=hook.name, deleted=True)
    return Status(204, None)


@router.get("/webhooks/{webhook_id}/deliveries", response=errors({200: list[DeliveryOut]}),
            summary="The newest 100 deliveries of a webhook, each with its attempts")
def webhooks_deliveries(request, webhook_id: int):
    hook = _hook(request, webhook_id)
    rows = deliveries_of(team=request.team, webhook=hook).prefetch_related("attempt_log")
    return [delivery_out(delivery) for delivery in rows]
