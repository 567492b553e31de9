"""The team's audit log page (admins): filters and a CSV export. The log itself is the audit app's."""
import csv
from datetime import datetime, time

from django.db.models import Q
from django.http import HttpResponse
from django.shortcuts import render
from django.utils import timezone

from panel.accounts.decorators import team_view
from panel.accounts.models import Role
from panel.audit.models import AuditAction, AuditEvent

PAGE = 200


def _filtered(request):
    # The team's own events, and the sign-ins of its members (those belong to no team).
    members = request.team.memberships.values("user_id")
    events = AuditEvent.objects.filter(Q(team=request.team) | Q(team__isnull=True, actor__in=members))
    action = request.GET.get("action", "")
    if action in AuditAction.values:
        events = events.filter(action=action)
    actor = request.GET.get("actor", "").strip()
    if actor:
        events = events.filter(actor_name__icontains=actor)
    for name, lookup, moment in (("since", "at__gte", time.min), ("until", "at__lte", time.max)):
        value = request.GET.get(name, "")
        if value:
            try:
                day = datetime.strptime(value, "%Y-%m-%d").date()
            except ValueError:
                continue
            events = events.filter(**{lookup: timezone.make_aware(datetime.combine(day, moment), timezone.utc)})
    return events


@team_view(Role.ADMIN)
def audit_list(request):
    return render(request, "audit/list.html", {"events": _filtered(request)[:PAGE], "actions": AuditAction.choices,
                                               "query": request.GET})


@team_view(Role.ADMIN)
def audit_csv(request):
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="tokenwise-audit.csv"'
    writer = csv.writer(response)
    writer.writerow(["at (UTC)", "actor", "action", "target", "address", "detail"])
    for event in _filtered(request).iterator():
        writer.writerow([event.at.isoformat(), event.actor_name, event.action, event.target, event.address or "",
                         event.detail])
    return response
