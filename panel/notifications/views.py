"""The Webhooks page (owners and admins): receivers, their signing secrets (shown once), a test message, and the
delivery log with every attempt."""
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from panel.accounts.decorators import team_view
from panel.audit.models import AuditAction
from panel.audit.services import audit_record
from panel.core.forms import errors_into
from panel.notifications.delivery import SIGNATURE_HEADER, TIMESTAMP_HEADER
from panel.notifications.forms import WebhookForm
from panel.notifications.models import Notification, Webhook
from panel.notifications.services import (
    deliveries_of,
    webhook_create,
    webhook_delete,
    webhook_secret_rotate,
    webhook_test,
    webhook_update,
)


def _page(request, *, form=None, secret=None, secret_for=None, status=200):
    team = request.team
    hooks = Webhook.objects.filter(team=team)
    edits = [(hook, WebhookForm(initial={"name": hook.name, "url": hook.url, "format": hook.format,
                                         "events": hook.events, "enabled": hook.enabled},
                                auto_id=f"id_{hook.pk}_%s")) for hook in hooks]
    response = render(request, "notifications/webhooks.html", {
        "webhooks": hooks, "edits": edits, "form": form or WebhookForm(),
        "deliveries": deliveries_of(team=team, limit=50).prefetch_related("attempt_log"),
        "events": Notification.objects.filter(team=team)[:20], "secret": secret, "secret_for": secret_for,
        "signature_header": SIGNATURE_HEADER, "timestamp_header": TIMESTAMP_HEADER}, status=status)
    if secret:
        response["Cache-Control"] = "no-store"  # the secret is in this response only
    return response


@team_view("webhooks.manage")
def webhook_list(request):
    return _page(request)


@require_POST
@team_view("webhooks.manage")
def webhook_create_view(request):
    form = WebhookForm(request.POST)
    if form.is_valid():
        try:
            hook, secret = webhook_create(team=request.team, user=request.user, **form.cleaned_data)
        except ValidationError as error:
            errors_into(form, error)
        else:
            audit_record(action=AuditAction.WEBHOOK_CHANGED, request=request, target=hook.name, created=True)
            return _page(request, secret=secret, secret_for=hook)
    return _page(request, form=form, status=400)


@require_POST
@team_view("webhooks.manage")
def webhook_edit_view(request, webhook_id):
    hook = get_object_or_404(Webhook, pk=webhook_id, team=request.team)
    form = WebhookForm(request.POST)
    if form.is_valid():
        try:
            webhook_update(webhook=hook, **form.cleaned_data)
        except ValidationError as error:
            errors_into(form, error)
        else:
            audit_record(action=AuditAction.WEBHOOK_CHANGED, request=request, target=hook.name)
            messages.success(request, f"Saved {hook.name}.")
            return redirect("webhooks")
    return _page(request, form=form, status=400)


@require_POST
@team_view("webhooks.manage")
def webhook_secret_view(request, webhook_id):
    hook = get_object_or_404(Webhook, pk=webhook_id, team=request.team)
    secret = webhook_secret_rotate(webhook=hook)
    audit_record(action=AuditAction.WEBHOOK_CHANGED, request=request, target=hook.name, secret_rotated=True)
    return _page(request, secret=secret, secret_for=hook)


@require_POST
@team_view("webhooks.manage")
def webhook_test_view(request, webhook_id):
    hook = get_object_or_404(Webhook, pk=webhook_id, team=request.team)
    webhook_test(webhook=hook, user=request.user)
    messages.info(request, f"Test message queued for {hook.name}: its delivery appears in the log below.")
    return redirect("webhooks")


@require_POST
@team_view("webhooks.manage")
def webhook_delete_view(request, webhook_id):
    hook = get_object_or_404(Webhook, pk=webhook_id, team=request.team)
    webhook_delete(webhook=hook)
    audit_record(action=AuditAction.WEBHOOK_CHANGED, request=request, target=hook.name, deleted=True)
    messages.info(request, f"Deleted {hook.name}.")
    return redirect("webhooks")
